"""What an agent stream may claim: its node's name, one live stream per node, its own tasks.

- With mutual TLS the node certificate names the node: a Register for any other node id is
  refused with PERMISSION_DENIED and audited.
- A node has one live stream. A second Register while the first is open and heard from within
  three heartbeat intervals is refused with ALREADY_EXISTS (logged and audited), so it never
  receives that node's decisions. When the old stream has gone silent for longer, the new one
  fences it: the old stream is closed and the event is logged (``node_stream_fenced``).
- A task status or decision acknowledgement counts only for a task the coordinator placed on
  that node; any other is ignored, and the task is left unchanged. One for a task that node held
  earlier (it was requeued, preempted or placed elsewhere since: a late report, not a forgery) is
  logged at debug level (``agent_ack_stale``); one for a task never placed on that node is refused,
  logged and audited. The task's history tells the two apart (its SCHEDULED entries name the nodes
  of each placement); where that history no longer reaches back to the submission (it keeps the
  newest changes only) or the record has none, the report counts as stale. A status or
  acknowledgement for a task the coordinator does not know passes (the scheduler stops the task).

The last two hold with or without certificates.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

import grpc

from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TaskState
from coordinator.monitor.nodes import NodeEntry, NodeRegistry
from coordinator.sync import placed_nodes
from coordinator.tasks import TaskTable

if TYPE_CHECKING:
    from coordinator.api.auth import Security

__all__ = ["AgentGuard", "NodeStanding", "node_standing"]


class NodeStanding(Enum):
    """How a node stands to a task it reports on."""

    UNKNOWN = "unknown"   # no such task (the coordinator does not know it)
    NOW = "now"           # placed on the node now
    EARLIER = "earlier"   # placed on it before, or it cannot be told that it never was
    NEVER = "never"       # never placed on it


def node_standing(task: types_pb2.Task | None, node_id: str) -> NodeStanding:
    """Whether ``node_id`` holds ``task`` now, held it earlier, or never did (see the module docstring)."""
    if task is None:
        return NodeStanding.UNKNOWN
    if any(na.node_id == node_id for na in task.allocation.nodes):
        return NodeStanding.NOW
    if any(p.node_id == node_id for p in task.parts) or any(node_id in placed_nodes(c) for c in task.history):
        return NodeStanding.EARLIER
    first = task.history[0] if task.history else None
    complete = (first is not None and first.state == TaskState.PENDING
                and first.time_unix_s == task.submit_unix_s)   # the entry create_task writes
    return NodeStanding.NEVER if complete else NodeStanding.EARLIER


class AgentGuard:
    """Checks one AgentGateway's streams against the coordinator's state.

    :param registry: the node table.
    :param tasks: the task table (which node each task was placed on).
    :param security: the server's ``Security`` (node certificates, audit log); None checks no
        certificates and audits to the process log only.
    """

    def __init__(self, registry: NodeRegistry, tasks: TaskTable, security: Security | None = None) -> None:
        self._registry = registry
        self._tasks = tasks
        self.security = security
        self._log = get_logger("gateway")

    def _refuse(self, principal: str, method: str, target: str, reason: str, node_id: str = "") -> None:
        if self.security is not None:
            self.security.audit.record(principal=principal, role="node", method=method, target=target,
                                       outcome="refused", reason=reason)
        else:
            self._log.warning("call_refused", principal=principal, method=method, node_id=node_id, reason=reason)

    async def admit(self, register: agent_pb2.Register, context: grpc.aio.ServicerContext) -> None:
        """Refuse (abort) a Register that names another node, or a node with a live stream."""
        node_id = register.inventory.node_id
        principal = node_id
        if self.security is not None:
            cert = self.security.node_principal(context)
            if cert is not None:
                principal = cert.name
                if cert.name != node_id:
                    reason = f"certificate for node {cert.name!r} cannot register as node {node_id!r}"
                    self._refuse(cert.name, "Connect", node_id, reason, node_id)
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)
        entry = self._registry.get(node_id)
        if entry is None or not entry.connected:
            return
        if self._registry.stream_live(entry):
            reason = (f"node {node_id!r} already has a live stream; a second one is refused until the first has "
                      f"been silent for {self._registry.silence_limit_s:g}s")
            self._refuse(principal, "Connect", node_id, reason, node_id)
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, reason)
        self._log.warning("node_stream_fenced", node_id=node_id, reason="the previous stream went silent")
        if entry.outbox is not None:
            entry.outbox.put_nowait(None)   # ends the old stream; its disconnect is ignored (older stream id)

    def _allowed(self, entry: NodeEntry, task_id: str, method: str, refused_event: str, reason: str) -> bool:
        """Whether a message about ``task_id`` from this node is applied. One for a task the node held earlier
        is logged at debug level; one for a task never placed on it is logged as ``refused_event`` and
        audited as refused (``method``, ``reason``)."""
        task = self._tasks.find(task_id)
        held = node_standing(task, entry.node_id)
        if held in (NodeStanding.UNKNOWN, NodeStanding.NOW):
            return True
        if held is NodeStanding.EARLIER and task is not None:
            self._log.debug("agent_ack_stale", node_id=entry.node_id, task_id=task_id, method=method,
                            task_state=TaskState(task.state).name)
            return False
        self._log.warning(refused_event, node_id=entry.node_id, task_id=task_id, reason=reason)
        self._refuse(entry.node_id, method, task_id, reason, entry.node_id)
        return False

    def status_allowed(self, entry: NodeEntry, status: agent_pb2.TaskStatus) -> bool:
        """May this node report this task's status? (Unknown tasks pass: the scheduler stops them.)"""
        reason = f"node {entry.node_id!r} reported a status for task {status.task_id!r}, which is not placed on it"
        return self._allowed(entry, status.task_id, "TaskStatus", "task_status_refused", reason)

    def ack_allowed(self, entry: NodeEntry, ack: agent_pb2.DecisionAck) -> bool:
        """May this node acknowledge (or refuse) a decision about this task?"""
        if not ack.task_id:
            return True
        reason = f"node {entry.node_id!r} acknowledged a decision for task {ack.task_id!r}, not placed on it"
        return self._allowed(entry, ack.task_id, "DecisionAck", "decision_ack_refused", reason)
