"""Deadlines and inference SLOs: the QoS Manager's monitoring and feedback.

Once a second on the leader, :class:`QosWatch` looks at every unfinished task with a target:

- **deadline** (``qos.deadline_unix_s``): a task that will miss it — ``now`` plus what it still
  needs to run (the profiler's expected run time, less what it already ran; 0 when the profiler
  has no estimate) is past the deadline — raises one ``qos_violation`` event and one
  ``gptrm_qos_violations_total{kind="deadline"}``; when the deadline passes with the task still
  unfinished, a second event says it missed it (``gptrmctl tasks`` marks such tasks itself);
- **latency** (``qos.max_latency_ms``) and **throughput** (``qos.min_tokens_per_s``): the task's
  latest reading from its own metrics (``ResourceMonitor.task_qos``), only when it is fresh and
  available — an unreadable endpoint or an old reading is never a violation and clears nothing.
  p95 latency above the target, or tokens/s below it while requests are running or waiting
  (an idle server generates nothing and misses no target), raises a violation; back within the
  target, it is cleared. Each raise is an event and counts in the metric (``kind="latency"`` or
  ``"throughput"``); each clear is an event.

:meth:`QosWatch.pressure` is the per-task signal the Resource Adaptor reads: ``MORE`` while an
SLO is violated, ``LESS`` when the task is comfortably within every target it has (latency below
half its bound, tokens/s above twice its floor, nothing queued), else ``STEADY``; None when there
is nothing to judge (no SLO target, or no fresh, available reading).
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from collections.abc import Callable, Mapping
from typing import Literal

from prometheus_client import Counter

from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, TaskState
from coordinator.events import EventBus
from coordinator.monitor.resources import ResourceMonitor
from coordinator.monitor.task_qos import TaskQos
from coordinator.profiler import Profiler
from coordinator.qos.preemption import started_s
from coordinator.supervisor import Beat, no_beat

__all__ = ["Pressure", "QosWatch", "deadline_missed", "remaining_run_s"]

_PERIOD_S = 1.0
_MIN_FRESH_S = 5.0
_COMFORT = 0.5        # LESS: latency under half its bound, throughput over twice its floor


class Pressure(enum.Enum):
    """What a task's SLOs say about its resources."""

    MORE = "more"       # an SLO is violated: it needs more (a replica, a GPU, a higher power limit)
    STEADY = "steady"   # within its targets
    LESS = "less"       # comfortably within every target: it could do with less


def remaining_run_s(task: types_pb2.Task, expected_run_s: float | None, now: float) -> float:
    """What the task still needs to run: the expected run time (0 when unknown), less what it already
    ran when it runs now."""
    expected = expected_run_s or 0.0
    if task.state in (TaskState.RUNNING, TaskState.PAUSED):
        return max(0.0, expected - (now - started_s(task)))
    return expected


def deadline_missed(task: types_pb2.Task, now: float) -> bool:
    """Whether a task with a deadline ended after it, or is unfinished and past it."""
    deadline = task.spec.qos.deadline_unix_s
    if not deadline:
        return False
    if task.state in TERMINAL_STATES:
        return bool(task.history) and task.history[-1].time_unix_s > deadline
    return now > deadline


