"""A cancel that loses its compare-on-revision to a write already on its way to etcd (an agent's report of the
task's start, batched with others) decides again on the task as it now is, instead of failing the user's
``gptrmctl cancel`` with "task changed" (``TaskTable.cancel``). The leader is the coordinator's own object graph on a
real etcd, leading without its loops (the mirror test's ``ManualRole``)."""

from __future__ import annotations

import asyncio

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TaskState
from coordinator.app import build
from coordinator.config import CoordinatorConfig
from coordinator.etcd_embedded import EtcdCluster
from coordinator.sync import connect
from tests.helpers.mirror import GIB, GPU_MODEL, ManualRole


async def _cancel_after_a_write_memory_has_not_seen(endpoints: list[str], prefix: str) -> types_pb2.Task:
    client = connect(endpoints, 2.0)
    app = build(CoordinatorConfig(etcd_prefix=prefix, lease_ttl_s=10.0, task_grace_s=3600.0, lost_grace_s=3600.0,
                                  heartbeat_interval_s=600.0, metrics_listen=""), client)
    app.loop = asyncio.get_running_loop()
    app.leadership.start(ManualRole(app), app.loop)
    try:
        while not app.leadership.is_leader:
            await asyncio.sleep(0.02)
        inv = types_pb2.NodeInventory(
            node_id="n0", cpu_cores=8, mem_total_bytes=64 * GIB, disk_total_bytes=100 * GIB, task_port_min=30000,
            task_port_max=30099, gpus=[types_pb2.GpuInfo(index=0, model=GPU_MODEL, mem_total_bytes=80 * GIB,
                                                         uuid="n0-0")])
        await app.nodes.connected(agent_pb2.Register(inventory=inv), asyncio.Queue())
        spec = types_pb2.TaskSpec(name="t", argv=["true"], has_demand=True,
                                  demand=types_pb2.ResourceVector(gpus=1, cpu_cores=1, mem_bytes=GIB))
        task = await app.tasks.submit(spec, "cancel-race")
        assert await app.cycle.cycle() == 1
        await app.tasks.transition(task.id, TaskState.STARTING, "starting")
        running = await app.tasks.transition(task.id, TaskState.RUNNING, "started")
        # Another write lands in etcd first; memory has not followed it yet (its batch's answer is on its way).
        await asyncio.to_thread(app.store.update_task, task.id, running.revision, log_tail="a line")
        assert app.tasks.get(task.id).revision == running.revision
        return await app.tasks.cancel(task.id)
    finally:
        await app.leadership.resign()
        client.close()


def test_a_cancel_that_loses_its_compare_decides_again(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    cancelled = asyncio.run(_cancel_after_a_write_memory_has_not_seen(etcd_server.endpoints, etcd_prefix))
    assert cancelled.cancel_requested
    assert cancelled.state == TaskState.RUNNING   # stopping: the agent's final report ends it CANCELLED
    assert cancelled.log_tail == "a line"          # the write that won is kept
