"""A preemption's victims change state in one etcd write: a leader that dies during a preemption never leaves
some victims preempted and the others running. Real components from ``coordinator.app.build`` on the test
session's etcd; the agent's side is played through the reconciler's inputs."""

from __future__ import annotations

import asyncio

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TaskState
from coordinator.app import App
from coordinator.etcd_embedded import EtcdCluster
from tests.helpers.inproc import inventory, run_leading, until


def _spec(name: str, priority: int, gpus: int) -> types_pb2.TaskSpec:
    return types_pb2.TaskSpec(name=name, argv=["true"], kind=types_pb2.TASK_KIND_TRAINING, priority=priority,
                              has_demand=True, demand=types_pb2.ResourceVector(gpus=gpus, cpu_cores=1))


def test_both_victims_are_preempted_in_one_write(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """A two-GPU priority-10 task preempts the two one-GPU tasks running on a two-GPU node: both are PREEMPTED
    at the same etcd revision, each counted once."""

    async def scenario(app: App) -> None:
        entry = await app.nodes.connected(agent_pb2.Register(inventory=inventory("n1", gpus=2)), asyncio.Queue())
        victims = [await app.tasks.submit(_spec(f"low-{i}", 0, 1), f"r-{i}") for i in range(2)]
        for v in victims:
            await until(lambda v=v: app.tasks.get(v.id).state == TaskState.SCHEDULED)
            await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(task_id=v.id,
                                                                            state=int(TaskState.RUNNING)))
        await app.tasks.submit(_spec("urgent", 10, 2), "r-urgent")
        await until(lambda: all(app.tasks.get(v.id).state == TaskState.PREEMPTED for v in victims))
        stored = [app.store.get_task(v.id) for v in victims]
        assert all(t.state == TaskState.PREEMPTED and t.preemptions == 1 for t in stored)
        assert stored[0].revision == stored[1].revision

    asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario))
