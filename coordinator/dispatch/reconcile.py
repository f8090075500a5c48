"""What agents report, applied to the task table: registrations, task status events, refusals.

A new leader knows from etcd what should run; agents know what does. On registration the two are
compared (tasks the cluster does not know are stopped, placed tasks the agent never saw are
started again), and after a grace every active task no agent reported is failed (and requeued
when its restart policy allows).

A preempted gang goes back in the queue (``PREEMPTED → PENDING``, its GPUs freed) only when every
node of its allocation has reported its part ended or is lost: the first node to finish stopping
its part must not free GPUs that the other parts still use.

Every other report about a part of a multi-node task goes to :class:`~coordinator.dispatch.gang.Gangs`:
its parts start together, and when one fails the others are stopped and the task ends FAILED once.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from common.errors import GptrmError, IllegalTransition
from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TERMINAL_STATES, NodeState, TaskState
from coordinator.dispatch.dispatcher import Dispatcher
from coordinator.dispatch.gang import Gangs, is_gang, parts_of, with_part
from coordinator.events import EventBus
from coordinator.monitor.nodes import NodeEntry, NodeRegistry
from coordinator.ports import RequeuePreempted, Restarts
from coordinator.run_limits import end_of, stopping
from coordinator.supervisor import Beat, no_beat

if TYPE_CHECKING:
    from coordinator.tasks import TaskTable  # type only: the task table loads etcd, which the simulator does without

__all__ = ["Reconciler"]

_ACTIVE = (TaskState.SCHEDULED, TaskState.STARTING, TaskState.RUNNING, TaskState.PAUSED)


def same_run(decision_id: str, task: types_pb2.Task) -> bool:
    """Whether an agent's report with start decision ``decision_id`` is about the run ``task``'s placement in force
    started (``<placement decision>/<node>``). A report without one (an older agent) and a task with no placement
    recorded are taken as the same run."""
    placement = task.allocation.decision_id
    if not decision_id or not placement:
        return True
    return decision_id.startswith(placement + "/")


def about_earlier_run(decision_id: str, task: types_pb2.Task) -> bool:
    """Whether a report or refusal naming ``decision_id`` is about a run before the placement in force, while that
    placement is not yet confirmed (SCHEDULED or STARTING): delivered late after a reconnect, it must not decide
    the run just placed."""
    return task.state in (TaskState.SCHEDULED, TaskState.STARTING) and not same_run(decision_id, task)


class Reconciler:
    """Applies agents' reports in order and reconciles after registrations and leader changes.

    :param task_grace_s: how long a new leader waits for agents to report their tasks.
    :param tasks: the task table.
    :param registry: the node table.
    :param dispatcher: decisions to agents.
    :param restarts: the QoS Manager's restart policy.
    :param events: the cluster event log.
    :param preemptor: the QoS Manager's preemption (PREEMPTED tasks that ended go back in the queue).
    """

    def __init__(self, task_grace_s: float, tasks: TaskTable, registry: NodeRegistry, dispatcher: Dispatcher,
                 restarts: Restarts, events: EventBus, preemptor: RequeuePreempted) -> None:
        self._grace_s = task_grace_s
        self._tasks, self._registry, self._dispatcher = tasks, registry, dispatcher
        self._restarts, self._events, self._preemptor = restarts, events, preemptor
        self._reported: dict[str, set[str]] = {}      # node id → task ids its agent reported since we lead
        self._parts_ended: dict[str, set[str]] = {}   # PREEMPTED task id → nodes whose part reported it ended
        self._log = get_logger("scheduler")
        self.gangs = Gangs(tasks, registry, dispatcher, restarts, events)

    async def on_agent_registered(self, entry: NodeEntry, register: agent_pb2.Register) -> None:
        """Reconcile the agent's task table with ours, and re-send starts it has not seen."""
        reported = {s.task_id for s in register.tasks}
        self._reported.setdefault(entry.node_id, set()).update(reported)
        for status in register.tasks:
            task = self._tasks.find(status.task_id)
            if task is None or task.state in TERMINAL_STATES:
                self._log.warning("unknown_task_stopped", node_id=entry.node_id, task_id=status.task_id)
                self._events.publish("decision", f"stopping task {status.task_id} on {entry.node_id}: not known "
                                     "to the cluster", node_id=entry.node_id, task_id=status.task_id)
                self._dispatcher.stop_unknown(entry.node_id, status.task_id)
            elif all(na.node_id != entry.node_id for na in task.allocation.nodes):
                # Given up while this node was lost (requeued, or placed elsewhere): one copy only.
                self._log.warning("misplaced_task_stopped", node_id=entry.node_id, task_id=status.task_id)
                self._events.publish("decision", f"stopping task {status.task_id} on {entry.node_id}: it is not "
                                     "placed there any more", node_id=entry.node_id, task_id=status.task_id)
                self._dispatcher.stop_unknown(entry.node_id, status.task_id)
        # Only the tasks placed on this node (kept by the leader state): a leader change re-registers every
        # node, and a pass over every task per registration would grow with the cluster squared.
        for task_id in sorted(entry.task_ids):
            task = self._tasks.find(task_id)
            if task is None or all(na.node_id != entry.node_id for na in task.allocation.nodes):
                continue
            if is_gang(task) and task.state in _ACTIVE:
                await self._gang_registered(task, entry.node_id, task.id in reported)
            elif task.state == TaskState.SCHEDULED and task.id not in reported:
                self._dispatcher.start(task)
            elif task.state == TaskState.PREEMPTED and task.id in reported:
                self._dispatcher.stop(task, task.reason, checkpoint_signal=task.spec.checkpoint_signal or "SIGUSR1")

    async def _gang_registered(self, task: types_pb2.Task, node_id: str, reported: bool) -> None:
        """A node of a multi-node task registered: start its part if it never started (the start decision
        is idempotent by id); on a failing task, stop its part, or count it stopped when it does not run."""
        part = next((p for p in parts_of(task) if p.node_id == node_id), None)
        if part is None or part.state in TERMINAL_STATES:
            return
        if self.gangs.failing(task):
            if reported:
                self._dispatcher.stop(task, task.reason.removesuffix("; stopping the other parts"),
                                      nodes=frozenset({node_id}))
            else:
                await self.gangs.part_gone(task.id, node_id, "not running on its node when the task failed")
        elif not reported and part.state in (TaskState.SCHEDULED, TaskState.STARTING):
            self._dispatcher.start(task, only=node_id)

    async def on_decision_ack(self, entry: NodeEntry, ack: agent_pb2.DecisionAck) -> None:
        """An agent refused a decision.

        A refused start fails the task there (requeued when its policy allows); one refused for want of room
        the scheduler counts (``no_room``: no free task uid, its master port held by something else) goes
        back in the queue whatever its policy, to be placed on another node or port. A decision refused
        because the agent runs no such task, for a task this node should be running, means the task
        is gone from the node: it ends (CANCELLED when an admin cancelled it, else FAILED and handed
        to its restart policy) instead of staying RUNNING with its GPUs held.
        """
        if ack.ok or not ack.task_id:
            return
        task = self._tasks.find(ack.task_id)
        if task is None:
            return
        if about_earlier_run(ack.decision_id, task):
            # A refusal of a decision about an earlier run (the stop of the run before the task was placed
            # again, answered late after a reconnect): the placement in force was not refused.
            self._log.debug("decision_ack_stale", task_id=task.id, node_id=entry.node_id, decision_id=ack.decision_id,
                            placement=task.allocation.decision_id)
            return
        on_node = any(na.node_id == entry.node_id for na in task.allocation.nodes)
        if on_node and is_gang(task):
            await self._gang_ack(task, entry.node_id, ack)
            return
        if task.state in (TaskState.SCHEDULED, TaskState.STARTING):
            if ack.no_room:
                await self._restarts.place_again(task, f"agent {entry.node_id} refused: {ack.reason}")
            else:
                await self._restarts.fail(task, f"agent {entry.node_id} refused: {ack.reason}")
            return
        if not (ack.task_unknown and on_node and task.state in (TaskState.RUNNING, TaskState.PAUSED)):
            return
        self._log.warning("task_missing_on_node", task_id=task.id, node_id=entry.node_id, reason=ack.reason)
        if task.cancel_requested:
            await self._tasks.transition(task.id, TaskState.CANCELLED,
                                         f"cancelled by an admin (agent {entry.node_id} no longer ran it)",
                                         release=True)
            return
        if task.timed_out:
            await self._tasks.transition(task.id, *end_of(task, TaskState.CANCELLED, ""), release=True)
            return
        await self._restarts.fail(task, f"agent {entry.node_id} no longer runs it: {ack.reason}")

    async def _gang_ack(self, task: types_pb2.Task, node_id: str, ack: agent_pb2.DecisionAck) -> None:
        """A refusal about a part of a multi-node task: a refused start, or a part its agent no longer runs,
        fails the task's parts together (a part that never ran on a failing task counts as stopped)."""
        part = next((p for p in parts_of(task) if p.node_id == node_id), None)
        if part is None or part.state in TERMINAL_STATES or task.state not in _ACTIVE:
            return
        if ack.task_unknown and (self.gangs.failing(task) or stopping(task)):
            await self.gangs.part_gone(task.id, node_id, f"not running on {node_id}: {ack.reason}")
        elif ack.task_unknown and task.state in (TaskState.RUNNING, TaskState.PAUSED):
            self._log.warning("task_missing_on_node", task_id=task.id, node_id=node_id, reason=ack.reason)
            await self.gangs.part_failed(task.id, node_id, f"agent {node_id} no longer runs it: {ack.reason}")
        elif not ack.task_unknown and task.state in (TaskState.SCHEDULED, TaskState.STARTING):
            if ack.no_room and part.rank == 0 and task.allocation.master_port:
                # Held by something else: not handed out on this node again for a while (PortBook).
                entry = self._registry.get(node_id)
                if entry is not None:
                    entry.ports_refused[task.allocation.master_port] = time.monotonic()
            await self.gangs.part_failed(task.id, node_id, f"agent {node_id} refused: {ack.reason}",
                                         again=ack.no_room)

    def folds(self, first: agent_pb2.TaskStatus, then: agent_pb2.TaskStatus) -> bool:
        """Whether ``first`` (a start) need not be applied on its own because ``then``, the same task's next event
        in the same report, says it is running: :meth:`on_task_status` stores both in one write. Not for a start
        with news (its pull's progress) or a gang's part (its parts are followed one by one)."""
        if first.task_id != then.task_id or first.decision_id != then.decision_id or first.reason \
                or first.state != types_pb2.TASK_STATE_STARTING or then.state != types_pb2.TASK_STATE_RUNNING:
            return False
        task = self._tasks.find(first.task_id)
        return task is not None and task.state == TaskState.SCHEDULED and not is_gang(task)

    async def on_task_status(self, entry: NodeEntry, status: agent_pb2.TaskStatus) -> None:
        """Apply one task-status event from an agent (in order, before it is acknowledged)."""
        self._reported.setdefault(entry.node_id, set()).add(status.task_id)
        task = self._tasks.find(status.task_id)
        state = TaskState(status.state)
        if task is None:
            self._dispatcher.stop_unknown(entry.node_id, status.task_id)
            return
        if state in TERMINAL_STATES and about_earlier_run(status.decision_id, task):
            # The end of an earlier run (requeued and placed again meanwhile, its end accounted for then), delivered
            # late after a reconnect: it must not end the run just placed. Acknowledged, not applied.
            self._log.debug("task_status_stale", task_id=task.id, node_id=entry.node_id,
                            decision_id=status.decision_id, placement=task.allocation.decision_id)
            return
        if task.state == TaskState.PREEMPTED:
            if state in TERMINAL_STATES:   # stopped for a preemption: back in the queue once every part is
                await self._part_ended(task, entry.node_id)
            return
        if task.state in _ACTIVE and is_gang(task):
            await self.gangs.on_status(task.id, entry.node_id, status)
            return
        if task.state == state == TaskState.STARTING and status.reason:
            # Progress of a start under way (its image's pull: bytes so far, unpacking): shown, not stored.
            self._tasks.note_reason(task.id, status.reason[:256])
            return
        if task.state == state or task.state in TERMINAL_STATES:
            return   # re-delivered after a reconnect, or already final
        reason = status.reason
        if task.cancel_requested and state == TaskState.FAILED:
            state, reason = TaskState.CANCELLED, f"cancelled by an admin (it ended: {status.reason})"
            if task.state == state:
                return
        state, reason = end_of(task, state, reason)
        updates: dict[str, object] = {"pids": list(status.pids)} if status.pids else {}
        if status.has_exit_code:
            updates.update(exit_code=status.exit_code, log_tail=status.log_tail[-4096:])
        if task.allocation.nodes:
            updates["parts"] = with_part(parts_of(task), entry.node_id, state, reason=reason,
                                         exit_code=status.exit_code if status.has_exit_code else None)
        try:
            # Running before its start was stored (the start not reported, or folded into this report): both in
            # one write.
            via = TaskState.STARTING if state == TaskState.RUNNING and task.state == TaskState.SCHEDULED else None
            stored = await self._tasks.transition(task.id, state, reason, release=state in TERMINAL_STATES, via=via,
                                                  **updates)
        except IllegalTransition as e:
            self._log.warning("task_status_rejected", task_id=task.id, node_id=entry.node_id, reason=str(e))
            await self._tasks.refresh(task.id)
            fresh = self._tasks.find(task.id)
            if fresh is not None and fresh.state == TaskState.PREEMPTED and state in TERMINAL_STATES:
                await self._part_ended(fresh, entry.node_id)   # preempted meanwhile (by a previous leader)
            return
        if state == TaskState.FAILED:
            await self._restarts.after_end(stored)

    async def reconcile_after_grace(self, beat: Beat = no_beat) -> None:
        """A new leader waits for agents to report; active tasks nobody reports by then failed."""
        self._reported = {e.node_id: set() for e in self._registry if e.connected}
        await asyncio.sleep(self._grace_s)
        for task in self._tasks.values():
            if task.state not in (*_ACTIVE, TaskState.PREEMPTED) or task.state == TaskState.SCHEDULED:
                continue
            nodes = [na.node_id for na in task.allocation.nodes]
            if any(task.id in self._reported.get(n, set()) for n in nodes):
                if is_gang(task) and task.state != TaskState.PREEMPTED:
                    await self._gang_unreported(task, nodes)
                continue
            if task.state == TaskState.PREEMPTED:   # no agent runs it any more
                await self._victim_stopped(task)
                continue
            self._log.warning("task_unreported", task_id=task.id, nodes=",".join(nodes))
            try:
                await self._restarts.fail(task, f"no agent reported it within {self._grace_s:.0f}s "
                                          "after a leader change")
            except GptrmError as e:
                self._log.warning("task_reconcile_failed", task_id=task.id, reason=str(e))
        beat()

    async def _gang_unreported(self, task: types_pb2.Task, nodes: list[str]) -> None:
        """After a leader change, a part of a multi-node task whose connected agent did not report it is gone:
        the task's parts fail together (or, on a failing task, that part counts as stopped)."""
        for node_id in nodes:
            entry = self._registry.get(node_id)
            if entry is None or not entry.connected or task.id in self._reported.get(node_id, set()):
                continue
            current = self._tasks.find(task.id)
            if current is None:
                continue
            part = next((p for p in parts_of(current) if p.node_id == node_id), None)
            if part is None or part.state in TERMINAL_STATES or (
                    part.state in (0, TaskState.SCHEDULED) and not self.gangs.failing(current)):
                continue   # ended, or never started: its start was sent again when its agent registered
            reason = f"not running on {node_id} after a leader change"
            if self.gangs.failing(current) or stopping(current):
                await self.gangs.part_gone(task.id, node_id, reason)
            else:
                await self.gangs.part_failed(task.id, node_id, reason)

    async def on_node_lost(self, node_id: str) -> None:
        """A lost node's parts of preempted gangs count as ended: gangs waiting only for it go back in the queue."""
        for task_id in list(self._parts_ended):
            task = self._tasks.find(task_id)
            if task is None or task.state != TaskState.PREEMPTED:
                self._parts_ended.pop(task_id, None)
            elif any(na.node_id == node_id for na in task.allocation.nodes):
                await self._part_ended(task, None)
        for task in self._tasks.values():   # failing gangs waiting only for this node's part
            if task.state in _ACTIVE and is_gang(task) and self.gangs.failing(task) \
                    and any(na.node_id == node_id for na in task.allocation.nodes):
                await self.gangs.recheck(task.id)

    def _lost(self, node_id: str) -> bool:
        entry = self._registry.get(node_id)
        return entry is None or entry.state == NodeState.LOST

    async def _part_ended(self, task: types_pb2.Task, node_id: str | None) -> None:
        """One node's part of a PREEMPTED task ended (None: re-check after a node loss); the task goes back in the
        queue when no node of its allocation still runs a part."""
        ended = self._parts_ended.setdefault(task.id, set())
        if node_id is not None:
            ended.add(node_id)
        waiting = sorted({na.node_id for na in task.allocation.nodes
                          if na.node_id not in ended and not self._lost(na.node_id)})
        if waiting:
            self._log.info("preempted_part_ended", task_id=task.id, node_id=node_id or "", waiting=",".join(waiting))
            return
        await self._victim_stopped(task)

    async def _victim_stopped(self, task: types_pb2.Task) -> None:
        self._parts_ended.pop(task.id, None)
        try:
            await self._preemptor.victim_stopped(task)
        except GptrmError as e:
            self._log.warning("preempted_task_requeue_failed", task_id=task.id, reason=str(e))
            await self._tasks.refresh(task.id)
