"""gptrmctl simulate, python -m coordinator.simulator, the progress bar and the report command."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import UsageError
from coordinator.ctl.main import main as gptrmctl
from coordinator.simulator import report
from coordinator.simulator.cli import add_simulate_parser, main, run_simulate
from coordinator.simulator.replay import REQUIRED_KEYS, ProgressBar, markdown_table
from tests.helpers.sim import synthetic_trace, write_csv


def parse(*argv: str) -> argparse.Namespace:
    """Parse ``simulate`` flags the way gptrmctl would."""
    parser = argparse.ArgumentParser(prog="gptrmctl")
    add_simulate_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["simulate", *argv])


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small synthetic trace on disk."""
    return synthetic_trace(tmp_path_factory.mktemp("trace"), n_jobs=60, n_nodes=8)


class TestSimulateCommand:
    """simulate writes results.json, results.md and plots, and reports input errors with exit code 2."""

    def test_without_matplotlib(self, trace: tuple[Path, Path], tmp_path: Path) -> None:
        """With matplotlib not importable, gptrmctl simulate writes the results, says once that plots need the
        sim extra, and exits 0."""
        jobs, nodes = trace
        out = tmp_path / "out"
        blocked = ("import sys; sys.modules['matplotlib'] = None; from coordinator.ctl.main import main; "
                   "sys.exit(main(sys.argv[1:]))")
        res = subprocess.run([sys.executable, "-c", blocked, "simulate", "--jobs", str(jobs), "--nodes", str(nodes),
                              "--policies", "max-utilization", "--out", str(out)],
                             capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[4])
        assert res.returncode == 0, res.stderr
        notices = [line for line in res.stderr.splitlines() if "matplotlib" in line]
        assert notices == ["gptrmctl simulate: plots skipped: matplotlib is not installed (pip install 'gptrm[sim]')"]
        assert json.loads((out / "results.json").read_text())["max-utilization"]
        assert (out / "results.md").exists() and not list(out.glob("*.png"))

    def test_registers_with_gptrmctl(self) -> None:
        """add_simulate_parser sets fn=run_simulate on the subcommand."""
        args = parse("--jobs", "j.csv", "--nodes", "n.csv", "--out", "o")
        assert args.fn is run_simulate and args.nodes_limit is None
        assert args.threshold == 0.9 and args.threshold_mode == "whole-gpus"   # the coordinator's defaults

    def test_writes_results(self, trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Every policy gets every required key; the markdown table and the four plots are written."""
        jobs, nodes = trace
        out = tmp_path / "out"
        run_simulate(None, parse("--jobs", str(jobs), "--nodes", str(nodes), "--nodes-limit", "6",
                                 "--power-down-after", "300", "--out", str(out)))  # fmt: skip
        data = json.loads((out / "results.json").read_text())
        assert list(data) == ["max-utilization", "load-balancing", "power-efficient", "round-robin", "random",
                              "first-fit"]  # fmt: skip
        for metrics in data.values():
            assert set(REQUIRED_KEYS) <= set(metrics)
        assert "| max-utilization |" in (out / "results.md").read_text()
        assert {p.name for p in out.glob("*.png")} == {"utilization.png", "power.png", "queue.png", "jct_cdf.png"}
        captured = capsys.readouterr()
        assert "| first-fit |" in captured.out and "100%" in captured.err

    def test_malformed_trace(self, tmp_path: Path) -> None:
        """A negative duration stops the command with exit code 2, naming file, line and column."""
        jobs = write_csv(tmp_path / "jobs.csv", "job_id,submit_s,duration_s,gpus,gpu_share,cpu_cores,mem_gib,group,"
                         "status,orig_submit", ["a,0,10,1,1,,,g,,", "b,1,-5,1,1,,,g,,"])  # fmt: skip
        nodes = write_csv(tmp_path / "nodes.csv", "node_id,gpus,gpu_model,gpu_mem_gib,cpu_cores,mem_gib", ["m0,8,,,,"])
        with pytest.raises(UsageError) as err:
            run_simulate(None, parse("--jobs", str(jobs), "--nodes", str(nodes), "--out", str(tmp_path / "o")))
        assert f"{jobs}:3: column 'duration_s': must be ≥ 0, got -5" in str(err.value)
        assert gptrmctl(["simulate", "--jobs", str(jobs), "--nodes", str(nodes), "--out", str(tmp_path / "o")]) == 2

    @pytest.mark.parametrize(("flags", "message"), [
        (["--policies", "max-utilization,best-fit"], "unknown best-fit"),
        (["--threshold", "1.5"], "threshold"),
        (["--nodes-limit", "0"], "--nodes-limit"),
        (["--power-down-after", "60", "--spare-nodes", "-1"], "spare_nodes must be ≥ 0"),
        (["--measure-until", "soon"], "--measure-until"),
    ])  # fmt: skip
    def test_usage_errors(self, trace: tuple[Path, Path], tmp_path: Path, flags: list[str], message: str) -> None:
        """Bad flags are usage errors (exit code 2) with a message naming the flag or value."""
        jobs, nodes = trace
        args = parse("--jobs", str(jobs), "--nodes", str(nodes), "--out", str(tmp_path / "o"), "--no-plots", *flags)
        with pytest.raises(UsageError, match=message):
            run_simulate(None, args)

    def test_module_main(self, trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """python -m coordinator.simulator takes the same flags and returns 0, or 2 on a missing file."""
        jobs, nodes = trace
        out = tmp_path / "o"
        argv = ["--jobs", str(jobs), "--nodes", str(nodes), "--policies", "first-fit", "--no-plots", "--out", str(out)]
        assert main(argv) == 0 and (out / "results.json").exists()
        assert main(["--jobs", str(tmp_path / "none.csv"), "--nodes", str(nodes), "--out", str(out)]) == 2
        assert "none.csv" in capsys.readouterr().err


def _run_bar(stream: io.StringIO) -> str:
    """Drive a 10-wide bar from 0 to 100 % in 1 % steps; what it wrote."""
    bar = ProgressBar(stream, width=10)
    bar.start("run")
    for k in range(101):
        bar.update(k / 100)
    bar.finish("1.0s")
    return stream.getvalue()


class TestProgressBar:
    """ProgressBar draws a text bar on its stream."""

    def test_draws(self) -> None:
        """A non-terminal stream gets a line every 10 %, the last one with the note."""
        text = _run_bar(io.StringIO())
        lines = text.splitlines()
        assert "\r" not in text and len(lines) == 11
        assert lines[0] == "[..........]   0% run" and lines[5] == "[#####.....]  50% run"
        assert lines[-1] == "[##########] 100% run 1.0s"

    def test_terminal_redraws_one_line(self) -> None:
        """On a terminal the bar redraws in place (carriage returns) and ends with one newline."""

        class Tty(io.StringIO):
            def isatty(self) -> bool:
                return True

        text = _run_bar(Tty())
        assert text.count("\r") > 90 and text.count("\n") == 1 and text.endswith("\r[##########] 100% run 1.0s\n")


class TestMarkdownTable:
    """markdown_table: one row per run, selected columns."""

    def test_columns(self) -> None:
        """Only the asked-for columns appear, formatted."""
        table = markdown_table({"p": {"util_mean": 0.5, "energy_kwh": 1234.4}}, ["util_mean", "energy_kwh"])
        assert table.splitlines() == ["| policy | util mean (Eq. 1) | energy kWh (Eq. 3) |", "|---|---|---|",
                                      "| p | 0.500 | 1,234 |"]  # fmt: skip


class TestReport:
    """The report command runs both studies (here on small synthetic stand-ins) and writes report.md."""

    def test_writes_report(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Tables, goal checks and the reading for both studies land in one markdown file."""
        traces = tmp_path / "traces"
        traces.mkdir()
        synthetic_trace(traces, n_jobs=40, n_nodes=12, prefix="philly_")
        synthetic_trace(traces, n_jobs=40, n_nodes=12, seed=4, prefix="openb_")
        out = tmp_path / "report"
        assert report.main(["--out", str(out), "--traces", str(traces), "--no-plots"]) == 0
        text = (out / "report.md").read_text()
        for study in report.STUDIES:
            assert f"## {study.title}" in text
            assert json.loads((out / study.key / "improved" / "results.json").read_text())["round-robin"]
        assert text.count("### Goal check") == 2 and text.count("**Alg. 2 (load-balancing)") == 2

    def test_missing_trace(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A missing trace file is reported in one line with exit code 2."""
        assert report.main(["--out", str(tmp_path), "--traces", str(tmp_path), "--no-plots"]) == 2
        assert "philly_nodes.csv" in capsys.readouterr().err
