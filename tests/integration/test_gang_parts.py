"""A multi-node task's parts on a leading replica (coordinator/dispatch/gang.py): real components from
``coordinator.app.build`` on the test session's etcd, the agents' side played by the reconciler's inputs and
the nodes' decision queues."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TaskState
from coordinator.app import App
from coordinator.etcd_embedded import EtcdCluster
from coordinator.monitor.nodes import NodeEntry
from tests.helpers.inproc import inventory, run_leading, until

Scenario = Callable[[App, list[NodeEntry], list[asyncio.Queue], str], Awaitable[None]]


def _run(etcd_server: EtcdCluster, etcd_prefix: str, scenario: Scenario, *,
         policy: int = types_pb2.RESTART_POLICY_NEVER, running: bool = True, **cfg: float) -> None:
    """A leading replica with two 4-GPU nodes and one 2-node gang placed on them (both parts RUNNING when
    ``running``)."""

    async def placed(app: App) -> None:
        queues: list[asyncio.Queue] = [asyncio.Queue(), asyncio.Queue()]
        entries = [await app.nodes.connected(agent_pb2.Register(inventory=inventory(n)), q)
                   for n, q in zip(("n1", "n2"), queues, strict=True)]
        gang = await app.tasks.submit(types_pb2.TaskSpec(
            name="gang", argv=["train"], kind=types_pb2.TASK_KIND_TRAINING, nodes=2, has_demand=True,
            restart_policy=policy, demand=types_pb2.ResourceVector(gpus=4, cpu_cores=1)), "r-1")
        await until(lambda: app.tasks.get(gang.id).state == TaskState.SCHEDULED)
        if running:
            for e in entries:
                await app.reconciler.on_task_status(e, status(gang.id, TaskState.RUNNING))
            assert app.tasks.get(gang.id).state == TaskState.RUNNING
        await scenario(app, entries, queues, gang.id)

    asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, placed, **cfg))


def status(task_id: str, state: TaskState, code: int | None = None) -> agent_pb2.TaskStatus:
    s = agent_pb2.TaskStatus(task_id=task_id, state=int(state), reason="exited" if code else "")
    if code is not None:
        s.exit_code, s.has_exit_code = code, True
    return s


def stops(queue: asyncio.Queue, task_id: str) -> int:
    """StopTask decisions for the task queued for a node (the queue is emptied)."""
    n = 0
    while not queue.empty():
        msg = queue.get_nowait()
        if msg is not None and msg.HasField("decision") and msg.decision.HasField("stop") \
                and msg.decision.stop.task_id == task_id:
            n += 1
    return n


def parts(app: App, task_id: str) -> dict[int, tuple[str, str, int | None]]:
    return {p.rank: (p.node_id, TaskState(p.state).label, p.exit_code if p.has_exit_code else None)
            for p in app.tasks.get(task_id).parts}


def failed_count(app: App, task_id: str) -> int:
    return [h.state for h in app.tasks.get(task_id).history].count(int(TaskState.FAILED))


class TestGangParts:
    def test_placed_gang_has_a_part_per_node_with_a_master_port(self, etcd_server: EtcdCluster,
                                                                etcd_prefix: str) -> None:
        """Placement records one SCHEDULED part per node in rank order and a master port on rank 0's node; the
        task is RUNNING only once both parts started."""

        async def scenario(app: App, entries: list[NodeEntry], queues: list[asyncio.Queue], tid: str) -> None:
            task = app.tasks.get(tid)
            assert [p.node_id for p in task.parts] == [na.node_id for na in task.allocation.nodes]
            assert {p.state for p in task.parts} == {int(TaskState.SCHEDULED)}
            assert 29500 <= task.allocation.master_port <= 29999
            rank0 = next(e for e in entries if e.node_id == task.parts[0].node_id)
            await app.reconciler.on_task_status(rank0, status(tid, TaskState.RUNNING))
            assert app.tasks.get(tid).state == TaskState.STARTING
            other = next(e for e in entries if e is not rank0)
            await app.reconciler.on_task_status(other, status(tid, TaskState.RUNNING))
            assert app.tasks.get(tid).state == TaskState.RUNNING
            assert {s for _, s, _ in parts(app, tid).values()} == {"running"}

        _run(etcd_server, etcd_prefix, scenario, running=False)

    def test_failed_part_stops_the_other_and_restarts_the_whole_gang_once(self, etcd_server: EtcdCluster,
                                                                          etcd_prefix: str) -> None:
        """n2's part exits 3: n1 is told to stop; the task stays RUNNING (holding both nodes) until n1's part
        ended, then fails once and its on-failure policy requeues the whole gang."""

        async def scenario(app: App, entries: list[NodeEntry], queues: list[asyncio.Queue], tid: str) -> None:
            for q in queues:
                stops(q, tid)
            await app.reconciler.on_task_status(entries[1], status(tid, TaskState.FAILED, 3))
            task = app.tasks.get(tid)
            assert task.state == TaskState.RUNNING and "stopping the other parts" in task.reason
            assert stops(queues[0], tid) == 1 and stops(queues[1], tid) == 0
            assert sorted(e.node_id for e in app.registry if tid in e.task_ids) == ["n1", "n2"]
            await app.reconciler.on_task_status(entries[1], status(tid, TaskState.FAILED, 3))   # re-delivered
            await app.reconciler.on_task_status(entries[0], status(tid, TaskState.CANCELLED, -15))
            task = app.tasks.get(tid)
            assert task.state == TaskState.PENDING and task.restarts == 1 and failed_count(app, tid) == 1
            failed = next(h for h in task.history if h.state == TaskState.FAILED)
            assert "exited" in failed.reason and "rank" in failed.reason
            assert not any(tid in e.task_ids for e in app.registry)

        _run(etcd_server, etcd_prefix, scenario, policy=types_pb2.RESTART_POLICY_ON_FAILURE)

    def test_a_lost_node_fails_the_gang_the_same_way(self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """n2 is lost past the grace: its part counts as failed, n1's part is stopped, and the task fails once
        n1 reported its part ended."""

        async def scenario(app: App, entries: list[NodeEntry], queues: list[asyncio.Queue], tid: str) -> None:
            stops(queues[0], tid)
            app.nodes.disconnected(entries[1], entries[1].stream_id)
            await until(lambda: any(p.state == TaskState.FAILED for p in app.tasks.get(tid).parts))
            task = app.tasks.get(tid)
            lost = next(p for p in task.parts if p.node_id == "n2")
            assert task.state == TaskState.RUNNING and "lost" in lost.reason
            await until(lambda: stops(queues[0], tid) >= 1)
            await app.reconciler.on_task_status(entries[0], status(tid, TaskState.CANCELLED, -15))
            task = app.tasks.get(tid)
            assert task.state == TaskState.FAILED and failed_count(app, tid) == 1 and "n2" in task.reason
            assert next(p for p in task.parts if p.node_id == "n1").state == TaskState.CANCELLED

        _run(etcd_server, etcd_prefix, scenario, lost_grace_s=0.2, lost_task_grace_s=0.3, lost_node_gc_s=0)

    def test_a_new_leader_stops_a_failing_gangs_part(self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """A part failed (recorded) but n1 re-registers still running its part: it is stopped, not started again."""

        async def scenario(app: App, entries: list[NodeEntry], queues: list[asyncio.Queue], tid: str) -> None:
            await app.reconciler.on_task_status(entries[1], status(tid, TaskState.FAILED, 1))
            stops(queues[0], tid)
            register = agent_pb2.Register(inventory=inventory("n1"), tasks=[status(tid, TaskState.RUNNING)])
            await app.reconciler.on_agent_registered(entries[0], register)
            assert stops(queues[0], tid) == 1
            assert app.tasks.get(tid).state == TaskState.RUNNING

        _run(etcd_server, etcd_prefix, scenario)

    def test_a_part_unreported_after_a_leader_change_fails_the_gang(self, etcd_server: EtcdCluster,
                                                                     etcd_prefix: str) -> None:
        """After a leader change n1 reports its part but n2 (connected) does not: n2's part is gone, so n1's is
        stopped and the task fails once; a part that never started is left to its re-sent start."""

        async def scenario(app: App, entries: list[NodeEntry], queues: list[asyncio.Queue], tid: str) -> None:
            stops(queues[0], tid)
            grace = asyncio.create_task(app.reconciler.reconcile_after_grace())
            await asyncio.sleep(0)   # the new leader's wait has begun: reports count from here
            await app.reconciler.on_task_status(entries[0], status(tid, TaskState.RUNNING))
            await grace
            task = app.tasks.get(tid)
            gone = next(p for p in task.parts if p.node_id == "n2")
            assert gone.state == TaskState.FAILED and "leader change" in gone.reason
            assert stops(queues[0], tid) == 1
            await app.reconciler.on_task_status(entries[0], status(tid, TaskState.CANCELLED, -15))
            assert app.tasks.get(tid).state == TaskState.FAILED and failed_count(app, tid) == 1

        _run(etcd_server, etcd_prefix, scenario, task_grace_s=0.3)
