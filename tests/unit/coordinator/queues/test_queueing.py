"""The scheduler's use of the queues: plan_queues and reclaim_for over plain values, and the leader's inputs."""

from __future__ import annotations

import pytest

from common.pb.gptrm.v1 import types_pb2
from common.pbenum import pb_enum
from common.types import TaskState
from coordinator.monitor.nodes import NodeRegistry
from coordinator.queues import Budget, BudgetState, Queue, QueueConfig, QueueHolding, UsageDecay
from coordinator.queues.planning import LeaderQueues, QueuedTask, plan_queues, queued, reclaim_for
from coordinator.state import LeaderState

TWO = QueueConfig(queues=(Queue("a", gpus={"*": 4}, members=("*",)), Queue("b", gpus={"*": 4}, members=("*",))))
CAPACITY = {"H100": 8}


def _held(task_id: str, queue: str, gpus: int, start: float, borrowed: int = 0) -> QueueHolding:
    return QueueHolding(task_id, queue, "H100", gpus, borrowed, True, start)


def test_without_queues_everything_is_admitted_in_the_order_given() -> None:
    pending = [QueuedTask("t2", "default", 8), QueuedTask("t1", "default", 1)]
    plan = plan_queues(QueueConfig(), pending, [], CAPACITY, UsageDecay(3600), 0.0)
    assert plan.order == ["t2", "t1"] and not plan.refused and not plan.admissions


def test_queues_interleave_by_share_and_borrowing_is_recorded() -> None:
    """b holds 4, a nothing: a's tasks come first; b's next task borrows what a lends; a task past what
    can be borrowed waits with the numbers."""
    pending = [QueuedTask("b1", "b", 2), QueuedTask("b2", "b", 3), QueuedTask("a1", "a", 1)]
    holdings = [_held("r1", "b", 4, 1.0)]
    plan = plan_queues(TWO, pending, holdings, CAPACITY, UsageDecay(3600), 10.0)
    assert plan.order == ["a1", "b1"]
    assert plan.admissions["a1"].borrowed == 0 and plan.admissions["b1"].borrowed == 2
    assert "b2" in plan.refused and plan.refused["b2"].startswith("Queue b ")


def test_unknown_queues_and_budget_gates() -> None:
    pending = [QueuedTask("x", "gone", 1), QueuedTask("a1", "a", 1), QueuedTask("b1", "b", 1)]
    plan = plan_queues(TWO, pending, [], CAPACITY, UsageDecay(3600), 0.0, gates={"a": "hold"})
    assert "does not exist" in plan.refused["x"] and "past its budget" in plan.refused["a1"]
    assert plan.order == ["b1"]
    plan = plan_queues(TWO, pending[1:], [], CAPACITY, UsageDecay(3600), 0.0, gates={"a": "lowest"})
    assert plan.order == ["b1", "a1"]                     # a's work goes after everyone else's


def test_reclaim_takes_the_newest_borrowers_and_counts_stopping_ones_as_free() -> None:
    holdings = [_held("old", "b", 4, 1.0), _held("new1", "b", 1, 2.0, 1), _held("new2", "b", 1, 3.0, 1)]
    victims = reclaim_for(TWO, [QueuedTask("a1", "a", 1)], holdings)
    assert [v.task_id for v in victims] == ["new2"] and victims[0].for_queue == "a"
    assert reclaim_for(TWO, [QueuedTask("a1", "a", 1)], holdings[:2], stopping=[holdings[2]]) == []
    assert reclaim_for(QueueConfig(), [QueuedTask("a1", "default", 1)], holdings) == []


def _task(task_id: str, queue: str, state: TaskState, gpus: list[int], created: float) -> types_pb2.Task:
    task = types_pb2.Task(id=task_id, queue=queue, state=pb_enum(types_pb2.TaskState, state))
    task.demand.gpus = max(1, len(gpus))
    if gpus:
        task.allocation.created_unix_s = created
        task.allocation.nodes.add(node_id="n1", gpu_indices=gpus)
    return task


