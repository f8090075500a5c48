"""A preempted gang goes back in the queue only when every node of it reported its part ended (or is lost):
real components from ``coordinator.app.build`` on the test session's etcd, the agents' side played by the
reconciler's inputs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import NodeState, TaskState
from coordinator.app import App
from coordinator.etcd_embedded import EtcdCluster
from coordinator.monitor.nodes import NodeEntry
from tests.helpers.inproc import inventory, run_leading, until

Scenario = Callable[[App, list[NodeEntry], str], Awaitable[None]]


@pytest.fixture
def preempted_gang(etcd_server: EtcdCluster, etcd_prefix: str) -> Callable[[Scenario], None]:
    """Runs a scenario on a leading replica whose two 4-GPU nodes run one 2-node gang, just preempted."""

    async def run(scenario: Scenario) -> None:
        async def gang_preempted(app: App) -> None:
            entries = [await app.nodes.connected(agent_pb2.Register(inventory=inventory(n)), asyncio.Queue())
                       for n in ("n1", "n2")]
            gang = await app.tasks.submit(types_pb2.TaskSpec(
                name="gang", argv=["true"], kind=types_pb2.TASK_KIND_TRAINING, nodes=2, has_demand=True,
                demand=types_pb2.ResourceVector(gpus=4, cpu_cores=1)), "r-1")
            await until(lambda: app.tasks.get(gang.id).state == TaskState.SCHEDULED)
            for e in entries:
                await app.reconciler.on_task_status(e, agent_pb2.TaskStatus(task_id=gang.id,
                                                                            state=int(TaskState.RUNNING)))
            assert app.tasks.get(gang.id).state == TaskState.RUNNING
            await app.tasks.transition(gang.id, TaskState.PREEMPTED, "preempted by urgent (priority 10)",
                                       preemptions=1)
            await scenario(app, entries, gang.id)

        await run_leading(etcd_server.endpoints, etcd_prefix, gang_preempted)

    return lambda scenario: asyncio.run(run(scenario))


def ended(task_id: str) -> agent_pb2.TaskStatus:
    """An agent's report that its part of the task was stopped."""
    return agent_pb2.TaskStatus(task_id=task_id, state=int(TaskState.CANCELLED), has_exit_code=True, exit_code=-10)


def holders(app: App, task_id: str) -> list[str]:
    """The nodes whose reservations still hold the task."""
    return sorted(e.node_id for e in app.registry if task_id in e.task_ids)


class TestPreemptedGang:
    def test_released_only_after_every_part_ended(self, preempted_gang: Callable[[Scenario], None]) -> None:
        """The first node's report leaves the gang PREEMPTED holding both nodes; the second one requeues it."""
        preempted_gang(self._every_part)

    async def _every_part(self, app: App, entries: list[NodeEntry], task_id: str) -> None:
        await app.reconciler.on_task_status(entries[0], ended(task_id))
        task = app.tasks.get(task_id)
        assert task.state == TaskState.PREEMPTED
        assert holders(app, task_id) == ["n1", "n2"] and len(task.allocation.nodes) == 2
        await app.reconciler.on_task_status(entries[0], ended(task_id))    # a re-delivery changes nothing
        assert app.tasks.get(task_id).state == TaskState.PREEMPTED

        await app.reconciler.on_task_status(entries[1], ended(task_id))
        task = app.tasks.get(task_id)
        assert task.state == TaskState.PENDING and task.preemptions == 1
        assert holders(app, task_id) == [] and not task.allocation.nodes

    def test_a_lost_node_counts_as_ended(self, preempted_gang: Callable[[Scenario], None]) -> None:
        """When the node that has not reported is lost, its part counts as ended and the gang is requeued."""
        preempted_gang(self._lost_node)

    async def _lost_node(self, app: App, entries: list[NodeEntry], task_id: str) -> None:
        await app.reconciler.on_task_status(entries[0], ended(task_id))
        assert app.tasks.get(task_id).state == TaskState.PREEMPTED
        entries[1].state = NodeState.LOST
        await app.reconciler.on_node_lost("n2")
        assert app.tasks.get(task_id).state == TaskState.PENDING
