"""gptrmctl argument checks that refuse bad input before any request is sent."""

from __future__ import annotations

import pytest

from coordinator.ctl.main import main
from coordinator.ctl.transport import EXIT_USAGE


class TestPolicyThreshold:
    @pytest.mark.parametrize("value", ["0", "-0.5", "nan", "inf"])
    def test_bad_threshold_refused(self, value: str, capsys: pytest.CaptureFixture[str]) -> None:
        """A threshold of 0 (which the wire would read as "keep"), negative, NaN or infinite exits with the usage
        code naming --threshold; the coordinator refuses other out-of-range values."""
        rc = main(["--coordinator", "127.0.0.1:1", "policy", "set", "load-balancing", "--threshold", value])
        assert rc == EXIT_USAGE
        assert "--threshold" in capsys.readouterr().err


class TestNodesRm:
    def test_rm_without_node_refused(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`nodes rm` without a node exits with the usage code before any request is sent."""
        rc = main(["--coordinator", "127.0.0.1:1", "nodes", "rm"])
        assert rc == EXIT_USAGE
        assert "nodes rm" in capsys.readouterr().err
