"""Restart policy: a task that failed (or, under ``always``, also ended well) goes back in the queue."""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState

if TYPE_CHECKING:
    from coordinator.tasks import TaskTable  # the task table imports the dispatcher: type only

__all__ = ["DEFAULT_MAX_RESTARTS", "RestartPolicy"]

DEFAULT_MAX_RESTARTS = 3
"""Restarts allowed when the spec gives no ``max_restarts``."""

_RESTART_FROM = {types_pb2.RESTART_POLICY_ON_FAILURE: (TaskState.FAILED,),
                 types_pb2.RESTART_POLICY_ALWAYS: (TaskState.FAILED, TaskState.SUCCEEDED)}


class RestartPolicy:
    """Applies each task's ``restart_policy`` and ``max_restarts`` when it ends.

    Example::

        await restarts.fail(task, "agent n1 refused: no such GPU")   # FAILED, then PENDING if allowed

    :param tasks: the task table (state changes go through it).
    """

    def __init__(self, tasks: TaskTable) -> None:
        self._tasks = tasks

    def allows(self, task: types_pb2.Task) -> bool:
        """Whether the task, in its current state, is to be requeued."""
        states = _RESTART_FROM.get(task.spec.restart_policy, ())
        return TaskState(task.state) in states and task.restarts < (task.spec.max_restarts or DEFAULT_MAX_RESTARTS)

    async def after_end(self, task: types_pb2.Task) -> types_pb2.Task:
        """Requeue a task that just ended when its policy allows (``FAILED → PENDING``); returns the task."""
        if not self.allows(task):
            return task
        return await self._tasks.transition(task.id, TaskState.PENDING, f"restart {task.restarts + 1} after failure",
                                            restarts=task.restarts + 1)

    async def fail(self, task: types_pb2.Task, reason: str) -> types_pb2.Task:
        """Mark a task FAILED (releasing what it held), then requeue it if its policy allows."""
        stored = await self._tasks.transition(task.id, TaskState.FAILED, reason, release=True)
        return await self.after_end(stored)
