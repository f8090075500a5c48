"""Fixtures for the agent's unit tests: a fake clock, a logger, the fake pynvml module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import structlog


def _register(name: str) -> None:
    """Make ``import <name>`` find the helper module beside this file, whatever pytest's import mode."""
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_register("fake_pynvml")
_register("fake_clock")

from fake_clock import FakeClock  # noqa: E402 - importable only once registered above


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock starting at 1000 s."""
    return FakeClock()


@pytest.fixture
def log() -> structlog.typing.FilteringBoundLogger:
    """The agent's logger; wrap a test in ``structlog.testing.capture_logs()`` to see its events."""
    return structlog.get_logger().bind(component="agent")
