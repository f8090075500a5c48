"""Make the coordinator test helpers (one directory up) importable from the policy tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _register(name: str) -> None:
    """Make ``import <name>`` find the helper module in tests/unit/coordinator, whatever pytest's import mode."""
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent.parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_register("sched_builders")
_register("reference_algorithms")
