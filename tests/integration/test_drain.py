"""Drain and policy changes on a leading replica (coordinator/nodes.py, coordinator/scheduler/policy.py):
real components from ``coordinator.app.build`` on the test session's etcd, the agent's side played by
the node's decision queue and the reconciler."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from common.errors import CoordinationError
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import NodeState, TaskState
from coordinator.app import App
from coordinator.etcd_embedded import EtcdCluster
from coordinator.sync import Keys, Lock, connect
from tests.helpers.inproc import inventory, one_gpu_spec, run_leading, until


def spec(name: str) -> types_pb2.TaskSpec:
    """A one-GPU task."""
    return one_gpu_spec(name)


Scenario = Callable[[App], Awaitable[None]]


@pytest.fixture
def lead(etcd_server: EtcdCluster, etcd_prefix: str) -> Callable[[Scenario], None]:
    """Runs a scenario on a replica that leads (its own event loop; drain and policy locks wait 0.5 s)."""
    return lambda scenario: asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario,
                                                    lock_timeout_s=0.5))


def drain_queue(queue: asyncio.Queue) -> list[agent_pb2.CoordinatorMessage]:
    """Everything the coordinator sent the node so far."""
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


class TestDrain:
    def test_unstarted_tasks_move_and_running_ones_finish(self, lead: Callable[[Scenario], None]) -> None:
        """Drain cordons, requeues a placed-but-unstarted task, lets a running one finish, then reports drained."""
        lead(self._unstarted_move)

    async def _unstarted_move(self, app: App) -> None:
        outbox: asyncio.Queue = asyncio.Queue()
        entry = await app.nodes.connected(agent_pb2.Register(inventory=inventory("n1")), outbox)
        first = await app.tasks.submit(spec("runs"), "r-1")
        second = await app.tasks.submit(spec("waits"), "r-2")
        await until(lambda: all(app.tasks.get(t.id).state == TaskState.SCHEDULED for t in (first, second)))
        await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(task_id=first.id, state=int(TaskState.RUNNING)))
        assert app.tasks.get(first.id).state == TaskState.RUNNING
        drain_queue(outbox)

        await app.nodes.set_admin_state("n1", cordoned=True, draining=True)

        assert entry.state == NodeState.DRAINING
        moved = app.tasks.get(second.id)
        assert moved.state == TaskState.PENDING and "drained" in moved.reason
        assert [h.state for h in moved.history][-2:] == [TaskState.PREEMPTED, TaskState.PENDING]
        assert not moved.allocation.nodes and second.id not in entry.task_ids
        stops = [m.decision.stop.task_id for m in drain_queue(outbox) if m.decision.HasField("stop")]
        assert stops == [second.id]
        assert app.tasks.get(first.id).state == TaskState.RUNNING     # running work runs to completion
        assert await app.cycle.cycle() == 0                             # nothing lands on a draining node

        await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(
            task_id=first.id, state=int(TaskState.SUCCEEDED), has_exit_code=True, exit_code=0))
        await until(lambda: any("drained" in e.message for e in app.events.recent(50)), timeout_s=5.0)
        record = await asyncio.to_thread(app.store.list_nodes)
        assert record[0].draining and record[0].cordoned

    def test_drain_waits_for_its_lock(self, lead: Callable[[Scenario], None], etcd_server: EtcdCluster,
                                      etcd_prefix: str) -> None:
        """While someone else holds the drain lock, a drain is refused after the lock timeout and changes nothing."""
        lead(lambda app: self._lock_held(app, etcd_server, etcd_prefix))

    async def _lock_held(self, app: App, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        await app.nodes.connected(agent_pb2.Register(inventory=inventory("n1")), asyncio.Queue())
        client = connect(etcd_server.endpoints, 2.0)
        other = Lock(client, Keys(etcd_prefix), "drain", holder="someone-else")
        await asyncio.to_thread(other.acquire, 5.0)
        try:
            with pytest.raises(CoordinationError, match="not acquired"):
                await app.nodes.set_admin_state("n1", cordoned=True)
            assert not app.registry.get("n1").record.cordoned
        finally:
            await asyncio.to_thread(other.release)
            client.close()
        await app.nodes.set_admin_state("n1", cordoned=True)
        assert app.registry.get("n1").record.cordoned


class TestPolicyChange:
    def test_policy_change_is_persisted_under_its_lock(self, lead: Callable[[Scenario], None],
                                                       etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """A policy change waits for the policy lock (0.5 s here, then refused), and reaches etcd once it is free."""
        lead(lambda app: self._policy(app, etcd_server, etcd_prefix))

    async def _policy(self, app: App, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        client = connect(etcd_server.endpoints, 2.0)
        other = Lock(client, Keys(etcd_prefix), "policy", holder="someone-else")
        await asyncio.to_thread(other.acquire, 5.0)
        wanted = types_pb2.Policy(name="power-efficient", threshold=0.8)
        with pytest.raises(CoordinationError, match="not acquired"):
            await app.policy.set(wanted)
        assert app.policy.current.name != "power-efficient"
        await asyncio.to_thread(other.release)
        await app.policy.set(wanted)
        client.close()
        assert app.policy.current.name == "power-efficient"
        stored = await asyncio.to_thread(app.store.load_all)
        assert stored.policy is not None and stored.policy.name == "power-efficient"