class QosWatch:
    """Raises and clears QoS violations, and tells the Resource Adaptor each task's pressure.

    Example::

        watch.check()                     # one pass over the unfinished tasks
        watch.pressure("t-1")             # Pressure.MORE while its p95 latency is over its bound

    :param tasks: task id → unfinished task (the task table's ``live_view``; a finished one is skipped), read only.
    :param monitor: the Resource Monitor (each task's latest QoS reading).
    :param profiler: expected run times.
    :param events: ``qos_violation`` events.
    :param violations: ``gptrm_qos_violations_total`` (label ``kind``).
    :param sampling_interval_s: agents' sampling interval; a reading older than three of them (at
        least 5 s) is stale.
    :param now: the clock (unix seconds).
    """

    def __init__(self, tasks: Callable[[], Mapping[str, types_pb2.Task]], monitor: ResourceMonitor, profiler: Profiler,
                 events: EventBus, violations: Counter, sampling_interval_s: float = 1.0,
                 now: Callable[[], float] = time.time) -> None:
        self._tasks, self._monitor, self._profiler = tasks, monitor, profiler
        self._events, self._violations, self._now = events, violations, now
        self._fresh_s = max(_MIN_FRESH_S, 3 * sampling_interval_s)
        self._sampling_interval_s = sampling_interval_s
        self._active: dict[tuple[str, str], str] = {}   # (task id, kind) → what is violated, while it is
        self._deadline: dict[str, str] = {}             # task id → "at-risk" or "missed"
        self._log = get_logger("qos")

    def set_report_interval(self, interval_s: float) -> None:
        """Telemetry (and the QoS readings in it) now arrives once per ``interval_s``: a reading is stale after
        three of those."""
        self._fresh_s = max(_MIN_FRESH_S, 3 * max(self._sampling_interval_s, interval_s))

    async def run(self, leading: Callable[[], bool], beat: Beat = no_beat) -> None:
        """A pass a second while this replica leads."""
        while True:
            await asyncio.sleep(_PERIOD_S)
            if leading():
                self.check()
            beat()

    def check(self) -> None:
        """One pass: deadlines and SLOs of every unfinished task; forgets tasks that ended."""
        now = self._now()
        live = {tid: t for tid, t in self._tasks().items() if t.state not in TERMINAL_STATES}
        for task in live.values():
            if task.spec.qos.deadline_unix_s:
                self._check_deadline(task, now)
            if task.spec.qos.max_latency_ms or task.spec.qos.min_tokens_per_s:
                self._check_slo(task, now)
        for key in [k for k in self._active if k[0] not in live]:
            del self._active[key]
        for tid in [t for t in self._deadline if t not in live]:
            del self._deadline[tid]

    def violations(self, task_id: str) -> dict[str, str]:
        """The task's active violations: kind → what is violated."""
        out = {kind: what for (tid, kind), what in self._active.items() if tid == task_id}
        if task_id in self._deadline:
            out["deadline"] = self._deadline[task_id]
        return out

    # ---- deadlines ------------------------------------------------------------------------------

    def _check_deadline(self, task: types_pb2.Task, now: float) -> None:
        deadline = task.spec.qos.deadline_unix_s
        state = self._deadline.get(task.id)
        if now > deadline:
            if state != "missed":
                self._deadline[task.id] = "missed"
                if state is None:
                    self._violations.labels(kind="deadline").inc()
                self._raise(task, "deadline", f"task {task.id} missed its deadline "
                            f"({now - deadline:.0f}s ago) while {TaskState(task.state).label}")
            return
        need = remaining_run_s(task, self._profiler.expected_run_s(task.spec), now)
        if state is None and now + need > deadline:
            self._deadline[task.id] = "at-risk"
            self._violations.labels(kind="deadline").inc()
            self._raise(task, "deadline", f"task {task.id} will miss its deadline: {need:.0f}s of run time "
                        f"expected, {deadline - now:.0f}s left")

    # ---- SLOs -----------------------------------------------------------------------------------

    def _reading(self, task_id: str, now: float) -> TaskQos | None:
        reading = self._monitor.task_qos(task_id)
        if reading is None or not reading.available or now - reading.received_unix_s > self._fresh_s:
            return None
        return reading

    def _check_slo(self, task: types_pb2.Task, now: float) -> None:
        reading = self._reading(task.id, now)
        if reading is None:
            return   # unknown is never a violation, and clears nothing
        for kind, problem in (("latency", _latency_problem(task, reading)),
                              ("throughput", _throughput_problem(task, reading))):
            if problem is False:
                continue   # no target, or no value to compare
            key = (task.id, kind)
            if problem and key not in self._active:
                self._active[key] = problem
                self._violations.labels(kind=kind).inc()
                self._raise(task, kind, f"task {task.id}: {problem}")
            elif not problem and key in self._active:
                del self._active[key]
                self._events.publish("qos_violation", f"task {task.id}: {kind} within its target again",
                                     task_id=task.id, violation=kind, cleared="true")
                self._log.info("qos_violation_cleared", task_id=task.id, kind=kind)

    def _raise(self, task: types_pb2.Task, kind: str, message: str) -> None:
        self._log.warning("qos_violation_raised", task_id=task.id, kind=kind, reason=message)
        self._events.publish("qos_violation", message, task_id=task.id, violation=kind, cleared="false")

    def pressure(self, task_id: str) -> Pressure | None:
        """The task's pressure signal for the Resource Adaptor (see the module docstring)."""
        task = self._tasks().get(task_id)
        if task is None or not (task.spec.qos.max_latency_ms or task.spec.qos.min_tokens_per_s):
            return None
        reading = self._reading(task_id, self._now())
        if reading is None:
            return None
        if any(tid == task_id for tid, _k in self._active) or _latency_problem(task, reading) \
                or _throughput_problem(task, reading):
            return Pressure.MORE
        q = task.spec.qos
        lat_ok = not q.max_latency_ms or (reading.latency_p95_s is not None
                                         and reading.latency_p95_s * 1000 < _COMFORT * q.max_latency_ms)
        tps_ok = not q.min_tokens_per_s or (reading.tokens_per_s is not None
                                           and reading.tokens_per_s > q.min_tokens_per_s / _COMFORT)
        idle_queue = not reading.requests_waiting
        return Pressure.LESS if lat_ok and tps_ok and idle_queue else Pressure.STEADY


def _latency_problem(task: types_pb2.Task, reading: TaskQos) -> str | Literal[False]:
    """What is wrong with the latency ("" when fine), or False when there is nothing to compare."""
    bound = task.spec.qos.max_latency_ms
    if not bound or reading.latency_p95_s is None or not math.isfinite(reading.latency_p95_s):
        return False
    p95_ms = reading.latency_p95_s * 1000
    return f"p95 latency {p95_ms:.0f} ms over its {bound:g} ms bound" if p95_ms > bound else ""


def _throughput_problem(task: types_pb2.Task, reading: TaskQos) -> str | Literal[False]:
    """What is wrong with the throughput ("" when fine), or False when there is nothing to compare."""
    floor = task.spec.qos.min_tokens_per_s
    if not floor or reading.tokens_per_s is None:
        return False
    busy = (reading.requests_running or 0) + (reading.requests_waiting or 0) > 0 or (
        reading.requests_running is None and reading.requests_waiting is None)
    if not busy:
        return ""   # an idle server generates nothing and misses no target
    return f"{reading.tokens_per_s:.1f} tokens/s under its {floor:g} floor" if reading.tokens_per_s < floor else ""
