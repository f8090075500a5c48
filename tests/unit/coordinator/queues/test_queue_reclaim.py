"""Reclaim: a queue owed GPUs within its quota preempts borrowers' newest preemptible tasks, just
enough, of the right model; never a task within its queue's quota or a non-preemptible one."""

from __future__ import annotations

from coordinator.queues import Demand, Queue, QueueConfig, QueueHolding, Victim, reclaim_victims

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"

CONFIG = QueueConfig(queues=(Queue("a", gpus={"*": 4}), Queue("b", gpus={"*": 4}), Queue("c")))


def task(task_id: str, queue: str, gpus: int, borrowed: int, start: float, preemptible: bool = True,
         model: str = H100) -> QueueHolding:
    return QueueHolding(task_id, queue, model, gpus, borrowed, preemptible, start)


def ids(victims: list[Victim]) -> list[str]:
    return [v.task_id for v in victims]


def test_newest_borrowing_tasks_go_first_just_enough() -> None:
    holdings = [task("b-own", "b", 4, 0, 1.0), task("b-old", "b", 1, 1, 2.0), task("b-new", "b", 1, 1, 3.0),
                task("c-1", "c", 2, 2, 2.5)]
    victims = reclaim_victims(CONFIG, holdings, [Demand("a", H100, 2)])
    # b-new (1) then c-1 (2) cover 2; c-1 alone still does, so b-new is let go
    assert ids(victims) == ["c-1"]
    assert ids(reclaim_victims(CONFIG, holdings, [Demand("a", H100, 1)])) == ["b-new"]
    assert ids(reclaim_victims(CONFIG, holdings, [Demand("a", H100, 3)])) == ["b-new", "c-1"]
    victim = reclaim_victims(CONFIG, holdings, [Demand("a", H100, 1)])[0]
    assert victim == Victim("b-new", "b", H100, 1, 1, "a")


def test_victims_not_needed_are_let_go() -> None:
    # newest frees 1, the next frees 4: the 4 alone cover a need of 4
    holdings = [task("small", "c", 1, 1, 9.0), task("big", "c", 4, 4, 5.0)]
    assert ids(reclaim_victims(CONFIG, holdings, [Demand("a", H100, 4)])) == ["big"]


def test_tasks_within_quota_and_non_preemptible_ones_are_never_victims() -> None:
    holdings = [task("b-own", "b", 4, 0, 9.0), task("c-pinned", "c", 4, 4, 8.0, preemptible=False)]
    assert reclaim_victims(CONFIG, holdings, [Demand("a", H100, 2)]) == []


def test_nothing_is_preempted_when_it_cannot_cover_the_need() -> None:
    holdings = [task("c-1", "c", 1, 1, 1.0)]
    assert reclaim_victims(CONFIG, holdings, [Demand("a", H100, 2)]) == []


def test_only_a_queue_owed_within_its_quota_or_under_it_reclaims() -> None:
    holdings = [task("a-own", "a", 4, 0, 1.0), task("c-1", "c", 2, 2, 2.0)]
    assert reclaim_victims(CONFIG, holdings, [Demand("a", H100, 1)]) == []      # at its quota 4: it would borrow
    holdings = [task("a-own", "a", 3, 0, 1.0), task("c-1", "c", 2, 2, 2.0)]
    assert ids(reclaim_victims(CONFIG, holdings, [Demand("a", H100, 1)])) == ["c-1"]
    assert reclaim_victims(CONFIG, holdings, [Demand("c", H100, 1)]) == []      # c has no quota


def test_a_queue_under_its_quota_claims_its_whole_task_from_queues_over_theirs() -> None:
    """A task larger than what is left of its queue's quota (3 of 4 held, 2 asked) takes GPUs only from queues
    that stay at or above their quota: c (quota 0) gives its 2; b's own 4 and a b task whose preemption would
    leave b under its quota are never taken."""
    holdings = [task("a-own", "a", 3, 0, 1.0), task("c-1", "c", 2, 2, 2.0)]
    assert reclaim_victims(CONFIG, holdings, [Demand("a", H100, 2)]) == [Victim("c-1", "c", H100, 2, 2, "a")]
    holdings = [task("a-own", "a", 3, 0, 1.0), task("b-own", "b", 3, 0, 1.0), task("b-new", "b", 2, 1, 2.0)]
    assert reclaim_victims(CONFIG, holdings, [Demand("a", H100, 2)]) == []      # b would drop to 3 of its 4
    # an owed claim comes first: b (2 of 4 held) is owed 2, a's larger task gets nothing of the 2 c lends
    holdings = [task("a-own", "a", 3, 0, 1.0), task("b-own", "b", 2, 0, 1.0), task("c-1", "c", 2, 2, 2.0)]
    assert ids(reclaim_victims(CONFIG, holdings, [Demand("a", H100, 2), Demand("b", H100, 2)])) == ["c-1"]
    assert reclaim_victims(CONFIG, holdings, [Demand("a", H100, 2), Demand("b", H100, 2)])[0].for_queue == "b"


