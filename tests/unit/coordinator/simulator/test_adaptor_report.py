"""The Resource Adaptor report runs end to end on a tiny synthetic trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.simulator.adaptor_report import RUNS, main
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
        for name, _, _ in RUNS:
            assert f"| {name} |" in out
        verdicts = [line for line in out.splitlines() if line.startswith("- ")]
        assert len(verdicts) == 7 and all(("not held" in v) or ("held" in v) for v in verdicts)
        assert (tmp_path / "out" / "report.md").read_text(encoding="utf-8") == out

    def test_missing_trace_is_a_clear_error(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A missing trace file exits 2 naming the problem."""
        assert main(["--traces", str(tmp_path), "--prefix", "none_"]) == 2
        assert "none_" in capsys.readouterr().err
