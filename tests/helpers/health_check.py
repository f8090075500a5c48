"""A site health-check program for tests: NHC's failure line while a ``broken`` file exists, a pass once it is
gone; no verdict at all until a ``go`` file exists (so the agent's check stays PENDING until the test says)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

NHC_FAILURE = "ERROR:  nhc:  Health check failed:  check_hw_ib:  Device ib0 not found"
"""The last line LBNL NHC prints when a check fails: what the agent reports, and the node's drain reason."""


@dataclass(frozen=True)
class GatedCheck:
    """The program, and the files that steer it: create ``go`` to let it answer, remove ``broken`` to pass."""

    program: Path
    go: Path
    broken: Path


def gated_check(tmp: Path) -> GatedCheck:
    """Write the program into ``tmp``, broken (it fails once let go); returns it with its steering files."""
    go, broken, program = tmp / "go", tmp / "broken", tmp / "nhc"
    broken.touch()
    program.write_text(
        "#!/bin/sh\n"
        f"while [ ! -e {go} ]; do sleep 0.1; done\n"
        f'if [ -e {broken} ]; then echo "Running checks"; echo "{NHC_FAILURE}"; exit 1; fi\n'
        "echo all checks passed\n")
    program.chmod(0o755)
    return GatedCheck(program, go, broken)
