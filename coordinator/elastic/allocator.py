"""The leader's elastic allocator: learns each elastic task's speed-up and carries out resizes.

The rules are :mod:`coordinator.elastic.rules`'s (shared with the simulator); this module feeds
them the leader's tasks and carries out what they decide:

- **learning** (:meth:`ElasticAllocator.observe`, once per scheduling cycle): each running elastic
  task's throughput at its current size — the rate of its own counter (``elastic.throughput_counter``,
  scraped by its agent with its metrics), else its GPUs' utilization × GPUs — folded into its
  :class:`~coordinator.elastic.rules.SpeedupCurve`. The first :data:`WARMUP_S` after a start are
  skipped (a restart's warm-up is not its speed). The curve is stored with the task at each resize, so
  a new leader continues from it.
- **a resize** (:meth:`ElasticAllocator.resize`) is a checkpoint-restart: ``RUNNING → PREEMPTED``
  (fenced, keeping its allocation, with the new target size, the reason and the curve in
  ``Task.elastic``), a StopTask with its checkpoint signal and stop grace, then, when its agents
  report it ended, back to ``PENDING`` with its reservations released (the preemption path of
  :mod:`coordinator.qos.preemption`), and placed again at the target by the next cycle. Resizes count
  in ``elastic.resizes``, never in ``restarts`` (so never against ``max_restarts``) nor in
  ``preemptions``.
- **restart cost**, measured: from a resize's stop until the task ran again, folded into a moving
  average and stored with the task at its next resize.

A leader killed during a resize leaves a PREEMPTED task holding its allocation in etcd: the new
leader re-sends its stop when its agents re-register and requeues it when they report it ended (or,
after the grace, when none does), so it runs exactly once and no GPU is held twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from common.errors import GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, TaskState
from coordinator.dispatch.dispatcher import Dispatcher
from coordinator.elastic.rules import ElasticJob, ElasticRange, ElasticSettings, Resize, SpeedupCurve
from coordinator.elastic.spec import curve_of, elastic_gpus, elastic_range
from coordinator.events import EventBus
from coordinator.monitor.metrics import Metrics
from coordinator.monitor.resources import ResourceMonitor
from coordinator.profiler import Profiler
from coordinator.profiler.qos_spec import DEFAULT_CHECKPOINT_SIGNAL
from coordinator.qos.preemption import started_s
from coordinator.run_limits import protected_until_s
from coordinator.tasks import TaskTable

__all__ = ["HISTORY", "WARMUP_S", "ElasticAllocator", "learned_restart_cost_s", "remaining_estimate_s"]

WARMUP_S = 20.0
"""Throughput readings in the first seconds after a start are not its speed."""
HISTORY = 20
"""Resize records kept per task."""
_FRESH_S = 10.0
_COST_EWMA = 0.5
_PLACED = (TaskState.SCHEDULED, TaskState.STARTING, TaskState.RUNNING, TaskState.PAUSED)


def learned_restart_cost_s(stored_s: float, stop_s: float, running_since_s: float | None, default_s: float) -> float:
    """A job's restart cost as the allocator knows it: the moving average of its measured restarts, each from a
    resize's stop until it ran again, with the restart just finished folded in (the leader's and the simulator's
    one rule).

    :param stored_s: the average stored at its last resize (0: none measured yet).
    :param stop_s: when its last resize stopped it (0: never resized).
    :param running_since_s: when it last started running (None: it is not running now).
    :param default_s: what is assumed while nothing was measured (``--elastic-restart-cost``).
    """
    if stop_s > 0 and running_since_s is not None and running_since_s > stop_s:
        cost = running_since_s - stop_s
        stored_s = cost if stored_s <= 0 else (1 - _COST_EWMA) * stored_s + _COST_EWMA * cost
    return stored_s if stored_s > 0 else default_s


def remaining_estimate_s(expected_run_s: float | None, ran_s: float) -> float | None:
    """What is left of a running job's run time by the profiler's expected run time (learned per model from the
    runs that succeeded), less what its current run already ran; None when there is no estimate or the job ran
    past it (the leader's and the simulator's one rule)."""
    if expected_run_s is None:
        return None
    return max(0.0, expected_run_s - ran_s) or None


class ElasticAllocator:
    """Elastic tasks on the leader: their learned curves, their allocator view, and their resizes.

    :param tasks: the task table (state changes go through it).
    :param dispatcher: stop decisions with the checkpoint signal.
    :param monitor: task metrics readings and GPU telemetry.
    :param events: the cluster event log (``resize`` events).
    :param metrics: ``gptrm_elastic_*``.
    :param settings: hysteresis interval and default restart cost.
    :param profiler: expected run times (a grow must pay its restart back within what is left of it).
    :param now: the clock (unix seconds).
    """

    def __init__(self, tasks: TaskTable, dispatcher: Dispatcher, monitor: ResourceMonitor, events: EventBus,
                 metrics: Metrics, settings: ElasticSettings, profiler: Profiler | None = None,
                 now: Callable[[], float] = time.time) -> None:
        self._profiler = profiler
        self._tasks, self._dispatcher, self._monitor, self._events = tasks, dispatcher, monitor, events
        self._metrics, self.settings, self._now = metrics, settings, now
        self._curves: dict[str, SpeedupCurve] = {}
        self._ranges: dict[str, ElasticRange | None] = {}   # a task's spec never changes
        self._blocked: dict[str, str] = {}
        self._log = get_logger("elastic")

    # ---- what the cycle asks ----------------------------------------------------------------------

    def range(self, task: types_pb2.Task) -> ElasticRange | None:
        """The sizes a task may run at (None: not elastic)."""
        if not task.spec.HasField("elastic"):
            return None   # kept for elastic tasks only: observe() walks what is kept every cycle
        if task.id not in self._ranges:
            self._ranges[task.id] = elastic_range(task.spec)
        return self._ranges[task.id]

    def curve(self, task: types_pb2.Task) -> SpeedupCurve:
        """Its learned curve (this leader's readings on top of what was stored)."""
        curve = self._curves.get(task.id)
        return curve if curve is not None else curve_of(task)

    def note_blocked(self, reasons: Mapping[str, str]) -> None:
        """What keeps each running elastic task from growing, as the cycle last saw it (task id → words, "" when
        nothing does); replaces what was noted before."""
        self._blocked = {task_id: why for task_id, why in reasons.items() if why}

    def grow_blocked(self, task_id: str) -> str:
        """Why the task did not grow when the cycle last looked ("" when nothing kept it or it was not running)."""
        return self._blocked.get(task_id, "")

    def restart_cost_s(self, task: types_pb2.Task) -> float:
        """Its measured restart cost (the stored average, with the restart just finished folded in)."""
        return learned_restart_cost_s(task.elastic.restart_cost_s, task.elastic.resize_stop_unix_s,
                                      started_s(task) if task.state == TaskState.RUNNING else None,
                                      self.settings.restart_cost_s)

    def jobs(self) -> list[ElasticJob]:
        """The running elastic tasks as the allocator's rules see them."""
        out: list[ElasticJob] = []
        now = self._now()
        for task in self._tasks.live_elastic():
            if task.state != TaskState.RUNNING:
                continue
            rng = self.range(task)
            size = elastic_gpus(task)
            if rng is None or size <= 0:
                continue
            out.append(ElasticJob(task.id, task.spec.priority, rng, size,
                                  tuple((na.node_id, len(na.gpu_indices)) for na in task.allocation.nodes),
                                  self.curve(task), self.restart_cost_s(task),
                                  task.elastic.last_resize_unix_s or None, self._remaining_s(task, now),
                                  protected_until_s(task)))
        return out

    def _remaining_s(self, task: types_pb2.Task, now: float) -> float | None:
        """What is left of its run time by the profiler's estimate (None: no estimate, or it ran past it)."""
        expected = self._profiler.expected_run_s(task.spec) if self._profiler is not None else None
        return remaining_estimate_s(expected, now - started_s(task))

    # ---- learning -----------------------------------------------------------------------------------

    def observe(self) -> None:
        """Fold each running elastic task's current throughput into its curve; refresh the gauges."""
        now = self._now()
        placed = minimum = extra = 0
        live: set[str] = set()
        for task in self._tasks.live_elastic():
            if task.state not in _PLACED:
                continue
            placed += 1
            live.add(task.id)
            size = elastic_gpus(task)
            rng = self.range(task)
            if rng is not None:
                minimum += min(size, rng.minimum)
                extra += max(0, size - rng.minimum)
            if task.state != TaskState.RUNNING or size <= 0 or now - started_s(task) < WARMUP_S:
                continue
            rate = self._throughput(task, size, now)
            if rate is not None:
                self._curves[task.id] = self.curve(task).observe(size, rate)
        for task_id in [t for t in self._curves if t not in live]:
            del self._curves[task_id]
        # A finished task's range is dropped too: kept until retention forgot the task, the ranges of every task
        # submitted since would be walked here every cycle.
        for task_id in [t for t in self._ranges if (found := self._tasks.find(t)) is None
                        or found.state in TERMINAL_STATES]:
            del self._ranges[task_id]
        self._metrics.elastic_tasks.set(placed)
        self._metrics.elastic_gpus.labels("minimum").set(minimum)
        self._metrics.elastic_gpus.labels("extra").set(extra)

    def _throughput(self, task: types_pb2.Task, size: int, now: float) -> float | None:
        """Its counter's rate (fresh readings only), else its GPUs' mean utilization × GPUs."""
        if task.spec.elastic.throughput_counter:
            reading = self._monitor.task_qos(task.id)
            if reading is None or reading.tokens_per_s is None or now - reading.received_unix_s > _FRESH_S:
                return None
            return reading.tokens_per_s
        busy = 0.0
        seen = 0
        for na in task.allocation.nodes:
            hist = self._monitor.history(na.node_id)
            if hist is None:
                continue
            for i in na.gpu_indices:
                util = hist.latest("util_gpu", i)
                if util is not None:
                    busy += util
                    seen += 1
        if not seen:
            return None
        return busy / seen * size

    # ---- carrying decisions out ----------------------------------------------------------------------

    async def resize(self, decisions: Sequence[Resize], *, fault_move: bool = False) -> list[str]:
        """Stop each task for its resize (checkpoint signal, grace, back in the queue at its new size); the
        ids stopped. A task that changed meanwhile is skipped.

        :param fault_move: the resize moves it off a GPU that turned unhealthy (``coordinator/health/moves.py``):
            also counted in its ``gpu_fault_moves``.
        """
        done: list[str] = []
        for d in decisions:
            task = self._tasks.find(d.task_id)
            if task is None or task.state != TaskState.RUNNING:
                continue
            try:
                moves = {"gpu_fault_moves": task.gpu_fault_moves + 1} if fault_move else {}
                stored = await self._tasks.transition(task.id, TaskState.PREEMPTED, f"resizing: {d.reason}",
                                                      elastic=self._status(task, d), **moves)
            except GptrmError as e:   # it changed meanwhile (ended, or a lost compare)
                self._log.info("resize_skipped", task_id=task.id, reason=str(e))
                continue
            signal = stored.spec.checkpoint_signal or DEFAULT_CHECKPOINT_SIGNAL
            self._dispatcher.stop(stored, f"resizing to {d.to_gpus} GPU(s): {d.reason}", checkpoint_signal=signal)
            direction = "grow" if d.grow else "shrink"
            self._metrics.resizes.labels(direction).inc()
            self._log.info("task_resizing", task_id=task.id, from_gpus=d.from_gpus, to_gpus=d.to_gpus,
                           direction=direction, reason=d.reason, expected_speedup=round(d.expected_speedup, 3),
                           for_task=d.for_task)
            self._events.publish("resize", f"task {task.id} {direction}s {d.from_gpus} → {d.to_gpus} GPU(s): "
                                 f"{d.reason}", task_id=task.id, direction=direction, from_gpus=d.from_gpus,
                                 to_gpus=d.to_gpus, reason=d.reason, expected_speedup=f"{d.expected_speedup:.3f}",
                                 for_task=d.for_task)
            done.append(task.id)
        return done

    def _status(self, task: types_pb2.Task, d: Resize) -> types_pb2.ElasticStatus:
        now = self._now()
        status = types_pb2.ElasticStatus()
        status.CopyFrom(task.elastic)
        status.gpus = d.from_gpus
        status.target_gpus = d.to_gpus
        status.resizes = task.elastic.resizes + 1
        status.resize_reason = d.reason[:512]
        status.last_resize_unix_s = now
        status.restart_cost_s = self.restart_cost_s(task) if task.elastic.resize_stop_unix_s else \
            task.elastic.restart_cost_s
        status.resize_stop_unix_s = now
        del status.curve[:]
        status.curve.extend(types_pb2.ElasticPoint(gpus=n, throughput=t) for n, t in self.curve(task).points)
        record = types_pb2.ResizeRecord(time_unix_s=now, from_gpus=d.from_gpus, to_gpus=d.to_gpus,
                                        reason=d.reason[:512], expected_speedup=d.expected_speedup)
        history = [record, *task.elastic.history][:HISTORY]
        del status.history[:]
        status.history.extend(history)
        return status

