"""plan_queues: a demand refused once in a cycle is refused again without asking admission, and the plan
equals asking admission for every task. reclaim_for: idle GPUs count as free."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

import pytest

from coordinator.queues import (
    Demand,
    Pending,
    Queue,
    QueueConfig,
    QueueHolding,
    UsageDecay,
    admit,
    order_pending,
    planning,
    queue_use,
    rebalance,
)
from coordinator.queues.admission import Held, QueueUse
from coordinator.queues.planning import QueuedTask, QueueRoom, plan_queues, reclaim_for, shrink_needed

CONFIG = QueueConfig(queues=(
    Queue(name="org", gpus={"*": 10}, limit={"*": 14}),
    Queue(name="a", parent="org", gpus={"*": 6}, limit={"*": 9}, cpu=40),
    Queue(name="b", parent="org", gpus={"*": 4}, lend={"*": 2}),
    Queue(name="c", gpus={"*": 4}, weight=2.0),
    Queue(name="d", gpus={"*": 2}, limit={"*": 2}),
))
CAPACITY = {"TEST-GPU": 20}


def reference(pending: Sequence[QueuedTask], holdings: Sequence[QueueHolding], decay: UsageDecay,
              now: float) -> tuple[list[str], dict[str, tuple[bool, int]], set[str]]:
    """The plan with admission asked for every task in fair order (no refusal reuse): tasks within their
    queue's quota in a first round, borrowing ones in a second."""
    use = dict(queue_use(rebalance(CONFIG, holdings)))
    order = order_pending(CONFIG, [Pending(t.task_id, t.queue, t.gpus, t.cpu) for t in pending], use, decay,
                          CAPACITY, now)
    by_id = {t.task_id: t for t in pending}
    decisions: dict[str, tuple[bool, int]] = {}
    refused: set[str] = set()

    def take(t: QueuedTask, borrowed: int, pool: str) -> None:
        old = use.get(t.queue, QueueUse())
        gpus = dict(old.gpus)
        gpus[pool] = gpus.get(pool, Held()) + Held(t.gpus - borrowed, borrowed)
        use[t.queue] = QueueUse(gpus=gpus, cpu=old.cpu + t.cpu, mem_gib=old.mem_gib + t.mem_gib)
        decisions[t.task_id] = (True, borrowed)

    ahead: list[str] = []
    later: list[str] = []
    for task_id in order:                                   # within quota first
        t = by_id[task_id]
        d = admit(CONFIG, use, CAPACITY, Demand(t.queue, t.gpu_model, t.gpus, t.cpu, t.mem_gib))
        if not d.admit:
            refused.add(task_id)
        elif d.borrowed:
            under = use.get(t.queue, QueueUse()).held_in(CONFIG, d.pool).total < CONFIG.get(t.queue).quota_in(d.pool)
            (ahead if under else later).append(task_id)
        else:
            take(t, 0, d.pool)
    for task_id in ahead + later:                           # then borrowing: queues under their quota first
        t = by_id[task_id]
        d = admit(CONFIG, use, CAPACITY, Demand(t.queue, t.gpu_model, t.gpus, t.cpu, t.mem_gib))
        if d.admit:
            take(t, d.borrowed, d.pool)
        else:
            refused.add(task_id)
    admitted = [task_id for task_id in order if task_id in decisions]
    return admitted, decisions, refused


