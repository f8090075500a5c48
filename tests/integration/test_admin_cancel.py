"""Admin calls whose caller goes away (a client deadline of a few milliseconds) leave nothing behind: no etcd
admin lock held, no queue tree in etcd that the leader's state does not follow (coordinator/sync/lock.py
``AdminLocks``, coordinator/queues/admin.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import grpc
import pytest

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.api.admin import AdminService
from coordinator.app import App
from coordinator.etcd_embedded import EtcdCluster
from coordinator.queues import Queue
from coordinator.sync import Keys, connect
from coordinator.sync.queues import QueueStore
from tests.helpers.inproc import admin_stub, one_gpu_spec, run_leading
from tests.integration.harness import Cluster, wait_until

DEADLINES_S = (0.001, 0.002, 0.005, 0.005, 0.01)
"""The deadlines of the calls cut short (the probe's 1-10 ms)."""


class TestCancelledAdminCalls:
    def test_a_call_cut_short_leaves_no_lock_held(self, cluster: Cluster) -> None:
        """SetQueue, SetPolicy and CordonNode each sent several times with a deadline of a few milliseconds,
        then once normally: the normal call succeeds (its lock was given back when the cut-short calls ended)."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        admin = cluster.admin("c1")
        wait_until(lambda: any(n.record.inventory.node_id == "n1"
                               for n in admin.ListNodes(admin_pb2.ListNodesRequest(), timeout=5).nodes),
                   30, 0.1, "n1 to register")
        calls: dict[str, Callable[[int, float], object]] = {
            "SetQueue": lambda i, t: admin.SetQueue(admin_pb2.SetQueueRequest(queue=admin_pb2.Queue(
                name=f"q{i}", members=["*"], quotas=[admin_pb2.QueueQuota(gpus=1)])), timeout=t),
            "SetPolicy": lambda i, t: admin.SetPolicy(types_pb2.Policy(
                name=("load-balancing", "max-utilization")[i % 2], threshold=0.8), timeout=t),
            "CordonNode": lambda i, t: admin.CordonNode(admin_pb2.NodeRef(node_id="n1"), timeout=t),
        }
        for method, call in calls.items():
            for i, deadline in enumerate(DEADLINES_S):
                with contextlib.suppress(grpc.RpcError):   # cut short, or quick enough to answer
                    call(i, deadline)
            try:
                call(len(DEADLINES_S), 30.0)
            except grpc.RpcError as e:
                pytest.fail(f"{method} after calls cut short: {e.code().name} {e.details()}")
        view = admin.GetNode(admin_pb2.GetNodeRequest(node_id="n1"), timeout=5)
        assert view.record.cordoned


class TestCancelledQueueChange:
    def test_cancelled_at_any_point_etcd_and_the_leader_agree(self, etcd_server: EtcdCluster,
                                                              etcd_prefix: str) -> None:
        """A queue change cancelled at every point from its start to its end: afterwards etcd's tree and revision
        are the leader's, the ``queues`` lock is free, and the next change succeeds."""
        asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix,
                                lambda app: self._cancel_everywhere(app, etcd_server.endpoints), lock_timeout_s=5.0))

    async def _cancel_everywhere(self, app: App, endpoints: list[str]) -> None:
        client = connect(endpoints, 2.0)
        stored_tree = QueueStore(client, Keys(app.cfg.etcd_prefix), app.leadership.election)
        try:
            # How long one change takes here, so that the cancellations fall before, inside and after its
            # lock, its write and its application.
            loop = asyncio.get_running_loop()
            started = loop.time()
            await app.queue_admin.set(Queue("q0", gpus={"*": 1}, members=("*",)))
            took = loop.time() - started
            completed = 0
            for i in range(1, 25):
                change = asyncio.create_task(app.queue_admin.set(Queue(f"q{i}", gpus={"*": 1}, members=("*",))))
                await asyncio.sleep(took * (i % 12) / 10)
                change.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await change
                    completed += 1
                stored = await asyncio.to_thread(stored_tree.get)
                assert (stored.revision, stored.config.names) == (app.state.queues_revision,
                                                                  app.state.queues.names), f"cancelled change {i}"
                assert await asyncio.to_thread(client.get, Keys(app.cfg.etcd_prefix).lock("queues")) is None
            await app.queue_admin.set(Queue("last", gpus={"*": 1}, members=("*",)))
            assert "last" in app.state.queues.names
        finally:
            client.close()


class TestCancelledWrites:
    def test_cut_short_submits_and_cancels_leave_etcd_and_the_leader_equal(self, etcd_server: EtcdCluster,
                                                                            etcd_prefix: str) -> None:
        """SubmitTask and CancelTask over gRPC with deadlines of a few milliseconds: every task etcd stores is in the
        leader's memory at the same revision (a leader-only call runs to its end once begun)."""
        asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, self._cut_short))

    async def _cut_short(self, app: App) -> None:
        async with admin_stub(AdminService(app)) as stub:
            for i, deadline in enumerate(DEADLINES_S * 2):
                submit = admin_pb2.SubmitTaskRequest(spec=one_gpu_spec(f"t{i}"), request_id=f"r-{i}",
                                                     queue_unplaceable=True)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.SubmitTask(submit, timeout=deadline)
                task = await stub.SubmitTask(submit, timeout=30)   # the same request: the same task
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.CancelTask(admin_pb2.TaskRef(task_id=task.id), timeout=deadline)

            def memory() -> dict[str, tuple[int, int]]:
                return {t.id: (t.revision, t.state) for t in app.state.tasks.values()}

            async def stored() -> dict[str, tuple[int, int]]:
                return {t.id: (t.revision, t.state) for t in await asyncio.to_thread(app.store.list_tasks)}

            # The calls cut short may still be running: wait until none is, then compare.
            deadline_s = asyncio.get_running_loop().time() + 30
            while memory() != await stored() and asyncio.get_running_loop().time() < deadline_s:
                await asyncio.sleep(0.1)
            assert memory() == await stored()