def test_free_gpus_are_used_before_preempting() -> None:
    holdings = [task("c-1", "c", 2, 2, 1.0), task("c-2", "c", 2, 2, 2.0)]
    assert reclaim_victims(CONFIG, holdings, [Demand("a", H100, 2)], free={H100: 2}) == []
    assert ids(reclaim_victims(CONFIG, holdings, [Demand("a", H100, 3)], free={H100: 2})) == ["c-2"]
    assert ids(reclaim_victims(CONFIG, holdings, [Demand("a", H100, 2)], free={A100: 2})) == ["c-2"]


def test_the_right_model_is_reclaimed() -> None:
    holdings = [task("c-a100", "c", 2, 2, 9.0, model=A100), task("c-h100", "c", 2, 2, 1.0)]
    assert ids(reclaim_victims(CONFIG, holdings, [Demand("a", H100, 2)])) == ["c-h100"]
    assert ids(reclaim_victims(CONFIG, holdings, [Demand("a", A100, 2)])) == ["c-a100"]
    # any model: the model needing the fewest preempted GPUs, ties by model name
    assert ids(reclaim_victims(CONFIG, holdings, [Demand("a", "*", 2)])) == ["c-a100"]
    assert reclaim_victims(CONFIG, holdings, [Demand("a", "*", 2)], free={H100: 2}) == []


def test_several_demands_share_the_victims_and_what_they_free() -> None:
    holdings = [task("c-1", "c", 4, 4, 1.0), task("c-2", "c", 2, 2, 2.0)]
    victims = reclaim_victims(CONFIG, holdings, [Demand("a", H100, 3), Demand("b", H100, 1), Demand("b", H100, 2)])
    # a: c-2 (2) is not enough, so c-2 then c-1 and c-2 is let go -> c-1 frees 4: 3 for a, 1 spare for b;
    # b's second demand needs 2 more: c-2
    assert ids(victims) == ["c-1", "c-2"]
    assert [v.for_queue for v in victims] == ["a", "b"]


def test_a_queue_does_not_reclaim_from_itself() -> None:
    holdings = [task("a-b", "a", 6, 2, 5.0)]
    assert reclaim_victims(CONFIG, holdings, [Demand("a", H100, 0)]) == []
    config = QueueConfig(queues=(Queue("a", gpus={"*": 8}),))
    assert reclaim_victims(config, [task("a-1", "a", 2, 2, 1.0)], [Demand("a", H100, 2)]) == []


def test_without_queues_nothing_is_reclaimed() -> None:
    assert reclaim_victims(QueueConfig(), [task("t", "default", 2, 2, 1.0)], [Demand("default", H100, 2)]) == []


def test_unknown_queues_in_waiting_are_skipped() -> None:
    assert reclaim_victims(CONFIG, [task("c-1", "c", 2, 2, 1.0)], [Demand("zz", H100, 2)]) == []


def test_a_parents_remainder_is_reclaimed_for_its_children_from_outside_only() -> None:
    config = QueueConfig(queues=(
        Queue("org", gpus={"*": 8}),
        Queue("a", parent="org", gpus={"*": 2}),
        Queue("b", parent="org", gpus={"*": 2}),
        Queue("out", gpus={"*": 2}),
    ))
    holdings = [task("a-own", "a", 2, 0, 1.0), task("b-new", "b", 2, 2, 9.0), task("out-1", "out", 4, 2, 5.0)]
    # a is at its quota; org's subtree holds 4 of its 8: a is owed 2 within org, from outside org only
    assert ids(reclaim_victims(config, holdings, [Demand("a", H100, 2)])) == ["out-1"]
    # 5 more would pass org's quota: owed nowhere
    assert reclaim_victims(config, holdings, [Demand("a", H100, 5)]) == []
    # within a's own quota the claim covers every other queue, siblings included (newest first)
    holdings = [task("b-new", "b", 2, 2, 9.0), task("out-1", "out", 4, 2, 5.0)]
    assert ids(reclaim_victims(config, holdings, [Demand("a", H100, 2)])) == ["b-new"]
