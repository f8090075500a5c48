"""Runs the leader's duties (scheduling cycle, power manager, QoS watch, …) and keeps them running.

Each duty is an asyncio task started by :class:`Supervisor`. A duty that raises an unexpected
exception is logged with its traceback (``leader_duty_failed``, ``duty=NAME``), counted in
``gptrm_leader_duty_failures_total{duty}`` and restarted after an exponential backoff
(``backoff_s`` doubling up to ``backoff_max_s``; back to ``backoff_s`` once a run lasted
``healthy_s`` without failing). A duty that fails ``max_failures`` times within ``window_s``
is not restarted: ``on_give_up`` is called (the coordinator then gives up its lease so that a
standby takes over). A duty that returns (``done``: a one-shot duty's work is complete), or is
cancelled because leadership ended (``stopped``), is not a failure.

Each duty calls its *beat* (see :meth:`Supervisor.beat`) at the end of every pass of its loop;
the supervisor keeps the time of the last completed pass, which ``gptrmctl status`` shows and
which gates the systemd watchdog (:meth:`Supervisor.stuck`).

Fault injection (tests only, off by default): ``GPTRM_FAULT_DUTY=NAME:once[,NAME:always…]``
makes the beat of duty NAME raise :class:`InjectedFault` on its first pass in this process
(``once``) or on every pass (``always``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client import Counter

from common.logging import get_logger

__all__ = ["FAULT_ENV", "Beat", "DutyView", "InjectedFault", "Supervisor", "no_beat", "parse_faults"]

FAULT_ENV = "GPTRM_FAULT_DUTY"

Beat = Callable[[], None]
"""Called by a duty at the end of each pass of its loop."""

RUNNING, RESTARTING, STOPPED, DONE = "running", "restarting", "stopped", "done"
"""A duty's states: ``done`` is a duty that returned, its work complete (the one-shot reconcile after the
agents' grace); ``stopped`` one cancelled because leadership ended, or given up after failing."""


def no_beat() -> None:
    """The beat of a duty run outside a supervisor."""


class InjectedFault(RuntimeError):
    """Raised by a duty's beat when ``GPTRM_FAULT_DUTY`` asks for it (fault-injection tests)."""


def parse_faults(spec: str) -> dict[str, str]:
    """``"cycle:once,qos:always"`` → ``{"cycle": "once", "qos": "always"}``.

    :raises ValueError: an entry is not ``NAME:once`` or ``NAME:always``.
    """
    faults: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, mode = item.partition(":")
        if not name or mode not in ("once", "always"):
            raise ValueError(f"{FAULT_ENV}: {item!r} is not NAME:once or NAME:always")
        faults[name] = mode
    return faults


@dataclass
class DutyView:
    """One duty as ``gptrmctl status`` shows it."""

    name: str
    state: str                       # running | restarting | done | stopped
    failures: int
    last_pass_age_s: float | None    # None: no pass completed yet
    last_error: str


@dataclass
class _Duty:
    name: str
    factory: Callable[[Beat], Awaitable[None]]
    interval_s: float
    state: str = STOPPED
    failures: int = 0
    started: float = 0.0
    last_pass: float | None = None
    last_error: str = ""
    recent: deque[float] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


