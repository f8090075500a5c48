"""The scheduler's wake-up signal, shared by everything that changes what a cycle would decide."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["Wakeup"]


class Wakeup:
    """Set by submits, finished tasks, policy and node changes; the cycle waits on it.

    Example::

        wakeup = Wakeup()
        wakeup.set()                      # a task was submitted
        await wakeup.wait(timeout_s=1.0)  # returns at once, and clears the signal
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        """Ask for a cycle as soon as possible."""
        self._event.set()

    async def wait(self, timeout_s: float) -> None:
        """Wait until :meth:`set` or ``timeout_s``, whichever comes first, then clear the signal."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout=timeout_s)
        self._event.clear()
