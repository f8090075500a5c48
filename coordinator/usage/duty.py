"""The leader's usage duty: accounts what tasks use, and persists it per hour in etcd.

Every ``interval_s`` (and just after each hour boundary) the duty accounts the window from the stored
``accounted_until`` to ``now - settle_s`` (:func:`coordinator.usage.ledger.account`), adds the result
to the stored hours' rows, and writes those hours and the new marks (``accounted_until`` and each
unfinished task's energy already counted) in **one fenced transaction** that compares every key's
revision as read. So:

- a leader change loses nothing: the new leader reads the marks and accounts from the stored
  ``accounted_until``, from the tasks' state histories (stored in etcd with every change);
- nothing is counted twice: a pass's hours and the marks that say it happened are written together or
  not at all, and a write whose answer was lost is found out by the next one (the marks' revision has
  moved: the duty reads them again and accounts from there);
- ``settle_s`` leaves the state changes in flight time to land in the task table before the window
  that holds them is accounted.

After each pass is stored, ``on_accounted`` (the queues' budget check) is given what the pass added, so
that budgets are read as usage is accounted, from what is stored, one pass at a time.

Energy follows the agents' reports, which a new leader receives again within a sample or two (an
agent reports each task's total since it started there).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from common.errors import GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES
from coordinator.monitor import NodeRegistry
from coordinator.supervisor import Beat, no_beat
from coordinator.sync.leadership import Leadership
from coordinator.sync.usage import MAX_MARKS, MAX_ROWS, UsageStore, hours_between
from coordinator.usage.ledger import HOUR_S, Accrual, ReleasedOf, RowKey, Rows, Usage, account, add_rows, hour_of

__all__ = ["ACCOUNT_PART", "MAX_QUEUE_LABELS", "AccountedPass", "UsageDuty", "UsageMetrics", "bucket_rows",
           "rows_bucket"]

MAX_QUEUE_LABELS = 256
"""Distinct ``queue`` label values of the usage counters; later queues count under ``other``."""
ACCOUNT_PART = 1000
"""Tasks a pass accounts before it lets the leader's loop serve others (about 15 ms of work)."""


@dataclass(frozen=True, slots=True)
class AccountedPass:
    """One stored pass of the usage duty: it accounted ``[since, until)`` and added ``hours`` (hour → rows) to
    what was stored before it."""

    since: float
    until: float
    hours: dict[int, Rows]


OnAccounted = Callable[[AccountedPass], Awaitable[None]]
"""Called after each stored pass (the queues' budget check)."""


class UsageMetrics:
    """``gptrm_queue_gpu_seconds_total{queue}`` and ``gptrm_queue_energy_joules_total{queue}``.

    Queue names come from submitters, so the label takes at most :data:`MAX_QUEUE_LABELS` values: the
    implicit queue is ``default``, the first queues seen keep their names, the rest count as ``other``.

    :param registry: the coordinator's collector registry.
    """

    def __init__(self, registry: CollectorRegistry, max_labels: int = MAX_QUEUE_LABELS) -> None:
        self.gpu_seconds = Counter("gptrm_queue_gpu_seconds", "GPU-seconds accounted to a queue's tasks",
                                   ["queue"], registry=registry)
        self.energy_joules = Counter("gptrm_queue_energy_joules", "energy accounted to a queue's tasks, joules",
                                     ["queue"], registry=registry)
        self._labels: set[str] = {"default", "other"}
        self._max = max_labels

    def label(self, queue: str) -> str:
        if not queue or queue == "default":
            return "default"
        if queue in self._labels:
            return queue
        if len(self._labels) >= self._max:
            return "other"
        self._labels.add(queue)
        return queue

    def add(self, hours: dict[int, Rows]) -> None:
        """Count one committed pass."""
        for rows in hours.values():
            for key, usage in rows.items():
                label = self.label(key.queue)
                if usage.gpu_s > 0:
                    self.gpu_seconds.labels(label).inc(usage.gpu_s)
                if usage.energy_j > 0:
                    self.energy_joules.labels(label).inc(usage.energy_j)


def bucket_rows(bucket: types_pb2.UsageBucket) -> Rows:
    """A stored hour's rows (rows with one key are added up)."""
    rows: Rows = {}
    for r in bucket.rows:
        rows.setdefault(RowKey(r.queue, r.user, r.gpu_model), Usage()).add(
            Usage(r.gpu_s, r.cpu_core_s, r.energy_j, r.tasks))
    return rows


