"""Finished-task retention: tasks that ended are kept for a while, then removed from etcd.

Without it every task ever submitted stays in etcd and in the leader's memory. A finished task
(succeeded, failed, cancelled) is removed once it ended more than ``retain_s`` ago, or when more
than ``retain_count`` finished tasks exist (oldest first) — unless an unfinished task waits for it (``spec.after``
names it or its array). Its summary goes to the log
(``task_removed``: id, name, final state, exit code, restarts, end time) before it goes.

Example::

    retention = TaskRetention(tasks, store, leadership, retain_s=7 * 86400, retain_count=10_000)
    removed = await retention.collect()
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from common.errors import GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.domain import ended_at
from coordinator.supervisor import Beat, no_beat
from coordinator.sync.leadership import Leadership
from coordinator.sync.store import Store
from coordinator.tasks import TaskTable

__all__ = ["TaskRetention"]

_BATCH = 500   # removals per pass, so one pass never holds the loop or etcd for long


class TaskRetention:
    """Removes finished tasks past their retention.

    :param tasks: the leader's task table.
    :param store: the fenced etcd store.
    :param leadership: fenced writes; nothing is removed on a standby.
    :param retain_s: seconds a finished task is kept after it ended.
    :param retain_count: finished tasks kept at most.
    :param now: wall clock (injected in tests).
    """

    def __init__(self, tasks: TaskTable, store: Store, leadership: Leadership, *, retain_s: float,
                 retain_count: int, now: Callable[[], float] = time.time) -> None:
        self._tasks, self._store, self._leadership = tasks, store, leadership
        self._retain_s, self._retain_count, self._now = retain_s, retain_count, now
        self._log = get_logger("coordinator")
        self.removed_total = 0

    def expired(self) -> list[types_pb2.Task]:
        """Finished tasks past their retention, oldest first."""
        horizon = self._now() - self._retain_s
        # The leader keeps its finished tasks in end order: the oldest beyond the count, then those past their time.
        beyond = self._tasks.finished_count() - self._retain_count
        over: list[types_pb2.Task] = []
        for i, t in enumerate(self._tasks.ended_in_order()):
            if i >= beyond and ended_at(t) >= horizon:
                break
            over.append(t)
        if not over:
            return []
        # A finished task an unfinished one still waits for (its id, or its array's) stays: the dependent reads its end.
        awaited = {target for t in self._tasks.live() for dep in t.spec.after for target in dep.ids}
        return [t for t in over if t.id not in awaited and (not t.array_id or t.array_id not in awaited)]

    async def collect(self) -> int:
        """Remove up to one batch of expired tasks from etcd and memory; returns how many went."""
        removed = 0
        for task in self.expired()[:_BATCH]:
            try:
                gone = await self._leadership.write(self._store.delete_task, task.id, task.revision)
            except GptrmError as e:
                self._log.warning("task_remove_failed", task_id=task.id, reason=str(e))
                break
            if not gone:
                await self._tasks.refresh(task.id)
                continue
            self._tasks.forget(task.id)
            removed += 1
            self._log.info("task_removed", task_id=task.id, name=task.spec.name, state=TaskState(task.state).label,
                           exit_code=task.exit_code if task.has_exit_code else None, restarts=task.restarts,
                           ended_unix_s=ended_at(task))
        self.removed_total += removed
        return removed

    async def run(self, beat: Beat = no_beat) -> None:
        """Collect while leading, every quarter of the retention time (between 0.5 and 10 seconds)."""
        period_s = min(10.0, max(0.5, self._retain_s / 4))
        while True:
            await asyncio.sleep(period_s)
            if self._leadership.leading and not self._leadership.stale:
                await self.collect()
            beat()
