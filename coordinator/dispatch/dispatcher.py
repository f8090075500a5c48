"""Decisions from the leader to agents: start, stop, pause and resume, on each node's stream."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from coordinator.dispatch.launch import DEFAULT_STOP_GRACE_S, launch_argv, restart_env, start_fields
from coordinator.elastic.spec import metrics_mapping_of
from coordinator.monitor.nodes import NodeRegistry
from coordinator.profiler.qos_spec import metrics_url_of

__all__ = ["Dispatcher"]


class Dispatcher:
    """Queues decisions on the agents' streams, stamped with the leader's epoch.

    A decision goes only to a node with an open stream; agents act on a decision id at most once,
    so re-sending after a reconnect is safe.

    Example::

        dispatcher.start(task)                           # one StartTask per node of the allocation
        dispatcher.stop(task, reason="cancelled by an admin")

    :param registry: the node table (each connected node's outbox).
    :param epoch: the leader epoch to stamp on decisions (``Leadership.epoch``).
    """

    def __init__(self, registry: NodeRegistry, epoch: Callable[[], int]) -> None:
        self._registry = registry
        self._epoch = epoch

    def send(self, node_id: str, decision: agent_pb2.Decision) -> bool:
        """Queue one decision for a node; False when the node has no open stream."""
        entry = self._registry.get(node_id)
        if entry is None or entry.outbox is None:
            return False
        decision.leader_epoch = self._epoch()
        entry.outbox.put_nowait(agent_pb2.CoordinatorMessage(decision=decision))
        return True

    def start(self, task: types_pb2.Task, *, only: str = "") -> None:
        """Tell every node of the task's allocation (or only node ``only``) to start its part.

        Part ``i`` runs on ``allocation.nodes[i]`` and is told its rank and its peers
        (:mod:`coordinator.dispatch.launch`).
        """
        spec = task.spec
        for rank, na in enumerate(task.allocation.nodes):
            if only and na.node_id != only:
                continue
            launch = start_fields(task, rank)
            self.send(na.node_id, agent_pb2.Decision(
                decision_id=f"{task.allocation.decision_id}/{na.node_id}",
                start=agent_pb2.StartTask(task_id=task.id, gpu_indices=na.gpu_indices, gpu_uuids=na.gpu_uuids,
                                          argv=launch_argv(spec, launch), env=restart_env(task),
                                          stop_grace_s=spec.stop_grace_s or DEFAULT_STOP_GRACE_S,
                                          gpu_share=na.gpu_share, demand=na.demand,
                                          metrics_url=metrics_url_of(spec), metrics_mapping=metrics_mapping_of(spec),
                                          run_as_user=spec.run_as_user, image=spec.image, mounts=spec.mounts,
                                          workdir=spec.workdir, shm_bytes=spec.shm_bytes, pty=spec.pty, **launch)))

    def stop(self, task: types_pb2.Task, reason: str, *, checkpoint_signal: str = "",
             nodes: frozenset[str] | None = None) -> bool:
        """Ask every node of the task's allocation (or those in ``nodes``) to stop it (after its grace);
        True when any was told.

        :param checkpoint_signal: for a preemption, the signal the agent sends first (the stop follows
            after the grace).
        """
        sent = [self.send(na.node_id, agent_pb2.Decision(
            decision_id=f"stop-{task.id}-{uuid.uuid4().hex[:6]}",
            stop=agent_pb2.StopTask(task_id=task.id, grace_s=task.spec.stop_grace_s or DEFAULT_STOP_GRACE_S,
                                    reason=reason, checkpoint_signal=checkpoint_signal)))
                for na in task.allocation.nodes if nodes is None or na.node_id in nodes]
        return any(sent)

    def stop_unknown(self, node_id: str, task_id: str) -> None:
        """Stop a task an agent runs that the cluster does not know (or knows as finished)."""
        self.send(node_id, agent_pb2.Decision(
            decision_id=f"stop-unknown-{task_id}-{uuid.uuid4().hex[:6]}",
            stop=agent_pb2.StopTask(task_id=task_id, reason="unknown to the coordinator")))

    def pause(self, task: types_pb2.Task) -> list[str]:
        """Pause the task on every node; returns the nodes that could not be told."""
        return [na.node_id for na in task.allocation.nodes if not self.send(na.node_id, agent_pb2.Decision(
            decision_id=f"pause-{task.id}-{uuid.uuid4().hex[:6]}", pause=agent_pb2.PauseTask(task_id=task.id)))]

    def resume(self, task: types_pb2.Task) -> list[str]:
        """Resume the task on every node; returns the nodes that could not be told."""
        return [na.node_id for na in task.allocation.nodes if not self.send(na.node_id, agent_pb2.Decision(
            decision_id=f"resume-{task.id}-{uuid.uuid4().hex[:6]}", resume=agent_pb2.ResumeTask(task_id=task.id)))]
