"""A multi-node task's parts live and die together.

Each node of a task's allocation runs one part (rank ``i`` on ``allocation.nodes[i]``); the task
record keeps every part's state as its agent reported it (``Task.parts``). A multi-node task is
RUNNING once every part started. When one part fails (exits non-zero, its start is refused, its
agent no longer runs it, or its node is lost) the task records that failure (its reason and exit
code), the other parts are stopped through the normal StopTask path (signal, grace, kill), and once
no part runs any more (each reported its end, or its node is lost) the task ends FAILED once,
releasing its GPUs; its restart policy then applies to the whole task. A task whose parts all
succeed ends SUCCEEDED; one an admin cancelled ends CANCELLED.

Everything this decides is in the task record (parts, reason), so a new leader carries on: a part
still running on a failing task is stopped when its agent registers, and one that never started
is not started again.

Example::

    gangs = Gangs(tasks, registry, dispatcher, restarts, events)
    await gangs.on_status(task, "n2", status)          # an agent's report about its part
    await gangs.part_failed(task, "n2", "node n2 lost")  # its node is gone
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from common.errors import IllegalTransition
from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.pbenum import pb_enum
from common.types import TERMINAL_STATES, NodeState, TaskState
from coordinator.dispatch.dispatcher import Dispatcher
from coordinator.events import EventBus
from coordinator.monitor.nodes import NodeRegistry
from coordinator.ports import Restarts
from coordinator.run_limits import end_of

if TYPE_CHECKING:
    from coordinator.tasks import TaskTable  # type only: the task table loads etcd, which the simulator does without

__all__ = ["Gangs", "is_gang", "parts_of", "with_part"]

_NOT_STARTED = (0, TaskState.SCHEDULED, TaskState.STARTING)   # 0: a part no agent reported yet
_ATTEMPTS = 3


def is_gang(task: types_pb2.Task) -> bool:
    """Whether the task runs on more than one node."""
    return len(task.allocation.nodes) > 1


def parts_of(task: types_pb2.Task) -> list[types_pb2.TaskPart]:
    """The task's parts (copies), one per allocated node in rank order (SCHEDULED for a record without parts)."""
    known = {p.node_id: p for p in task.parts}
    out = []
    for rank, na in enumerate(task.allocation.nodes):
        part = types_pb2.TaskPart()
        if na.node_id in known:
            part.CopyFrom(known[na.node_id])
        else:
            part.node_id, part.state = na.node_id, pb_enum(types_pb2.TaskState, TaskState.SCHEDULED)
        part.rank = rank
        out.append(part)
    return out


def with_part(parts: Sequence[types_pb2.TaskPart], node_id: str, state: TaskState, *, reason: str = "",
              exit_code: int | None = None) -> list[types_pb2.TaskPart]:
    """``parts`` with node ``node_id``'s part in ``state`` (a reason and exit code only with an end)."""
    out = []
    for p in parts:
        part = types_pb2.TaskPart()
        part.CopyFrom(p)
        if p.node_id == node_id:
            part.state = pb_enum(types_pb2.TaskState, state)
            if state in TERMINAL_STATES:
                part.reason = reason
                if exit_code is not None:
                    part.exit_code, part.has_exit_code = exit_code, True
        out.append(part)
    return out


def _part(parts: Sequence[types_pb2.TaskPart], node_id: str) -> types_pb2.TaskPart | None:
    return next((p for p in parts if p.node_id == node_id), None)


