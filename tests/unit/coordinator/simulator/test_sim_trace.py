"""Trace CSV parsing and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.simulator.trace import (
    TraceError,
    TraceJob,
    TraceNode,
    read_jobs,
    read_nodes,
    select_nodes,
    write_jobs,
    write_nodes,
)
from tests.helpers.sim import write_csv

JOBS_HEADER = "job_id,submit_s,duration_s,gpus,gpu_share,cpu_cores,mem_gib,group,status,orig_submit"
NODES_HEADER = "node_id,gpus,gpu_model,gpu_mem_gib,cpu_cores,mem_gib"


class TestReadJobs:
    """read_jobs: typed rows, sorted by submission, and errors that name file, line and column."""

    def test_parses_rows(self, tmp_path: Path) -> None:
        """Rows become TraceJobs with empty cells as None and the share defaulting to 1 for GPU jobs."""
        path = write_csv(tmp_path / "j.csv", JOBS_HEADER, ["a,10,100,8,,,,vc1,,x", "b,5,60,1,0.5,2,4.5,BE,Running,y"])
        jobs = read_jobs(path)
        assert [j.job_id for j in jobs] == ["b", "a"]  # sorted by submit_s
        assert jobs[1] == TraceJob("a", 10.0, 100.0, 8, 1.0, None, None, "vc1", "")
        assert (jobs[0].gpu_share, jobs[0].cpu_cores, jobs[0].mem_gib) == (0.5, 2.0, 4.5)

    def test_cpu_only_job_has_zero_share(self, tmp_path: Path) -> None:
        """A job with 0 GPUs gets share 0 whatever the cell says."""
        path = write_csv(tmp_path / "j.csv", JOBS_HEADER, ["a,0,10,0,0,4,8,LS,Running,"])
        assert read_jobs(path)[0].gpu_share == 0.0

    def test_missing_column_names_file_line_and_column(self, tmp_path: Path) -> None:
        """A header without duration_s is refused at line 1, naming the column."""
        path = write_csv(tmp_path / "j.csv", JOBS_HEADER.replace(",duration_s", ""), ["a,1,1,1,,,g,,x"])
        with pytest.raises(TraceError) as err:
            read_jobs(path)
        assert (err.value.path, err.value.line, err.value.column) == (path, 1, "duration_s")
        assert str(err.value).startswith(f"{path}:1: column 'duration_s': missing column")

    @pytest.mark.parametrize(
        ("row", "column", "problem"),
        [
            ("b,5,abc,1,1,,,g,,x", "duration_s", "not a number: 'abc'"),
            ("b,5,-3,1,1,,,g,,x", "duration_s", "must be ≥ 0, got -3"),
            ("b,-1,3,1,1,,,g,,x", "submit_s", "must be ≥ 0, got -1"),
            ("b,5,3,1.5,1,,,g,,x", "gpus", "not a whole number: '1.5'"),
            ("b,5,3,1,1.5,,,g,,x", "gpu_share", "must be in (0, 1]"),
            ("b,5,3,2,0.5,,,g,,x", "gpu_share", "a share below 1 needs gpus = 1"),
            ("b,5,inf,1,1,,,g,,x", "duration_s", "not a finite number"),
            ("b,5,,1,1,,,g,,x", "duration_s", "empty value"),
            (",5,3,1,1,,,g,,x", "job_id", "empty value"),
        ],
    )
    def test_bad_cell_names_line_and_column(self, tmp_path: Path, row: str, column: str, problem: str) -> None:
        """A bad value on the third line is reported as file:3 with its column and the offending value."""
        path = write_csv(tmp_path / "jobs.csv", JOBS_HEADER, ["a,1,1,1,1,,,g,,x", row])
        with pytest.raises(TraceError) as err:
            read_jobs(path)
        assert (err.value.line, err.value.column) == (3, column)
        assert problem in str(err.value)
        assert str(err.value).startswith(f"{path}:3: column '{column}'")

    def test_wrong_field_count(self, tmp_path: Path) -> None:
        """A row with too few fields is refused with its line number."""
        path = write_csv(tmp_path / "j.csv", JOBS_HEADER, ["a,1,1,1"])
        with pytest.raises(TraceError, match=r"j\.csv:2: 4 fields, the header has 10"):
            read_jobs(path)

    def test_duplicate_id(self, tmp_path: Path) -> None:
        """A repeated job id is refused, pointing at the first occurrence."""
        path = write_csv(tmp_path / "j.csv", JOBS_HEADER, ["a,1,1,1,1,,,g,,x", "a,2,1,1,1,,,g,,x"])
        with pytest.raises(TraceError, match=r":3: column 'job_id': duplicate id 'a' \(first on line 2\)"):
            read_jobs(path)

    def test_missing_file(self, tmp_path: Path) -> None:
        """A file that does not exist is a TraceError naming it, not an OSError."""
        with pytest.raises(TraceError, match="cannot open"):
            read_jobs(tmp_path / "nope.csv")

    def test_never_ran_pods_are_filtered(self, tmp_path: Path) -> None:
        """openb pods with status Pending are dropped unless asked for."""
        path = write_csv(tmp_path / "j.csv", JOBS_HEADER, ["a,1,1,1,1,,,g,Pending,x", "b,1,1,1,1,,,g,Failed,x"])
        assert [j.job_id for j in read_jobs(path)] == ["b"]
        assert [j.job_id for j in read_jobs(path, include_never_ran=True)] == ["a", "b"]

    def test_unknown_llm_kind(self, tmp_path: Path) -> None:
        """The optional kind column accepts only the three task kinds."""
        path = write_csv(tmp_path / "j.csv", JOBS_HEADER + ",kind,params_b", ["a,1,1,1,1,,,g,,x,pretraining,7"])
        with pytest.raises(TraceError, match="column 'kind'"):
            read_jobs(path)

    def test_round_trip(self, tmp_path: Path) -> None:
        """write_jobs then read_jobs gives the same jobs back."""
        jobs = [TraceJob("a", 0.5, 10.0, 16, 1.0, 8.0, 64.0, "g", "Running"),
                TraceJob("b", 2.0, 3.0, 1, 0.25, None, None, "", "", "inference", 7.0)]  # fmt: skip
        write_jobs(tmp_path / "j.csv", jobs)
        assert read_jobs(tmp_path / "j.csv") == jobs


class TestReadNodes:
    """read_nodes: typed rows in file order, with located errors."""

    def test_parses_rows(self, tmp_path: Path) -> None:
        """Empty cells become None; the GPU model may be empty."""
        path = write_csv(tmp_path / "n.csv", NODES_HEADER, ["m0,8,,,,", "x1,2,T4,16,104,256"])
        assert read_nodes(path) == [TraceNode("m0", 8), TraceNode("x1", 2, "T4", 16.0, 104.0, 256.0)]

    def test_bad_gpu_count(self, tmp_path: Path) -> None:
        """A non-numeric GPU count is refused with file, line and column."""
        path = write_csv(tmp_path / "nodes.csv", NODES_HEADER, ["m0,8,,,,", "m1,eight,,,,"])
        with pytest.raises(TraceError, match=r"nodes\.csv:3: column 'gpus': not a number: 'eight'"):
            read_nodes(path)

    def test_round_trip(self, tmp_path: Path) -> None:
        """write_nodes then read_nodes gives the same nodes back."""
        nodes = [TraceNode("a", 8, "A100", 80.0, 128.0, 1024.0), TraceNode("b", 0, "", None, 32.0, 256.0)]
        write_nodes(tmp_path / "n.csv", nodes)
        assert read_nodes(tmp_path / "n.csv") == nodes


class TestSelectNodes:
    """select_nodes: a deterministic, evenly spaced subset."""

    def test_evenly_spaced(self) -> None:
        """10 nodes limited to 3 keep indices 0, 3, 6 (k·10 // 3)."""
        nodes = [TraceNode(f"n{k}", 8) for k in range(10)]
        assert [n.node_id for n in select_nodes(nodes, 3)] == ["n0", "n3", "n6"]

    def test_no_limit_keeps_all(self) -> None:
        """None or a limit above the count keeps every node."""
        nodes = [TraceNode(f"n{k}", 8) for k in range(4)]
        assert select_nodes(nodes, None) == nodes
        assert select_nodes(nodes, 9) == nodes

    def test_bad_limit(self) -> None:
        """A limit below 1 is refused."""
        with pytest.raises(ValueError, match="≥ 1"):
            select_nodes([TraceNode("a", 1), TraceNode("b", 1)], 0)