def test_the_leader_builds_holdings_capacity_and_gates_from_its_state() -> None:
    registry = NodeRegistry(1.0, 30.0)
    rec = types_pb2.NodeRecord()
    rec.inventory.node_id = "n1"
    for i in range(8):
        rec.inventory.gpus.add(index=i, model="H100")
    state = LeaderState(registry)
    state.adopt({}, {"n1": rec})
    state.apply_queues(TWO, 1)
    for t in (_task("r", "b", TaskState.RUNNING, [0, 1], 1.0), _task("s", "b", TaskState.STARTING, [2], 2.0),
              _task("p", "b", TaskState.PREEMPTED, [3], 0.5), _task("w", "a", TaskState.PENDING, [], 0.0)):
        state.apply_task(t)
    clock = [100.0]
    queues = LeaderQueues(state, registry, clock=lambda: clock[0])
    held, stopping = queues.holdings()
    assert sorted(h.task_id for h in held) == ["r", "s"] and [h.task_id for h in stopping] == ["p"]
    assert {h.gpu_model for h in held} == {"H100"} and queues.capacity() == {"H100": 8}
    assert queued(state.tasks["w"]) == QueuedTask("w", "a", 1, per_node=1, node_count=1)
    queues.accrue()
    clock[0] += 10.0
    queues.accrue()
    assert queues.decay.at("b", clock[0]).gpu_s > 0 and queues.decay.at("a", clock[0]).gpu_s == 0
    queues.budgets = {"a": BudgetState(1.2, 0.0)}
    pending = [queued(state.tasks["w"])]
    assert queues.gates(pending) == {}                   # a has no budget configured
    lowest = Budget("gpu_hours", 1.0, "day", "lowest")
    state.apply_queues(QueueConfig(queues=(Queue("a", gpus={"*": 4}, members=("*",), budget=lowest),
                                           TWO.queues[1])), 2)
    assert queues.gates(pending) == {"a": "lowest"}     # nobody else waits
    assert queues.gates([*pending, QueuedTask("x", "b", 1)]) == {"a": "hold"}


def test_a_new_leader_rebuilds_decayed_usage_from_the_ledger() -> None:
    """QueueAdmin.restore_decay: each stored hour's GPU-seconds enter the decay at the hour's middle, and
    accrual continues from where the ledger is accounted."""
    import asyncio

    from coordinator.queues.admin import QueueAdmin
    from coordinator.usage.ledger import RowKey, Usage

    now = 10 * 3600.0 + 600.0
    hours = {9 * 3600: {RowKey("a", "alice", "H100"): Usage(gpu_s=3600.0)},
             8 * 3600: {RowKey("b", "bob", "H100"): Usage(gpu_s=7200.0), RowKey("", "x", "H100"): Usage(gpu_s=1.0)}}

    class Ledger:
        async def report(self, since: float, until: float, at: float) -> tuple[dict, float]:
            assert since == now - 8 * 3600.0 and until == at == now    # 8 half-lives of 1 h
            return hours, now - 5.0

    registry = NodeRegistry(1.0, 30.0)
    state = LeaderState(registry)
    state.apply_queues(QueueConfig(queues=TWO.queues, half_life_h=1.0), 1)
    queues = LeaderQueues(state, registry, clock=lambda: now)
    admin = QueueAdmin(None, None, None, state, queues, Ledger(), None, None)  # type: ignore[arg-type]
    asyncio.run(admin.restore_decay())
    a, b = queues.decay.at("a", now).gpu_s, queues.decay.at("b", now).gpu_s
    assert a == pytest.approx(3600.0 * 0.5 ** ((now - 9.5 * 3600) / 3600))
    assert b == pytest.approx(7200.0 * 0.5 ** ((now - 8.5 * 3600) / 3600))
    assert queues.decay.at("default", now).gpu_s > 0


def test_idle_gpus_are_those_work_may_get() -> None:
    """Free GPUs of a ready node and of a powered-off one count as idle; a cordoned node's do not, so a
    cordon never stops a reclaim."""
    registry = NodeRegistry(1.0, 30.0)
    state = LeaderState(registry)
    for node_id in ("ready", "cordoned", "off"):
        inv = types_pb2.NodeInventory(node_id=node_id)
        for i in range(4):
            inv.gpus.add(index=i, model="H100")
        registry.connect(inv, outbox=None)  # type: ignore[arg-type]
    for node_id, change in (("cordoned", "cordoned"), ("off", "power_state")):
        entry = registry.get(node_id)
        assert entry is not None
        record = types_pb2.NodeRecord()
        record.CopyFrom(entry.record)
        if change == "cordoned":
            record.cordoned = True
        else:
            record.power_state = types_pb2.NODE_POWER_STATE_OFF
        state.apply_node(record)
    state.apply_placement(_task("r", "b", TaskState.RUNNING, [0, 1], 1.0))   # on "n1": not a node here
    placed = _task("q", "b", TaskState.RUNNING, [], 1.0)
    placed.allocation.nodes.add(node_id="ready", gpu_indices=[0, 1, 2], gpu_share=1.0,
                                demand=types_pb2.ResourceVector(gpus=3))
    state.apply_placement(placed)
    assert LeaderQueues(state, registry).idle_by_node() == {"ready": ("H100", 1), "off": ("H100", 4)}
