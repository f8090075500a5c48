"""Lost nodes on a leading replica (coordinator/qos/lost_nodes.py): their tasks are failed or requeued after a
grace, admins remove them, long-lost ones are collected. Real components from ``coordinator.app.build`` on the
test session's etcd; the agent's side is played by the node's decision queue and the reconciler."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from common.errors import IllegalTransition, NotFound
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import NodeState, TaskState
from coordinator.app import App
from coordinator.etcd_embedded import EtcdCluster
from coordinator.monitor.nodes import NodeEntry
from tests.helpers.inproc import inventory, one_gpu_spec, run_leading, until

Scenario = Callable[[App], Awaitable[None]]
spec = one_gpu_spec


def leader(etcd_server: EtcdCluster, etcd_prefix: str, **cfg: float) -> Callable[[Scenario], None]:
    """Runs a scenario on a replica that leads, with the given lost-node settings."""
    return lambda scenario: asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario, **cfg))


async def running_on(app: App, node_id: str, *specs: types_pb2.TaskSpec) -> tuple[NodeEntry, list[str]]:
    """Connect ``node_id``, submit the tasks and report them RUNNING there; returns the entry and task ids."""
    entry = await app.nodes.connected(agent_pb2.Register(inventory=inventory(node_id)), asyncio.Queue())
    ids = [(await app.tasks.submit(s, f"r-{s.name}")).id for s in specs]
    await until(lambda: all(app.tasks.get(i).state == TaskState.SCHEDULED for i in ids))
    for i in ids:
        await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(task_id=i, state=int(TaskState.RUNNING)))
    return entry, ids


class TestTasksOnLostNode:
    def test_failed_or_requeued_after_grace(self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """After the grace a lost node's tasks end: on-failure is requeued, never fails; GPUs are released."""
        leader(etcd_server, etcd_prefix, lost_grace_s=0.2, lost_task_grace_s=0.3, lost_node_gc_s=0)(self._requeue)

    async def _requeue(self, app: App) -> None:
        entry, (again, once) = await running_on(app, "n1", spec("again", types_pb2.RESTART_POLICY_ON_FAILURE),
                                                spec("once"))
        app.nodes.disconnected(entry, entry.stream_id)

        await until(lambda: app.tasks.get(once).state == TaskState.FAILED
                    and app.tasks.get(again).state == TaskState.PENDING)
        requeued = app.tasks.get(again)
        assert requeued.restarts == 1 and not requeued.allocation.nodes
        assert TaskState.FAILED in [h.state for h in requeued.history]
        assert "lost" in app.tasks.get(once).reason
        assert not entry.task_ids and not entry.reservation.gpu_indices
        stored = {t.id: t for t in await asyncio.to_thread(app.store.list_tasks)}
        assert stored[once].state == TaskState.FAILED

        # The agent comes back still running both: it is told to stop them (one copy only).
        outbox: asyncio.Queue = asyncio.Queue()
        await app.nodes.connected(agent_pb2.Register(inventory=inventory("n1"), tasks=[
            agent_pb2.TaskStatus(task_id=i, state=int(TaskState.RUNNING)) for i in (again, once)]), outbox)
        stops = set()
        while not outbox.empty():
            msg = outbox.get_nowait()
            if msg is not None and msg.decision.HasField("stop"):
                stops.add(msg.decision.stop.task_id)
        assert stops == {again, once}

    def test_not_before_grace(self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """A node lost for less than the task grace keeps its task RUNNING (a partition may heal)."""
        leader(etcd_server, etcd_prefix, lost_grace_s=0.2, lost_task_grace_s=3600.0)(self._kept)

    async def _kept(self, app: App) -> None:
        entry, (task_id,) = await running_on(app, "n1", spec("kept"))
        app.nodes.disconnected(entry, entry.stream_id)
        await until(lambda: entry.state == NodeState.LOST)
        await app.lost_nodes.sweep()
        assert app.tasks.get(task_id).state == TaskState.RUNNING
        assert task_id in entry.task_ids


class TestRemoveNode:
    def test_admin_removes_only_lost_nodes(self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """Removing a connected node is refused; a lost one is removed with its tasks failed, from memory and etcd."""
        leader(etcd_server, etcd_prefix, lost_grace_s=0.2, lost_task_grace_s=3600.0, lost_node_gc_s=0)(self._rm)

    async def _rm(self, app: App) -> None:
        entry, (task_id,) = await running_on(app, "n1", spec("victim"))
        await app.nodes.connected(agent_pb2.Register(inventory=inventory("n2")), asyncio.Queue())
        with pytest.raises(IllegalTransition, match="not lost"):
            await app.lost_nodes.remove("n1")
        with pytest.raises(NotFound):
            await app.lost_nodes.remove("nope")

        app.nodes.disconnected(entry, entry.stream_id)
        await until(lambda: entry.state == NodeState.LOST)
        await app.lost_nodes.remove("n1")

        assert app.registry.get("n1") is None and app.registry.get("n2") is not None
        assert app.tasks.get(task_id).state == TaskState.FAILED and "removed" in app.tasks.get(task_id).reason
        assert [r.inventory.node_id for r in await asyncio.to_thread(app.store.list_nodes)] == ["n2"]
        assert "n1" not in app.monitor.latest
        assert any("n1 removed" in e.message for e in app.events.recent(50))

    def test_long_lost_node_collected(self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """A node lost longer than --lost-node-gc is removed by itself; a connected one stays."""
        leader(etcd_server, etcd_prefix, lost_grace_s=0.2, lost_task_grace_s=0.2, lost_node_gc_s=0.5)(self._gc)

    async def _gc(self, app: App) -> None:
        gone = await app.nodes.connected(agent_pb2.Register(inventory=inventory("n1")), asyncio.Queue())
        await app.nodes.connected(agent_pb2.Register(inventory=inventory("n2")), asyncio.Queue())
        app.nodes.disconnected(gone, gone.stream_id)
        await until(lambda: app.registry.get("n1") is None)
        assert app.registry.get("n2") is not None
        assert [r.inventory.node_id for r in await asyncio.to_thread(app.store.list_nodes)] == ["n2"]