def rows_bucket(hour: int, rows: Rows) -> types_pb2.UsageBucket:
    """The stored form of an hour's rows (ordered by key)."""
    return types_pb2.UsageBucket(hour_unix_s=hour, rows=[
        types_pb2.UsageRow(queue=k.queue, user=k.user, gpu_model=k.gpu_model, gpu_s=u.gpu_s,
                           cpu_core_s=u.cpu_core_s, energy_j=u.energy_j, tasks=u.tasks)
        for k, u in sorted(rows.items())])


class UsageDuty:
    """Accounts usage on the leader and writes it to etcd (see the module docstring).

    :param store: the usage records in etcd.
    :param leadership: fenced writes; nothing is accounted on a standby.
    :param tasks: the leader's tasks now (read on the event loop).
    :param registry: the node inventories (GPU models).
    :param energy_now: task id → joules the running task drew since it (last) started (the monitor's).
    :param metrics: the per-queue counters.
    :param interval_s: seconds between passes.
    :param settle_s: a pass accounts up to this many seconds before now.
    :param now: wall clock (injected in tests).
    :param on_accounted: called with each pass once it is stored.
    :param released: the allocation a task gave up when it last went back to the queue (the leader's state).
    :param since: what a pass from a time reads (the task table's ``since``: the unfinished tasks, those ended since,
        and those named, the ones with energy marks), so that a pass does not walk every finished task retained; None:
        ``tasks()``.
    """

    def __init__(self, store: UsageStore, leadership: Leadership, tasks: Callable[[], Iterable[types_pb2.Task]],
                 registry: NodeRegistry, energy_now: Callable[[str], float], metrics: UsageMetrics, *,
                 interval_s: float = 60.0, settle_s: float = 2.0, now: Callable[[], float] = time.time,
                 on_accounted: OnAccounted | None = None, released: ReleasedOf | None = None,
                 since: Callable[[float, Iterable[str]], Iterable[types_pb2.Task]] | None = None) -> None:
        self._store, self._leadership, self._tasks, self._registry = store, leadership, tasks, registry
        self._since = since
        self.on_accounted = on_accounted
        self._released: ReleasedOf = released or (lambda _task_id: ())
        self._energy_now, self._metrics = energy_now, metrics
        self.interval_s, self.settle_s, self._now = interval_s, settle_s, now
        self._marks: types_pb2.UsageMarks | None = None
        self._marks_revision = 0
        self._log = get_logger("usage")

    @property
    def accounted_until(self) -> float | None:
        """Where the stored usage ends (None until this leader read or started it)."""
        return self._marks.accounted_until_unix_s if self._marks is not None else None

    def model_of(self, node_id: str, indices: list[int]) -> str:
        """The model of a node's GPUs at ``indices`` (``unknown`` when the node or GPU is not known)."""
        entry = self._registry.get(node_id)
        if entry is None:
            return "unknown"
        for gpu in entry.inventory.gpus:
            if gpu.index in indices:
                return gpu.model[:128] or "unknown"
        return "unknown"

    def energy_of(self, task: types_pb2.Task) -> float:
        """Joules the task drew so far: what its ended runs stored, and the current run's reports."""
        if task.state in TERMINAL_STATES:
            return task.energy_j
        return task.energy_j + self._energy_now(task.id)

    def forget(self) -> None:
        """Read the marks from etcd again before the next pass (a new term, or a write whose outcome is unknown)."""
        self._marks, self._marks_revision = None, 0

    async def _load(self) -> types_pb2.UsageMarks:
        if self._marks is None:
            marks, revision = await asyncio.to_thread(self._store.get_marks)
            if marks is None:   # nothing stored (or it was unusable and moved aside): account from now
                start = self._now() - self.settle_s
                marks = types_pb2.UsageMarks(accounted_until_unix_s=start)
                self._log.info("usage_ledger_started", accounted_until_unix_s=start)
            self._marks, self._marks_revision = marks, revision
        return self._marks

    @property
    def revision(self) -> int:
        """The stored marks' revision as this leader last wrote or read them (0: none)."""
        return self._marks_revision if self._marks is not None else 0

    def read(self, hours: Iterable[int]) -> tuple[dict[int, Rows], float | None]:
        """The stored rows of ``hours``, and the stored ``accounted_until`` (None: nothing stored); blocking."""
        stored = self._store.get_hours(hours)
        marks, _ = self._store.get_marks()
        return ({hour: bucket_rows(bucket) for hour, (bucket, _rev) in stored.items()},
                marks.accounted_until_unix_s if marks is not None else None)

    def _reads(self, marks: types_pb2.UsageMarks) -> Iterable[types_pb2.Task]:
        """The tasks a pass from ``marks.accounted_until_unix_s`` may account: :func:`account` skips any other (one
        that ended before, with no energy mark)."""
        if self._since is None:
            return self._tasks()
        return self._since(marks.accounted_until_unix_s, marks.task_energy_j.keys())

    def preview(self, until: float) -> dict[int, Rows]:
        """What is not accounted yet, from ``accounted_until`` to ``until`` (nothing is stored or moved)."""
        if self._marks is None or until <= self._marks.accounted_until_unix_s:
            return {}
        return account(self._reads(self._marks), self._marks.accounted_until_unix_s, until, self._marks.task_energy_j,
                       self.model_of, self.energy_of, self._released).hours

    async def report(self, since: float, until: float, now: float) -> tuple[dict[int, Rows], float | None]:
        """The rows of every hour holding ``[since, until)``: what is stored and, on the leader, what is not
        written yet (a write landing meanwhile is read again); and up to when usage is complete."""
        hours = hours_between(since, until)
        stored: dict[int, Rows] = {}
        accounted: float | None = None
        for _attempt in range(3):
            revision = self.revision
            stored, accounted = await asyncio.to_thread(self.read, hours)
            if self._leadership.leading and revision and self.revision == revision:
                wanted = set(hours)
                for hour, rows in self.preview(now).items():
                    if hour in wanted:
                        add_rows(stored.setdefault(hour, {}), rows, max_rows=1 << 30)
                return stored, now
            if not self._leadership.leading:
                break
        return stored, accounted

    async def flush(self) -> bool:
        """Account up to now - settle and store it (one fenced transaction), then hand the stored pass to
        ``on_accounted``; False when there was nothing new.

        :raises Conflict: the stored usage changed meanwhile (the marks are read again at the next pass).
        :raises NotLeader, Fenced, EtcdUnavailable: as a fenced write.
        """
        marks = await self._load()
        since, until = marks.accounted_until_unix_s, self._now() - self.settle_s
        if not until > since:
            return False
        # Part by part, the leader's loop served between parts: at hundreds of ends a second a minute's pass reads
        # tens of thousands of tasks, half a second of work in one piece.
        tasks = list(self._reads(marks))
        acc = Accrual()
        for at in range(0, len(tasks), ACCOUNT_PART):
            account(tasks[at:at + ACCOUNT_PART], since, until, marks.task_energy_j, self.model_of, self.energy_of,
                    self._released, into=acc)
            if at + ACCOUNT_PART < len(tasks):
                await asyncio.sleep(0)
        stored = await asyncio.to_thread(self._store.get_hours, list(acc.hours))
        buckets = {}
        for hour, rows in acc.hours.items():
            bucket, revision = stored.get(hour, (types_pb2.UsageBucket(hour_unix_s=hour), 0))
            merged = bucket_rows(bucket)
            add_rows(merged, rows, max_rows=MAX_ROWS - 128)
            buckets[hour] = (rows_bucket(hour, merged), revision)
        if len(acc.marks) > MAX_MARKS:   # marks without energy only guard late ends: those go first
            for task_id in [k for k, v in acc.marks.items() if v == 0][: len(acc.marks) - MAX_MARKS]:
                del acc.marks[task_id]
        new = types_pb2.UsageMarks(accounted_until_unix_s=until, task_energy_j=acc.marks)
        self._marks = None   # unknown until the write answers
        revision = await self._leadership.write(self._store.commit, buckets, new, self._marks_revision)
        self._marks, self._marks_revision = new, revision
        self._metrics.add(acc.hours)
        if self.on_accounted is not None:
            await self.on_accounted(AccountedPass(since, until, acc.hours))
        return True

    async def run(self, beat: Beat = no_beat) -> None:
        """Flush every ``interval_s`` and just after each hour boundary, while leading."""
        self.forget()
        while True:
            if self._leadership.leading and not self._leadership.stale:
                try:
                    await self.flush()
                except GptrmError as e:   # retried at the next pass, from the marks as stored
                    self._log.warning("usage_flush_failed", reason=str(e))
                    self.forget()
            beat()
            now = self._now()
            boundary = hour_of(now) + HOUR_S + self.settle_s + 0.5
            delay = min(self.interval_s, boundary - now) if math.isfinite(boundary - now) else self.interval_s
            await asyncio.sleep(max(0.05, delay))
