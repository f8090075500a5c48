"""Fixtures for the agent's unit tests: a fake clock and a logger."""

from __future__ import annotations

import pytest
import structlog

from tests.helpers.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock starting at 1000 s."""
    return FakeClock()


@pytest.fixture
def log() -> structlog.typing.FilteringBoundLogger:
    """The agent's logger; wrap a test in ``structlog.testing.capture_logs()`` to see its events."""
    return structlog.get_logger().bind(component="agent")
