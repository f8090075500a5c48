"""gptrmctl argument checks that refuse bad input before any request is sent."""

from __future__ import annotations

import pytest

from coordinator.ctl.main import main
from coordinator.ctl.transport import EXIT_USAGE


class TestPolicyThreshold:
    @pytest.mark.parametrize("value", ["0", "1e-300", "-0.5", "1.5", "nan"])
    def test_bad_threshold_refused(self, value: str, capsys: pytest.CaptureFixture[str]) -> None:
        """A threshold of 0, absurdly small, negative, above 1 or NaN exits with the usage code naming --threshold."""
        rc = main(["--coordinator", "127.0.0.1:1", "policy", "set", "load-balancing", "--threshold", value])
        assert rc == EXIT_USAGE
        assert "--threshold" in capsys.readouterr().err
