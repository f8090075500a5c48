"""``python -m coordinator.simulator``: the same flags as ``gptrmctl simulate``."""

from __future__ import annotations

import sys

from coordinator.simulator.cli import main

if __name__ == "__main__":
    sys.exit(main())
