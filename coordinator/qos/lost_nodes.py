"""Lost nodes: their tasks are failed (or requeued by their restart policy), and the nodes are removable.

A node is LOST once it has had no stream for the registry's ``lost_grace_s``. Its tasks may still
run (a partition) or may be gone (the host died); after a further ``task_grace_s`` they are given
up: each active task ends FAILED, its reservations released, and goes back in the queue when its
restart policy allows (a task an admin cancelled ends CANCELLED; a PREEMPTED one returns to the
queue). A multi-node task's part on the node fails the task the way a part that exits non-zero does:
its other parts are stopped, then it ends FAILED once (:mod:`coordinator.dispatch.gang`). If the
agent comes back later it is told to stop them: they are no longer placed on it.

A LOST node stays listed until an admin removes it (``gptrmctl nodes rm NODE``) or, with
``gc_after_s`` > 0, until it has been LOST that long; removal fails its tasks first, deletes
``nodes/<id>`` and forgets the node's telemetry. A node that reconnects after removal registers
again as a new node.

Example::

    lost = LostNodes(registry, tasks, restarts, preemptor, store, leadership, monitor, events,
                     task_grace_s=60.0, gc_after_s=7 * 86400)
    await lost.sweep()              # what the leader runs every second
    await lost.remove("gpu-07")     # an admin's removal (the node must be LOST)
"""

from __future__ import annotations

import asyncio

from common.errors import GptrmError, IllegalTransition, NotFound
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, NodeState, TaskState
from coordinator.dispatch.gang import Gangs, is_gang
from coordinator.events import EventBus
from coordinator.monitor.nodes import NodeEntry, NodeRegistry
from coordinator.monitor.resources import ResourceMonitor
from coordinator.qos.preemption import Preemptor
from coordinator.qos.restart import RestartPolicy
from coordinator.run_limits import end_of
from coordinator.supervisor import Beat, no_beat
from coordinator.sync.leadership import Leadership
from coordinator.sync.store import Store
from coordinator.tasks import TaskTable

__all__ = ["LostNodes"]

_ACTIVE = (TaskState.SCHEDULED, TaskState.STARTING, TaskState.RUNNING, TaskState.PAUSED)