class Supervisor:
    """Starts the leader's duties, restarts the ones that fail, reports their progress.

    Example::

        sup = Supervisor(failures_counter, on_give_up=lambda duty, reason: leadership.step_down(reason))
        sup.add("cycle", lambda beat: cycle.run(beat=beat), interval_s=1.0)
        sup.start()        # on winning the lease
        sup.stuck()        # "" while every running duty passed recently
        sup.stop()         # on losing it: cancels every duty (not a failure)

    :param failures: the ``gptrm_leader_duty_failures_total`` counter (label ``duty``).
    :param on_give_up: called with (duty, reason) when a duty failed ``max_failures`` times in ``window_s``.
    :param backoff_s: first restart delay; doubles per failure up to ``backoff_max_s``.
    :param healthy_s: a run that lasted this long before failing restarts after ``backoff_s`` again.
    :param max_failures: failures within ``window_s`` after which the supervisor gives up.
    :param window_s: see ``max_failures``.
    :param stuck_floor_s: least age of a running duty's last pass that counts as stuck (see :meth:`stuck`).
    :param faults: fault injection (``parse_faults``); None reads ``GPTRM_FAULT_DUTY``.
    :param now: monotonic clock.
    :param sleep: waits out a backoff.
    """

    def __init__(self, failures: Counter, on_give_up: Callable[[str, str], None], *, backoff_s: float = 0.5,
                 backoff_max_s: float = 30.0, healthy_s: float = 60.0, max_failures: int = 5,
                 window_s: float = 300.0, stuck_floor_s: float = 30.0, faults: Mapping[str, str] | None = None,
                 now: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._failures, self.on_give_up = failures, on_give_up
        self._backoff_s, self._backoff_max_s, self._healthy_s = backoff_s, backoff_max_s, healthy_s
        self._max_failures, self._window_s, self._stuck_floor_s = max_failures, window_s, stuck_floor_s
        self._faults = dict(parse_faults(os.environ.get(FAULT_ENV, "")) if faults is None else faults)
        self._now, self._sleep = now, sleep
        self._duties: dict[str, _Duty] = {}
        self._log = get_logger("coordinator")
        if self._faults:
            self._log.warning("fault_injection_enabled", faults=",".join(f"{k}:{v}" for k, v in self._faults.items()))

    def add(self, name: str, factory: Callable[[Beat], Awaitable[None]], *, interval_s: float) -> None:
        """Register a duty: ``factory(beat)`` returns its coroutine; ``interval_s`` is its pass period."""
        self._duties[name] = _Duty(name, factory, interval_s)
        self._failures.labels(name)   # the series exists (at 0) before the first failure

    @property
    def names(self) -> list[str]:
        return list(self._duties)

    def start(self) -> None:
        """Start every duty (failure history and last passes start afresh)."""
        for d in self._duties.values():
            if d.task is not None:
                d.task.cancel()   # never two copies of one duty
            d.failures, d.last_pass, d.last_error, d.recent = 0, None, "", deque()
            d.state, d.started = RUNNING, self._now()
            d.task = asyncio.create_task(self._supervise(d), name=f"duty-{d.name}")

    def stop(self) -> None:
        """Cancel every duty (leadership ended); their state becomes ``stopped`` (a ``done`` one stays done)."""
        for d in self._duties.values():
            if d.task is not None:
                d.task.cancel()
            if d.state != DONE:
                d.state = STOPPED

    async def wait_stopped(self) -> None:
        """Wait until every duty task has ended (tests)."""
        tasks = [d.task for d in self._duties.values() if d.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    def beat(self, name: str) -> Beat:
        """The hook duty ``name`` calls at the end of each pass."""
        duty = self._duties[name]

        def beat() -> None:
            mode = self._faults.get(name)
            if mode is not None:   # the pass then counts as failed, not completed
                if mode == "once":
                    del self._faults[name]
                raise InjectedFault(f"fault injected into duty {name} ({FAULT_ENV})")
            duty.last_pass = self._now()

        return beat

    async def _supervise(self, d: _Duty) -> None:
        delay = self._backoff_s
        beat = self.beat(d.name)
        while True:
            d.state, d.started = RUNNING, self._now()
            try:
                await d.factory(beat)
            except asyncio.CancelledError:
                d.state = STOPPED
                raise
            except Exception as e:
                now = self._now()
                d.failures += 1
                d.last_error = f"{type(e).__name__}: {e}"
                self._failures.labels(d.name).inc()
                d.recent.append(now)
                while d.recent and now - d.recent[0] > self._window_s:
                    d.recent.popleft()
                if now - d.started >= self._healthy_s:
                    delay = self._backoff_s
                if len(d.recent) >= self._max_failures:
                    d.state = STOPPED
                    reason = (f"leader duty {d.name} failed {len(d.recent)} times within {self._window_s:.0f}s "
                              f"(last: {d.last_error})")
                    self._log.error("leader_duty_failed", duty=d.name, failures=d.failures, restart_in_s=None,
                                    exc_info=True)
                    self._log.error("leader_duty_gave_up", duty=d.name, failures=len(d.recent),
                                    window_s=self._window_s, reason=d.last_error)
                    self.on_give_up(d.name, reason)
                    return
                d.state = RESTARTING
                self._log.error("leader_duty_failed", duty=d.name, failures=d.failures, restart_in_s=delay,
                                exc_info=True)
                await self._sleep(delay)
                delay = min(delay * 2, self._backoff_max_s)
            else:
                d.state = DONE
                self._log.info("leader_duty_done", duty=d.name)
                return

    def views(self) -> list[DutyView]:
        """Every duty's state, failures and age of its last pass, in registration order."""
        now = self._now()
        return [DutyView(d.name, d.state, d.failures, None if d.last_pass is None else max(0.0, now - d.last_pass),
                         d.last_error) for d in self._duties.values()]

    def stuck(self) -> str:
        """"" while every running duty completed a pass recently; else which ones did not.

        A running duty is stuck when its last pass (or its start, before the first) is older than
        ``max(3 × interval_s, stuck_floor_s)``. A duty waiting out its backoff or stopped is not.
        """
        now = self._now()
        out = []
        for d in self._duties.values():
            if d.state != RUNNING or d.task is None:
                continue
            since = d.last_pass if d.last_pass is not None else d.started
            bound = max(3 * d.interval_s, self._stuck_floor_s)
            if now - since > bound:
                out.append(f"{d.name} (no pass for {now - since:.0f}s)")
        return ", ".join(out)
