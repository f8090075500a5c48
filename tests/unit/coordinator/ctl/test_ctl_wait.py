"""The exit status of ``gptrmctl submit --wait``."""

from __future__ import annotations

import pytest

from coordinator.ctl.wait import exit_code_of


class TestExitCodeOf:
    @pytest.mark.parametrize(("state", "code", "expected"), [
        ("succeeded", 0, 0),
        ("failed", 3, 3),
        ("failed", -9, 137),     # killed by SIGKILL: 128 + 9, as a shell reports it
        ("cancelled", -15, 143),
        ("cancelled", None, 1),  # cancelled before it started: no exit code of its own
        ("failed", 300, 300 & 0xFF),
    ])
    def test_mapping(self, state: str, code: int | None, expected: int) -> None:
        """The task's own code, 128 + N for signal N, 1 without one."""
        assert exit_code_of({"state": state, "exit_code": code}) == expected
