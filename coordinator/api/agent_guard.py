"""What an agent stream may claim: its node's name, one live stream per node, its own tasks.

- With mutual TLS the node certificate names the node: a Register for any other node id is
  refused with PERMISSION_DENIED and audited.
- A node has one live stream. A second Register while the first is open and heard from within
  three heartbeat intervals is refused with ALREADY_EXISTS (logged and audited), so it never
  receives that node's decisions. When the old stream has gone silent for longer, the new one
  fences it: the old stream is closed and the event is logged (``node_stream_fenced``).
- A task status or decision acknowledgement counts only for a task the coordinator placed on
  that node; any other is refused, logged and audited, and the task is left unchanged.

The last two hold with or without certificates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2
from coordinator.monitor.nodes import NodeEntry, NodeRegistry
from coordinator.tasks import TaskTable

if TYPE_CHECKING:
    from coordinator.api.auth import Security

__all__ = ["AgentGuard"]


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
                      f"been silent for {3 * self._registry.heartbeat_interval_s:g}s")
            self._refuse(principal, "Connect", node_id, reason, node_id)
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, reason)
        self._log.warning("node_stream_fenced", node_id=node_id, reason="the previous stream went silent")
        if entry.outbox is not None:
            entry.outbox.put_nowait(None)   # ends the old stream; its disconnect is ignored (older stream id)

    def _owns(self, entry: NodeEntry, task_id: str) -> bool | None:
        """True if placed on this node, False if placed elsewhere (or nowhere), None if unknown."""
        task = self._tasks.find(task_id)
        if task is None:
            return None
        return any(na.node_id == entry.node_id for na in task.allocation.nodes)

    def status_allowed(self, entry: NodeEntry, status: agent_pb2.TaskStatus) -> bool:
        """May this node report this task's status? (Unknown tasks pass: the scheduler stops them.)"""
        if self._owns(entry, status.task_id) is not False:
            return True
        reason = f"node {entry.node_id!r} reported a status for task {status.task_id!r}, which is not placed on it"
        self._log.warning("task_status_refused", node_id=entry.node_id, task_id=status.task_id, reason=reason)
        self._refuse(entry.node_id, "TaskStatus", status.task_id, reason, entry.node_id)
        return False

    def ack_allowed(self, entry: NodeEntry, ack: agent_pb2.DecisionAck) -> bool:
        """May this node acknowledge (or refuse) a decision about this task?"""
        if not ack.task_id or self._owns(entry, ack.task_id) is not False:
            return True
        reason = f"node {entry.node_id!r} acknowledged a decision for task {ack.task_id!r}, not placed on it"
        self._log.warning("decision_ack_refused", node_id=entry.node_id, task_id=ack.task_id, reason=reason)
        self._refuse(entry.node_id, "DecisionAck", ack.task_id, reason, entry.node_id)
        return False
