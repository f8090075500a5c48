"""Make the simulator test helpers (this directory) importable whatever pytest's import mode."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _register(name: str) -> None:
    """Make ``import <name>`` find the helper module next to this file."""
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_register("sim_builders")