class Gangs:
    """The leader's handling of multi-node tasks' parts (see the module docstring).

    :param tasks: the task table.
    :param registry: the node table (a lost node's part counts as ended).
    :param dispatcher: stops the other parts when one fails.
    :param restarts: the restart policy, applied once the whole task ended.
    :param events: the cluster event log.
    """

    def __init__(self, tasks: TaskTable, registry: NodeRegistry, dispatcher: Dispatcher, restarts: Restarts,
                 events: EventBus) -> None:
        self._tasks, self._registry, self._dispatcher = tasks, registry, dispatcher
        self._restarts, self._events = restarts, events
        self._locks: dict[str, asyncio.Lock] = {}   # one per task with a report being applied
        self._users: dict[str, int] = {}            # callers holding or waiting for each lock
        self._again: set[str] = set()               # tasks to place again once ended (a start refused for room)
        self._log = get_logger("scheduler")

    # ---- queries ------------------------------------------------------------------------------

    @staticmethod
    def failing(task: types_pb2.Task) -> bool:
        """Whether a part of the task failed (the others are being stopped)."""
        return any(p.state == TaskState.FAILED for p in task.parts)

    def _lost(self, node_id: str) -> bool:
        entry = self._registry.get(node_id)
        return entry is None or entry.state == NodeState.LOST

    def _running(self, parts: Sequence[types_pb2.TaskPart]) -> list[str]:
        """Nodes whose part may still run (not ended, node not lost)."""
        return [p.node_id for p in parts if p.state not in TERMINAL_STATES and not self._lost(p.node_id)]

    # ---- inputs -------------------------------------------------------------------------------

    async def on_status(self, task_id: str, node_id: str, status: agent_pb2.TaskStatus) -> None:
        """An agent's report about its part of a multi-node task."""
        state = TaskState(status.state)
        code = status.exit_code if status.has_exit_code else None
        await self._locked(task_id, lambda task: self._apply(task, node_id, state, status.reason, code,
                                                             status.log_tail, list(status.pids)))

    async def part_failed(self, task_id: str, node_id: str, reason: str, *, again: bool = False) -> None:
        """A part failed without its agent reporting an exit: its start was refused, its agent no longer runs
        it, or its node is lost.

        :param again: its start was refused for want of room (a task uid, the master port): once every part
            ended, the task goes back in the queue whatever its restart policy (known to this leader only; a
            new leader applies the policy).
        """
        if again:
            self._again.add(task_id)
        await self._locked(task_id, lambda task: self._apply(task, node_id, TaskState.FAILED, reason, None, "", []))

    async def part_gone(self, task_id: str, node_id: str, reason: str) -> None:
        """A part of a failing task that is not running on its node (never started there): it counts as stopped."""
        await self._locked(task_id, lambda task: self._apply(task, node_id, TaskState.CANCELLED, reason, None, "",
                                                             []))

    async def recheck(self, task_id: str) -> None:
        """Finish a failing task whose remaining parts' nodes are now lost."""
        await self._locked(task_id, lambda task: self._maybe_finish(task, parts_of(task)))

    # ---- the state machine of parts ----------------------------------------------------------

    async def _locked(self, task_id: str, step: Callable[[types_pb2.Task], Awaitable[None]]) -> None:
        lock = self._locks.setdefault(task_id, asyncio.Lock())
        self._users[task_id] = self._users.get(task_id, 0) + 1
        async with lock:
            try:
                for attempt in range(_ATTEMPTS):
                    task = self._tasks.find(task_id)
                    if task is None or task.state in TERMINAL_STATES or task.state in (TaskState.PENDING,
                                                                                       TaskState.PREEMPTED):
                        return
                    try:
                        await step(task)
                        return
                    except IllegalTransition as e:   # changed meanwhile (another writer): read it again
                        self._log.warning("gang_update_retried", task_id=task_id, attempt=attempt + 1, reason=str(e))
                        await self._tasks.refresh(task_id)
            finally:
                self._users[task_id] -= 1
                if not self._users[task_id]:   # nobody else waits: the lock goes with the last user
                    del self._users[task_id], self._locks[task_id]

    async def _apply(self, task: types_pb2.Task, node_id: str, state: TaskState, reason: str, code: int | None,
                     log_tail: str, pids: list[int]) -> None:
        old = parts_of(task)
        mine = _part(old, node_id)
        if mine is None:
            return   # not a node of this task (the guard already refuses such reports)
        if mine.state in TERMINAL_STATES or (mine.state == state and state not in TERMINAL_STATES):
            return   # re-delivered, or reported after it ended
        parts = with_part(old, node_id, state, reason=reason, exit_code=code)
        updates: dict[str, object] = {"parts": parts}
        if pids and mine.rank == 0:
            updates["pids"] = pids
        if state in TERMINAL_STATES:
            await self._part_ended(task, mine, parts, state, reason, code, log_tail)
            return
        if state == TaskState.RUNNING and task.state in (TaskState.SCHEDULED, TaskState.STARTING):
            if self.failing(task):
                await self._tasks.update(task.id, **updates)
                self._stop_others(self._tasks.get(task.id), parts, task.reason)
                return
            started = all(p.state not in _NOT_STARTED for p in parts)
            if task.state == TaskState.SCHEDULED:
                await self._tasks.transition(task.id, TaskState.STARTING, "" if started else
                                             f"rank {mine.rank} on {node_id} running; waiting for the other parts",
                                             **updates)
            elif not started:
                await self._tasks.update(task.id, **updates)
            if started:
                await self._tasks.transition(task.id, TaskState.RUNNING, f"all {len(parts)} parts running",
                                             **updates)
            return
        if (state, task.state) in ((TaskState.PAUSED, TaskState.RUNNING), (TaskState.RUNNING, TaskState.PAUSED)):
            await self._tasks.transition(task.id, state, reason, **updates)
            return
        await self._tasks.update(task.id, **updates)

    async def _part_ended(self, task: types_pb2.Task, mine: types_pb2.TaskPart, parts: list[types_pb2.TaskPart],
                          state: TaskState, reason: str, code: int | None, log_tail: str) -> None:
        updates: dict[str, object] = {"parts": parts}
        first_failure = state == TaskState.FAILED and not self.failing(task)
        if first_failure:
            why = f"rank {mine.rank} on {mine.node_id} failed: {reason or 'exited'}"
            updates["reason"] = f"{why}; stopping the other parts"
            if code is not None:
                updates.update(exit_code=code, log_tail=log_tail[-4096:])
            self._log.warning("gang_part_failed", task_id=task.id, node_id=mine.node_id, rank=mine.rank,
                              exit_code=code if code is not None else "", reason=reason)
            self._events.publish("task_state", f"task {task.id}: {why}; stopping its other parts",
                                 task_id=task.id, node_id=mine.node_id)
        else:
            self._log.info("gang_part_ended", task_id=task.id, node_id=mine.node_id, rank=mine.rank,
                           state=state.label, exit_code=code if code is not None else "")
        if not self._running(parts):
            task = await self._tasks.update(task.id, **updates) if first_failure else task
            await self._finish(task, parts)
            return
        stored = await self._tasks.update(task.id, **updates)
        if first_failure:
            self._stop_others(stored, parts, stored.reason)

    def _stop_others(self, task: types_pb2.Task, parts: Sequence[types_pb2.TaskPart], reason: str) -> None:
        nodes = frozenset(self._running(parts))
        if nodes:
            self._dispatcher.stop(task, reason.removesuffix("; stopping the other parts"), nodes=nodes)

    async def _maybe_finish(self, task: types_pb2.Task, parts: list[types_pb2.TaskPart]) -> None:
        if self.failing(task) and not self._running(parts):
            await self._finish(task, parts)

    async def _finish(self, task: types_pb2.Task, parts: list[types_pb2.TaskPart]) -> None:
        """No part runs any more: the task ends once (FAILED, SUCCEEDED, CANCELLED or TIMEOUT), releasing its GPUs."""
        failed = [p for p in parts if p.state == TaskState.FAILED]
        if task.cancel_requested:
            state, reason = TaskState.CANCELLED, "cancelled by an admin"
        elif task.timed_out:
            state, reason = end_of(task, TaskState.CANCELLED, "")
        elif failed:
            state = TaskState.FAILED
            reason = task.reason.removesuffix("; stopping the other parts") if self.failing(task) else \
                f"rank {failed[0].rank} on {failed[0].node_id} failed: {failed[0].reason}"
        elif all(p.state == TaskState.SUCCEEDED for p in parts):
            state, reason = TaskState.SUCCEEDED, ""
        else:
            ended = ", ".join(f"rank {p.rank} {TaskState(p.state).label}" for p in parts)
            state, reason = TaskState.FAILED, f"its parts ended without all succeeding ({ended})"
        updates: dict[str, object] = {"parts": parts}
        if state == TaskState.SUCCEEDED:
            for step in (TaskState.STARTING, TaskState.RUNNING):   # parts that ended before all reported running
                if task.state in (TaskState.SCHEDULED, TaskState.STARTING) and task.state != step:
                    task = await self._tasks.transition(task.id, step, "", **updates)
            updates.update(exit_code=0)
        stored = await self._tasks.transition(task.id, state, reason, release=True, **updates)
        self._log.info("gang_ended", task_id=task.id, state=state.label, reason=reason)
        again = task.id in self._again
        self._again.discard(task.id)
        if state == TaskState.FAILED:
            await (self._restarts.again(stored) if again else self._restarts.after_end(stored))
