"""A leading coordinator built in-process by ``coordinator.app.build`` on a real etcd, for integration tests
that play the agents' side through the app's own inputs (registrations, task statuses)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from common.pb.gptrm.v1 import admin_pb2_grpc, types_pb2
from coordinator.app import App, build
from coordinator.config import CoordinatorConfig
from coordinator.sync import connect

__all__ = ["GIB", "inventory", "one_gpu_spec", "run_leading", "until"]

GIB = 1024**3


def inventory(node_id: str, gpus: int = 4) -> types_pb2.NodeInventory:
    """An H100 node (4 GPUs by default) with plenty of host resources."""
    return types_pb2.NodeInventory(
        node_id=node_id, cpu_cores=64, mem_total_bytes=512 * GIB, disk_total_bytes=2000 * GIB,
        gpus=[types_pb2.GpuInfo(index=i, model="NVIDIA H100 80GB HBM3", mem_total_bytes=80 * GIB)
              for i in range(gpus)],
    )


def one_gpu_spec(name: str, policy: int = types_pb2.RESTART_POLICY_NEVER) -> types_pb2.TaskSpec:
    """A one-GPU training task with the given restart policy."""
    return types_pb2.TaskSpec(name=name, argv=["true"], kind=types_pb2.TASK_KIND_TRAINING, restart_policy=policy,
                              has_demand=True, demand=types_pb2.ResourceVector(gpus=1, cpu_cores=1))


async def until(check: Callable[[], Any], timeout_s: float = 15.0) -> None:
    """Wait until ``check()`` is true."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def run_leading(endpoints: list[str], prefix: str, scenario: Callable[[App], Awaitable[None]],
                      **cfg: Any) -> None:
    """Build the app (a long task grace, then ``cfg``), wait until it leads, run ``scenario``,
    then stop its background work and resign."""
    client = connect(endpoints, 2.0)
    settings: dict[str, Any] = {"task_grace_s": 3600.0, **cfg}
    app = build(CoordinatorConfig(etcd_prefix=prefix, **settings), client)
    background = app.start(asyncio.get_running_loop())
    try:
        await until(lambda: app.leadership.is_leader)
        await scenario(app)
    finally:
        for t in background:
            t.cancel()
        await app.leadership.resign()
        client.close()


@contextlib.asynccontextmanager
async def admin_stub(servicer: admin_pb2_grpc.AdminServicer) -> AsyncIterator[admin_pb2_grpc.AdminStub]:
    """``servicer`` served over real gRPC on a loopback port; yields a stub connected to it."""
    server = grpc.aio.server()
    admin_pb2_grpc.add_AdminServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield admin_pb2_grpc.AdminStub(channel)
    finally:
        await server.stop(None)