@pytest.mark.parametrize("seed", range(40))
def test_plan_equals_admission_asked_for_every_task(seed: int) -> None:
    """Random backlogs of a few repeated shapes over a tree with limits, lending caps and a core cap."""
    rng = random.Random(seed)
    queues = ["a", "b", "c", "d"]
    holdings = [QueueHolding(f"h{i}", rng.choice(queues), "TEST-GPU", rng.choice([1, 2, 4]), 0, True, float(i),
                             cpu=rng.choice([0.0, 4.0])) for i in range(rng.randrange(0, 8))]
    pending = [QueuedTask(f"t{i}", rng.choice(queues), rng.choice([1, 1, 2, 4, 8]), rng.choice([0.0, 4.0, 16.0]))
               for i in range(rng.randrange(1, 60))]
    decay = UsageDecay.for_config(CONFIG)
    decay.add("a", 0.0, gpu_s=rng.uniform(0, 1e5))
    plan = plan_queues(CONFIG, pending, holdings, CAPACITY, decay, 100.0)
    order, decisions, refused = reference(pending, holdings, decay, 100.0)
    assert plan.order == order
    assert {t: (a.admit, a.borrowed) for t, a in plan.admissions.items()} == decisions
    assert set(plan.refused) == refused


def test_a_refused_demand_is_decided_once_per_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Queue d (limit 2) with ten identical 2-GPU tasks while it holds 2: one admission call, ten refusals."""
    calls: list[Demand] = []

    def counting(*args: object) -> object:
        calls.append(args[3])  # type: ignore[arg-type]
        return admit(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(planning, "admit", counting)
    holdings = [QueueHolding("h", "d", "TEST-GPU", 2, 0, True, 0.0)]
    pending = [QueuedTask(f"t{i}", "d", 2) for i in range(10)]
    plan = plan_queues(CONFIG, pending, holdings, CAPACITY, UsageDecay.for_config(CONFIG), 0.0)
    assert len(calls) == 1 and plan.order == [] and len(plan.refused) == 10
    assert len(set(plan.refused.values())) == 1 and "limit of 2" in plan.refused["t9"]


def test_quota_is_admitted_before_anything_is_lent() -> None:
    """Queue x's task within its quota is admitted although y, lower in fair share, asks first to borrow
    x's idle quota: y is refused (nothing else is lent), x's task goes in (otherwise reclaim would free
    GPUs for x that y borrows back in the next cycle)."""
    two = QueueConfig(queues=(Queue(name="x", gpus={"*": 6}), Queue(name="y", gpus={"*": 2})))
    holdings = [QueueHolding(f"x{i}", "x", "TEST-GPU", 1, 0, True, float(i)) for i in range(2)]
    holdings += [QueueHolding("y0", "y", "TEST-GPU", 1, 0, True, 0.0)]
    pending = [QueuedTask("y-more", "y", 4), QueuedTask("x-own", "x", 4)]
    decay = UsageDecay.for_config(two)
    assert planning.order_pending(two, [Pending(t.task_id, t.queue, t.gpus) for t in pending],
                                  planning.queue_use(holdings), decay, {"TEST-GPU": 8}, 0.0)[0] == "y-more"
    plan = plan_queues(two, pending, holdings, {"TEST-GPU": 8}, decay, 0.0)
    assert plan.order == ["x-own"]
    assert "quota of 2, so the task needs 3 borrowed; only 0 can be borrowed" in plan.refused["y-more"]


def test_a_queue_under_its_quota_borrows_ahead_of_queues_over_theirs() -> None:
    """x (quota 4, holding 2) asks 4 GPUs: 2 within its quota, 2 borrowed; y (quota 2, holding 2: at its quota)
    asks 2 more, all borrowed, and comes first in fair order. 2 GPUs are lent (z's idle quota): they go to x,
    whose task its quota does not cover whole, not to y, already at its quota."""
    three = QueueConfig(queues=(Queue(name="x", gpus={"*": 4}), Queue(name="y", gpus={"*": 2}),
                                Queue(name="z", gpus={"*": 2})))
    holdings = [QueueHolding("x0", "x", "TEST-GPU", 2, 0, True, 0.0),
                QueueHolding("y0", "y", "TEST-GPU", 2, 0, True, 0.0)]
    pending = [QueuedTask("y-more", "y", 2), QueuedTask("x-big", "x", 4)]
    decay = UsageDecay.for_config(three)
    decay.add("x", 0.0, gpu_s=1e6)                          # x has used more: y comes first in fair order
    assert planning.order_pending(three, [Pending(t.task_id, t.queue, t.gpus) for t in pending],
                                  planning.queue_use(holdings), decay, {"TEST-GPU": 8}, 0.0)[0] == "y-more"
    plan = plan_queues(three, pending, holdings, {"TEST-GPU": 8}, decay, 0.0)
    assert plan.order == ["x-big"] and plan.admissions["x-big"].borrowed == 2
    assert "the task needs 2 borrowed; only 0 can be borrowed now" in plan.refused["y-more"]


TEAM = QueueConfig(queues=(Queue(name="team", gpus={"*": 2}, limit={"*": 3}), Queue(name="other", gpus={"*": 2})))


class TestElasticRoom:
    """team (quota 2, limit 3) beside other (quota 2, lending) on 8 GPUs."""

    CAPACITY: ClassVar[dict[str, int]] = {"TEST-GPU": 8}

    def test_elastic_tasks_share_their_queues_room_up_to_its_limit(self) -> None:
        """QueueHolding 1: room 2 (1 of its quota, then 1 borrowed up to the limit 3), booked as tasks take it."""
        use = planning.queue_use([QueueHolding("e", "team", "TEST-GPU", 1, 0, True, 0.0)])
        room = QueueRoom(TEAM, use, self.CAPACITY)
        assert room.of("team", "*") == 2
        assert room.take("team", "*", 1) == 0 and room.of("team", "*") == 1
        assert room.take("team", "*", 1) == 1 and room.of("team", "*") == 0
        assert room.of("nowhere", "*") == 0

    def test_what_a_task_waiting_on_the_limit_needs_given_back(self) -> None:
        """QueueHolding 3 (its elastic task grew to the limit): a 1-GPU task needs 1 back, a 2-GPU one 2 (None when
        only 1 can shrink); other's task is admitted as it is: nothing."""
        use = planning.queue_use(rebalance(TEAM, [QueueHolding("e", "team", "TEST-GPU", 3, 0, True, 0.0)]))
        assert shrink_needed(TEAM, use, self.CAPACITY, QueuedTask("w1", "team", 1), "*", 2) == 1
        assert shrink_needed(TEAM, use, self.CAPACITY, QueuedTask("w2", "team", 2), "*", 2) == 2
        assert shrink_needed(TEAM, use, self.CAPACITY, QueuedTask("w2", "team", 2), "*", 1) is None
        assert shrink_needed(TEAM, use, self.CAPACITY, QueuedTask("o", "other", 1), "*", 2) is None


class TestReclaimWithIdleGpus:
    """Queue x (quota 4, holding nothing) waits with a 4-GPU task while y holds eight 1-GPU tasks, four of
    them on x's lent quota (rebalance marks the newest as borrowing)."""

    TWO = QueueConfig(queues=(Queue(name="x", gpus={"*": 4}), Queue(name="y", gpus={"*": 4})))
    BORROWERS = tuple(QueueHolding(f"y{i}", "y", "TEST-GPU", 1, 0, True, float(i)) for i in range(8))
    WAITING = (QueuedTask("x0", "x", 4),)

    def test_without_idle_gpus_the_newest_borrowers_are_preempted(self) -> None:
        victims = reclaim_for(self.TWO, self.WAITING, self.BORROWERS)
        assert sorted(v.task_id for v in victims) == ["y4", "y5", "y6", "y7"]

    def test_idle_gpus_that_cover_the_demand_spare_every_borrower(self) -> None:
        """The waiting task is unplaced for another reason (fragmentation): preempting would free nothing
        it lacks, and the victims would take the GPUs back by borrowing again."""
        assert reclaim_for(self.TWO, self.WAITING, self.BORROWERS, idle={"TEST-GPU": 4}) == []

    def test_idle_gpus_count_towards_the_demand(self) -> None:
        victims = reclaim_for(self.TWO, self.WAITING, self.BORROWERS, idle={"TEST-GPU": 3})
        assert [v.task_id for v in victims] == ["y7"]
