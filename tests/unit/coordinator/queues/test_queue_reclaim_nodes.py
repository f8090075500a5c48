"""Reclaim node by node: a task that needs whole nodes' worth of GPUs gets victims on the nodes that can be freed."""

from __future__ import annotations

from coordinator.queues import Demand, Queue, QueueConfig, QueueHolding, reclaim_victims

TWO = QueueConfig(queues=(Queue("a", gpus={"*": 8}, members=("*",)), Queue("b", gpus={"*": 8}, members=("*",))))


def _task(task_id: str, queue: str, node: str, gpus: int, start: float, borrowed: int) -> QueueHolding:
    return QueueHolding(task_id, queue, "H100", gpus, borrowed, True, start, nodes={node: gpus})


def test_the_victims_free_one_whole_node_not_gpus_scattered_over_two() -> None:
    """b's own 8 GPUs are on n0; it borrows 16 more as 2-GPU tasks alternating between n1 and n2. Counting
    GPUs only, the four newest free 4 + 4 GPUs on two nodes, which no 8-GPU task can use; node by node, the
    four on one node are chosen."""
    holdings = [_task(f"own{i}", "b", "n0", 1, float(i), 0) for i in range(8)]            # b's quota, on n0
    holdings += [_task(f"x{i}", "b", "n1" if i % 2 else "n2", 2, 10.0 + i, 2) for i in range(8)]  # borrowed
    free = {"n0": ("H100", 0), "n1": ("H100", 0), "n2": ("H100", 0)}
    owed = Demand("a", "*", 8, per_node=8, node_count=1)
    victims = reclaim_victims(TWO, holdings, [owed], free_by_node=free)
    nodes = {node for h in holdings if h.task_id in {v.task_id for v in victims} for node in h.nodes}
    assert len(victims) == 4 and len(nodes) == 1 and nodes <= {"n1", "n2"}
    assert all(v.for_queue == "a" and v.task_id.startswith("x") for v in victims)
    scattered = reclaim_victims(TWO, holdings, [Demand("a", "*", 8)])       # GPUs only: the 4 newest
    assert {v.task_id for v in scattered} == {"x4", "x5", "x6", "x7"}


def test_free_gpus_on_a_node_count_first_and_a_gang_needs_every_node() -> None:
    holdings = [_task("b1", "b", "n1", 4, 1.0, 4), _task("b2", "b", "n2", 8, 2.0, 8)]
    free = {"n1": ("H100", 4), "n2": ("H100", 0)}
    victims = reclaim_victims(TWO, holdings, [Demand("a", "*", 8, per_node=8)], free_by_node=free)
    assert [v.task_id for v in victims] == ["b1"]                    # n1: 4 free + b1's 4 is the cheapest
    gang = reclaim_victims(TWO, holdings, [Demand("a", "*", 16, per_node=8, node_count=2)], free_by_node=free)
    assert gang == []                                               # a's quota is 8: 16 is not owed
    big = QueueConfig(queues=(Queue("a", gpus={"*": 16}, members=("*",)), Queue("b", gpus={"*": 0}, members=("*",))))
    gang = reclaim_victims(big, holdings, [Demand("a", "*", 16, per_node=8, node_count=2)], free_by_node=free)
    assert sorted(v.task_id for v in gang) == ["b1", "b2"]
    three = reclaim_victims(big, holdings, [Demand("a", "*", 16, per_node=8, node_count=3)], free_by_node=free)
    assert three == []                                              # only two nodes: nothing in vain


def test_a_node_holding_what_is_within_quota_cannot_be_freed() -> None:
    holdings = [_task("mine", "b", "n1", 4, 1.0, 0), _task("lent", "b", "n1", 4, 2.0, 4),
                _task("far", "b", "n2", 8, 0.5, 8)]
    free = {"n1": ("H100", 0), "n2": ("H100", 0)}
    victims = reclaim_victims(TWO, holdings, [Demand("a", "*", 8, per_node=8)], free_by_node=free)
    assert [v.task_id for v in victims] == ["far"]                  # n1 keeps b's own 4 GPUs
