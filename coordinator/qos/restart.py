"""Restart policy: a task that failed (or, under ``always``, also ended well) goes back in the queue.

Cancel always wins: a task an admin cancelled (``cancel_requested``) is never restarted, whatever
its policy. Restarts back off exponentially: restart ``n`` (1-based) is not placed before
``min(BACKOFF_CAP_S, BACKOFF_BASE_S × 2^(n-1))`` seconds after the task ended, so a task that
exits at once cannot spin the cluster. ``max_restarts`` is bounded at submit
(:data:`coordinator.profiler.taskspec.MAX_RESTARTS`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState

if TYPE_CHECKING:
    from coordinator.tasks import TaskTable  # type only: the task table loads etcd, which the simulator does without

__all__ = ["AGAIN_AFTER_S", "BACKOFF_BASE_S", "BACKOFF_CAP_S", "DEFAULT_MAX_RESTARTS", "RestartPolicy", "backoff_s"]

DEFAULT_MAX_RESTARTS = 3
"""Restarts allowed when the spec gives no ``max_restarts``."""
BACKOFF_BASE_S = 1.0
"""Delay before the first restart."""
BACKOFF_CAP_S = 300.0
"""Longest delay between two restarts."""
AGAIN_AFTER_S = 2.0
"""Delay before a task refused for want of room on its node is placed again (a few of the agents' reports)."""

_RESTART_FROM = {types_pb2.RESTART_POLICY_ON_FAILURE: (TaskState.FAILED,),
                 types_pb2.RESTART_POLICY_ALWAYS: (TaskState.FAILED, TaskState.SUCCEEDED)}


def backoff_s(restart: int) -> float:
    """Delay before restart number ``restart`` (1 for the first): doubling from the base, capped."""
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0 ** min(max(restart - 1, 0), 32))


class RestartPolicy:
    """Applies each task's ``restart_policy`` and ``max_restarts`` when it ends.

    Example::

        await restarts.fail(task, "agent n1 refused: no such GPU")   # FAILED, then PENDING if allowed

    :param tasks: the task table (state changes go through it).
    :param now: wall clock for the backoff (injected in tests).
    :param fault_move: asked first about a task that ended: when it failed on a GPU that turned unhealthy, it
        requeues it as a move off that GPU (never a restart) and returns it; None lets the policy decide
        (``coordinator/health/moves.py``).
    """

    def __init__(self, tasks: TaskTable, now: Callable[[], float] = time.time,
                 fault_move: Callable[[types_pb2.Task], Awaitable[types_pb2.Task | None]] | None = None) -> None:
        self._tasks = tasks
        self._now = now
        self._fault_move = fault_move

    def allows(self, task: types_pb2.Task) -> bool:
        """Whether the task, in its current state, is to be requeued (never once cancelled)."""
        if task.cancel_requested:
            return False
        states = _RESTART_FROM.get(task.spec.restart_policy, ())
        return TaskState(task.state) in states and task.restarts < (task.spec.max_restarts or DEFAULT_MAX_RESTARTS)

    async def after_end(self, task: types_pb2.Task) -> types_pb2.Task:
        """Requeue a task that just ended when its policy allows (``FAILED → PENDING``), not to be
        placed before its backoff has passed; returns the task. A task that failed on a GPU that turned
        unhealthy is requeued as a move instead, not counted (``fault_move``)."""
        if self._fault_move is not None:
            moved = await self._fault_move(task)
            if moved is not None:
                return moved
        if not self.allows(task):
            return task
        n = task.restarts + 1
        delay = backoff_s(n)
        return await self._tasks.transition(task.id, TaskState.PENDING, f"restart {n} after failure in {delay:.0f}s",
                                            restarts=n, not_before_unix_s=self._now() + delay)

    async def fail(self, task: types_pb2.Task, reason: str) -> types_pb2.Task:
        """Mark a task FAILED (releasing what it held), then requeue it if its policy allows."""
        stored = await self._tasks.transition(task.id, TaskState.FAILED, reason, release=True)
        return await self.after_end(stored)

    async def place_again(self, task: types_pb2.Task, reason: str) -> types_pb2.Task:
        """A start its agent refused for want of room the scheduler counts (a task uid, its master port):
        nothing of it ran, so it goes back in the queue whatever its policy (:meth:`again`)."""
        stored = await self._tasks.transition(task.id, TaskState.FAILED, reason, release=True)
        return await self.again(stored)

    async def again(self, task: types_pb2.Task) -> types_pb2.Task:
        """Requeue a task that ended without running for want of room on its node (``FAILED → PENDING``):
        not a restart (never counted against ``max_restarts``), placed again after :data:`AGAIN_AFTER_S`
        (the node's next report counts what it lacked); never once cancelled."""
        if task.cancel_requested:
            return task
        return await self._tasks.transition(task.id, TaskState.PENDING,
                                            f"{task.reason}; placing it again in {AGAIN_AFTER_S:.0f}s",
                                            not_before_unix_s=self._now() + AGAIN_AFTER_S)
