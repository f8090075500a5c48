"""Properties of admission and reclaim over random trees and random sequences of demands
(hypothesis): limits hold, borrowing stays within what is lent, reclaim picks only borrowing,
preemptible tasks of other queues and frees what is needed whenever it can."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hypothesis import event, given, settings
from hypothesis import strategies as st

from coordinator.queues import (
    Demand,
    Held,
    Queue,
    QueueConfig,
    QueueHolding,
    QueueUse,
    admit,
    pool_state,
    reclaim_victims,
)

H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
MODELS = [H100, L4]


@st.composite
def trees(draw: st.DrawFn) -> QueueConfig:
    """An organisation over 1–4 teams (or a flat list), quotas per model or "*", some limits and lends."""
    teams = draw(st.integers(1, 4))
    nested = draw(st.booleans())
    queues: list[Queue] = []
    for i in range(teams):
        gpus: dict[str, int] = {}
        for key in draw(st.lists(st.sampled_from(["*", H100]), max_size=2, unique=True)):
            gpus[key] = draw(st.integers(0, 4))
        limit = {k: q + draw(st.integers(0, 4)) for k, q in gpus.items() if draw(st.booleans())}
        if draw(st.booleans()):
            limit.setdefault("*", draw(st.integers(0, 6)))
        if "*" in limit:                            # the "*" limit stands in for pools without their own
            limit["*"] = max(limit["*"], *(q for k, q in gpus.items() if k not in limit or k == "*"), 0)
        lend = {k: draw(st.integers(0, q)) for k, q in gpus.items() if draw(st.booleans())}
        queues.append(Queue(f"t{i}", parent="org" if nested else None, gpus=gpus, limit=limit, lend=lend))
    if nested:
        total = sum(q.gpus.get("*", 0) for q in queues)
        org_limit = {"*": total + draw(st.integers(0, 8))} if draw(st.booleans()) else {}
        queues.insert(0, Queue("org", gpus={"*": total} if draw(st.booleans()) else {}, limit=org_limit))
    return QueueConfig(queues=tuple(queues))


@dataclass
class Running:
    task_id: str
    queue: str
    model: str
    gpus: int
    borrowed: int


def usage(tasks: list[Running]) -> dict[str, QueueUse]:
    held: dict[str, dict[str, Held]] = defaultdict(dict)
    for t in tasks:
        held[t.queue][t.model] = held[t.queue].get(t.model, Held()) + Held(t.gpus - t.borrowed, t.borrowed)
    return {q: QueueUse(gpus=m) for q, m in held.items()}


steps = st.lists(st.tuples(st.integers(0, 3), st.sampled_from([H100, L4, "*"]), st.integers(0, 4),
                           st.integers(0, 10)), min_size=1, max_size=25)


@settings(max_examples=300, deadline=None)
@given(trees(), st.fixed_dictionaries({H100: st.integers(0, 16), L4: st.integers(0, 8)}), steps)
def test_admission_keeps_limits_and_borrows_only_what_is_lent(
        config: QueueConfig, capacity: dict[str, int], sequence: list[tuple[int, str, int, int]]) -> None:
    leaves = config.leaves()
    running: list[Running] = []
    for n, (who, model, gpus, finish) in enumerate(sequence):
        if finish >= 8 and running:                 # now and then a task ends
            running.pop(finish % len(running))
        queue = config.get(leaves[who % len(leaves)])
        use = usage(running)
        decision = admit(config, use, capacity, Demand(queue.name, model, gpus))
        if not decision.admit:
            assert decision.borrowed == 0
            continue
        pool = decision.pool
        held = use.get(queue.name, QueueUse()).held_in(config, pool).total
        assert 0 <= decision.borrowed <= gpus
        # never beyond quota without counting it as borrowed
        assert held + gpus - decision.borrowed <= max(queue.quota_in(pool), held)
        event("borrowed" if decision.borrowed else "within quota")
        if decision.borrowed:
            # the queue's limit and its ancestors' limits hold
            limit = queue.limit_in(pool)
            assert limit is None or held + gpus <= limit
            for name in config.ancestors(queue.name):
                ancestor_limit = config.get(name).limit_in(pool)
                subtree = sum(use[q].held_in(config, pool).total for q in (name, *config.descendants(name)) if q in use)
                assert ancestor_limit is None or subtree + gpus <= ancestor_limit
            # what is borrowed in the pool, this task included, stays within what others lend
            state = pool_state(config, use, capacity, pool, borrower=queue.name)
            assert state.borrowed + decision.borrowed <= state.lendable + state.unassigned
        concrete = model if model != "*" else next(
            (m for m in MODELS if config.pool_of(m) == pool), H100)
        running.append(Running(f"t{n}", queue.name, concrete, gpus, decision.borrowed))
    # with no task ever admitted beyond quota by another route, a queue never holds more than its limit
    for name, use_of in usage(running).items():
        q = config.get(name)
        for pool in config.pools(MODELS):
            limit = q.limit_in(pool)
            held = use_of.held_in(config, pool)
            assert limit is None or held.borrowed == 0 or held.total <= limit


holdings_strategy = st.lists(
    st.builds(lambda i, q, m, g, b, p, s: QueueHolding(f"h{i}", q, m, g, min(b, g), p, s),
              st.integers(0, 10 ** 6), st.sampled_from(["a", "b", "c"]), st.sampled_from(MODELS),
              st.integers(1, 4), st.integers(0, 4), st.booleans(), st.floats(0, 100)),
    max_size=12, unique_by=lambda h: h.task_id)
waiting_strategy = st.lists(st.builds(Demand, st.sampled_from(["a", "b", "c"]), st.sampled_from([*MODELS, "*"]),
                                      st.integers(1, 6)), min_size=1, max_size=4)
RECLAIM_CONFIG = QueueConfig(queues=(Queue("a", gpus={"*": 6}), Queue("b", gpus={H100: 4}), Queue("c")))


@settings(max_examples=400, deadline=None)
@given(holdings_strategy, waiting_strategy)
def test_reclaim_picks_only_borrowing_preemptible_tasks_of_other_queues(
        holdings: list[QueueHolding], waiting: list[Demand]) -> None:
    victims = reclaim_victims(RECLAIM_CONFIG, holdings, waiting)
    by_id = {h.task_id: h for h in holdings}
    assert len({v.task_id for v in victims}) == len(victims)
    for v in victims:
        h = by_id[v.task_id]
        assert h.borrowed > 0
        assert h.preemptible
        assert h.queue != v.for_queue
        assert (v.queue, v.gpu_model, v.gpus, v.borrowed) == (h.queue, h.gpu_model, h.gpus, h.borrowed)


@settings(max_examples=400, deadline=None)
@given(holdings_strategy, st.sampled_from(["a", "b"]), st.integers(1, 6), st.integers(0, 4).map(lambda i: i == 0))
def test_reclaim_frees_what_is_needed_whenever_it_can(
        holdings: list[QueueHolding], queue: str, gpus: int, other_model: bool) -> None:
    config = RECLAIM_CONFIG
    # mostly the model of the queue's quota (a: "*" covers L4, as b names H100), now and then the other
    model = {"a": L4, "b": H100}[queue] if not other_model else {"a": H100, "b": L4}[queue]
    own = [h for h in holdings if h.queue == queue]
    holdings = own[:1] + [h for h in holdings if h.queue != queue]     # mostly owed: little of its own held
    pool = config.pool_of(model)
    held = sum(h.gpus for h in holdings if h.queue == queue and config.pool_of(h.gpu_model) == pool)
    owed = held + gpus <= config.get(queue).quota_in(pool)
    reclaimable = sum(h.gpus for h in holdings
                      if h.queue != queue and h.borrowed > 0 and h.preemptible and h.gpu_model == model)
    victims = reclaim_victims(config, holdings, [Demand(queue, model, gpus)])
    freed = sum(v.gpus for v in victims)
    event("reclaimed" if victims else "nothing reclaimed")
    if owed and reclaimable >= gpus:
        assert freed >= gpus
        # just enough: without any one victim it would not be
        assert all(freed - v.gpus < gpus for v in victims)
        assert all(v.gpu_model == model for v in victims)
    elif held < config.get(queue).quota_in(pool) and victims:
        # a queue under its quota claims up to its task's size, only from queues that stay at or above theirs
        assert freed >= gpus and all(freed - v.gpus < gpus for v in victims)
        for q in {v.queue for v in victims}:
            mine = sum(h.gpus for h in holdings if h.queue == q and config.pool_of(h.gpu_model) == pool)
            assert mine - sum(v.gpus for v in victims if v.queue == q) >= config.get(q).quota_in(pool)
    else:
        assert victims == []
