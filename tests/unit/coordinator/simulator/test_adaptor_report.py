"""The Resource Adaptor report runs end to end on a tiny synthetic trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.domain import ClusterSnapshot, NodeSnapshot, PowerCurve, Resources
from coordinator.simulator.adaptor_report import RUNS, floors, main
from coordinator.simulator.engine import SimConfig
from coordinator.simulator.metrics import JobRecord
from coordinator.simulator.replay import ReplaySetup, load, run_policies
from tests.helpers.sim import synthetic_trace


class TestAdaptorReport:
    """One command: every run in the table, and a held/not held line per goal."""

    def test_runs_on_synthetic_trace(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The report prints a row per run and a verdict per goal, and writes report.md."""
        synthetic_trace(tmp_path, n_jobs=40, n_nodes=6, prefix="tiny_")
        code = main(["--traces", str(tmp_path), "--prefix", "tiny_", "--nodes-limit", "6", "--power-down-after",
                     "300", "--wake-delay", "60", "--out", str(tmp_path / "out")])
        assert code == 0
        out = capsys.readouterr().out
        for name, *_ in RUNS:
            assert f"| {name} |" in out
        verdicts = [line for line in out.splitlines() if line.startswith("- ")]
        context = [v for v in verdicts if v.startswith("- context: ")]
        assert len(context) == 1 and "utilization std-dev" in context[0]
        goals = [v for v in verdicts if v not in context]
        assert len(goals) == 10 and all(("not held" in v) or ("held" in v) for v in goals)
        assert (tmp_path / "out" / "report.md").read_text(encoding="utf-8") == out

    def test_missing_trace_is_a_clear_error(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A missing trace file exits 2 naming the problem."""
        assert main(["--traces", str(tmp_path), "--prefix", "none_"]) == 2
        assert "none_" in capsys.readouterr().err


def _node(node_id: str, gpus: int, idle_w: float, max_w: float) -> NodeSnapshot:
    return NodeSnapshot(node_id=node_id, capacity=Resources(gpus=float(gpus)), power=PowerCurve(idle_w, max_w))


class TestFloors:
    """The floor under every placement: the work's GPU-hours on the best node, fully carried."""

    def test_floor_by_hand(self) -> None:
        """2 GPUs × 1 h of work, threshold 0.5 in paper mode: an 8-GPU node carries 4, so 0.5 node-h; the 4-GPU node's
        30 W/GPU idle over 2 carried GPUs plus 200 W/GPU dynamic beats the 8-GPU node's."""
        cluster = ClusterSnapshot(nodes=(_node("a", 8, 400.0, 2000.0), _node("b", 4, 120.0, 920.0)))
        jobs = [JobRecord("j1", 0.0, 0.0, 3600.0, gpus=2.0)]
        f = floors(cluster, jobs, 0.5, "paper")
        assert f["gpu_hours"] == pytest.approx(2.0)
        assert f["active_node_hours"] == pytest.approx(0.5)
        # b: 120 / (0.5 × 4) + 800 / 4 = 260 W per GPU; a: 400 / 4 + 1600 / 8 = 300 W per GPU.
        assert f["energy_kwh"] == pytest.approx(2.0 * 260.0 / 1000.0)

    def test_no_run_goes_under_the_floor(self, tmp_path: Path) -> None:
        """Every policy's replay, with or without power-down, uses at least the floor's node-hours and energy."""
        synthetic_trace(tmp_path, n_jobs=60, n_nodes=6, prefix="tiny_")
        cluster, jobs = load(ReplaySetup(jobs=tmp_path / "tiny_jobs.csv", nodes=tmp_path / "tiny_nodes.csv",
                                         nodes_limit=6))
        configs = [SimConfig(policy, power_down_after_s=300.0 if adaptor else None, wake_delay_s=60.0,
                             keep_order=fifo, keep_series=False) for _, policy, adaptor, fifo in RUNS]
        runs = run_policies(cluster, jobs, configs, names=[name for name, *_ in RUNS])
        for name, run in runs.items():
            assert run.metrics["unplaced_jobs"] == 0, name
            f = floors(cluster, run.jobs, configs[0].threshold)
            assert f["gpu_hours"] > 0
            assert run.metrics["active_node_hours"] >= f["active_node_hours"] - 1e-9, name
            assert run.metrics["energy_kwh"] >= f["energy_kwh"] - 1e-9, name
