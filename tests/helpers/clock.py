"""A clock for tests that moves only when told."""

from __future__ import annotations


class FakeClock:
    """Usable as ``now``, ``clock`` (call it) and ``sleep`` (``clock.sleep``)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.t += seconds

    def sleep(self, seconds: float) -> None:
        """Record the wait and move the clock by it."""
        self.sleeps.append(seconds)
        self.t += seconds