class LostNodes:
    """The leader's handling of LOST nodes.

    :param registry: the node table (says when a node is LOST, and for how long).
    :param tasks: the task table.
    :param restarts: the restart policy (a failed task is requeued when it allows).
    :param preemptor: requeues a PREEMPTED task whose node is lost.
    :param store: the fenced etcd store (``nodes/<id>``).
    :param leadership: fenced writes; nothing happens on a standby.
    :param monitor: the Resource Monitor (a removed node's telemetry is forgotten).
    :param events: the cluster event log.
    :param task_grace_s: seconds a node stays LOST before its tasks are failed.
    :param gc_after_s: seconds a node stays LOST before it is removed (0: never by itself).
    :param gangs: multi-node tasks' parts: a lost node's part fails its task's parts together.
    """

    def __init__(self, registry: NodeRegistry, tasks: TaskTable, restarts: RestartPolicy, preemptor: Preemptor,
                 store: Store, leadership: Leadership, monitor: ResourceMonitor, events: EventBus, *,
                 task_grace_s: float, gc_after_s: float, gangs: Gangs | None = None) -> None:
        self._registry, self._tasks, self._restarts, self._preemptor = registry, tasks, restarts, preemptor
        self._gangs = gangs
        self._store, self._leadership, self._monitor, self._events = store, leadership, monitor, events
        self._task_grace_s, self._gc_after_s = task_grace_s, gc_after_s
        self._log = get_logger("coordinator")

    def _tasks_on(self, node_id: str) -> list[types_pb2.Task]:
        return [t for t in self._tasks.values()
                if (t.state in _ACTIVE or t.state == TaskState.PREEMPTED)
                and any(na.node_id == node_id for na in t.allocation.nodes)]

    async def fail_tasks(self, entry: NodeEntry, reason: str) -> int:
        """End every active task placed on the node (requeued per restart policy); returns how many."""
        ended = 0
        for task in self._tasks_on(entry.node_id):
            if is_gang(task) and any(p.node_id == entry.node_id and p.state in TERMINAL_STATES for p in task.parts):
                continue   # its part here already counted as failed; the task ends when its other parts did
            try:
                if task.state == TaskState.PREEMPTED:
                    await self._preemptor.victim_stopped(task)
                elif self._gangs is not None and is_gang(task):
                    # Its other parts are stopped first; the task ends FAILED once none runs.
                    await self._gangs.part_failed(task.id, entry.node_id, reason)
                elif task.cancel_requested:
                    await self._tasks.transition(task.id, TaskState.CANCELLED, f"cancelled by an admin; {reason}",
                                                 release=True)
                elif task.timed_out:
                    await self._tasks.transition(task.id, *end_of(task, TaskState.FAILED, reason), release=True)
                else:
                    await self._restarts.fail(task, reason)
            except IllegalTransition as e:   # it changed meanwhile: read it again, the next sweep decides
                self._log.warning("lost_node_task_not_ended", node_id=entry.node_id, task_id=task.id, reason=str(e))
                await self._tasks.refresh(task.id)
                continue
            ended += 1
            self._log.warning("lost_node_task_ended", node_id=entry.node_id, task_id=task.id, reason=reason)
        return ended

    async def sweep(self) -> None:
        """Fail the tasks of nodes LOST past the task grace; remove nodes LOST past ``gc_after_s``."""
        for entry in self._registry:
            lost_for = self._registry.lost_for(entry)
            if entry.state != NodeState.LOST or lost_for < self._task_grace_s:
                continue
            if self._tasks_on(entry.node_id):
                n = await self.fail_tasks(entry, f"node {entry.node_id} lost for {lost_for:.0f}s")
                if n:
                    self._events.publish("node_state", f"node {entry.node_id} lost for {lost_for:.0f}s: {n} task(s) "
                                         "failed (requeued where their restart policy allows)",
                                         node_id=entry.node_id)
            if self._gc_after_s > 0 and lost_for >= self._gc_after_s:
                await self._remove(entry, f"lost for {lost_for:.0f}s (--lost-node-gc {self._gc_after_s:.0f}s)")

    async def remove(self, node_id: str) -> types_pb2.NodeRecord:
        """An admin removes a LOST node: its tasks are failed at once, then it is forgotten.

        :raises NotFound: no such node.
        :raises IllegalTransition: the node is not LOST (drain it and stop its agent first).
        :raises NotLeader: on a standby.
        """
        self._leadership.require_leader()
        entry = self._registry.get(node_id)
        if entry is None:
            raise NotFound(f"node {node_id!r} not found")
        if entry.state != NodeState.LOST:
            raise IllegalTransition(f"node {node_id} is {entry.state.label}, not lost: only a lost node can be "
                                    "removed (stop its agent and wait for it to be lost)")
        await self.fail_tasks(entry, f"node {node_id} removed by an admin")
        return await self._remove(entry, "removed by an admin")

    async def _remove(self, entry: NodeEntry, reason: str) -> types_pb2.NodeRecord:
        left = self._tasks_on(entry.node_id)
        if left:
            raise IllegalTransition(f"node {entry.node_id} still holds {len(left)} task(s); try again")
        await self._leadership.write(self._store.delete_node, entry.node_id)
        self._registry.remove(entry.node_id)
        self._monitor.forget_node(entry.node_id)
        self._log.info("node_removed", node_id=entry.node_id, reason=reason)
        self._events.publish("node_state", f"node {entry.node_id} removed: {reason}", node_id=entry.node_id)
        return entry.record

    async def run(self, period_s: float = 1.0, beat: Beat = no_beat) -> None:
        """Sweep while leading."""
        while True:
            await asyncio.sleep(period_s)
            if self._leadership.leading and not self._leadership.stale:
                try:
                    await self.sweep()
                except GptrmError as e:   # etcd trouble: the next sweep tries again
                    self._log.warning("lost_node_sweep_failed", reason=str(e))
            beat()
