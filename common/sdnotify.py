"""systemd notification protocol (sd_notify) over ``$NOTIFY_SOCKET``: READY and WATCHDOG."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable

__all__ = ["SystemdNotifier", "watchdog_loop"]


class SystemdNotifier:
    """Sends sd_notify datagrams when run under systemd; does nothing otherwise.

    Example::

        notifier = SystemdNotifier()
        notifier.notify("READY=1")
        interval = notifier.watchdog_interval_s()   # None without WatchdogSec=
    """

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address = env.get("NOTIFY_SOCKET", "")
        self._watchdog_usec = env.get("WATCHDOG_USEC", "")
        if self._address.startswith("@"):
            self._address = "\0" + self._address[1:]  # abstract namespace socket

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def notify(self, state: str) -> bool:
        """Send one state line (``READY=1``, ``WATCHDOG=1``, ``STOPPING=1``, ``STATUS=...``)."""
        if not self._address:
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            try:
                s.connect(self._address)
                s.sendall(state.encode())
            except OSError:
                return False
        return True

    def watchdog_interval_s(self) -> float | None:
        """Half of systemd's watchdog timeout, or None when the watchdog is off."""
        if not self._address or not self._watchdog_usec.isdigit():
            return None
        return int(self._watchdog_usec) / 1e6 / 2


async def watchdog_loop(notifier: SystemdNotifier, status: Callable[[], str] | None = None,
                        stuck: Callable[[], str] | None = None) -> None:
    """Send ``WATCHDOG=1`` every half watchdog period while the event loop runs and nothing is stuck.

    It runs *on* the daemon's asyncio loop on purpose: a loop that is stuck (a blocking call,
    a deadlock) stops the pings, and systemd restarts the service after ``WatchdogSec=``.
    ``stuck`` (optional) names work that stopped making progress ("" when none): while it does,
    no ``WATCHDOG=1`` is sent and ``STATUS=`` says what is stuck.
    """
    interval = notifier.watchdog_interval_s()
    if interval is None:
        return
    while True:
        problem = stuck() if stuck is not None else ""
        if not problem:
            notifier.notify("WATCHDOG=1")
        text = status() if status is not None else ""
        if problem:
            text = f"{text + ': ' if text else ''}stuck: {problem}"
        if text:
            notifier.notify(f"STATUS={text}")
        await asyncio.sleep(interval)
