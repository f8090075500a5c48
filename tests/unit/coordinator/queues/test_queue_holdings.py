"""Holdings: borrowed counts recomputed oldest-within-quota-first, and summed per queue."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.queues import Held, Queue, QueueConfig, QueueHolding, QueueUse, queue_use, rebalance

H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
CONFIG = QueueConfig(queues=(Queue("a", gpus={"*": 4, H100: 2}), Queue("b")))


def task(task_id: str, queue: str, gpus: int, start: float, borrowed: int = 0, model: str = L4) -> QueueHolding:
    return QueueHolding(task_id, queue, model, gpus, borrowed, True, start)


def test_oldest_tasks_fill_the_quota_first() -> None:
    holdings = [task("new", "a", 2, 3.0), task("old", "a", 3, 1.0), task("mid", "a", 2, 2.0)]
    assert [h.borrowed for h in rebalance(CONFIG, holdings)] == [2, 0, 1]


def test_borrowed_turns_own_when_older_tasks_end() -> None:
    holdings = [task("old", "a", 4, 1.0), task("new", "a", 2, 2.0, borrowed=2)]
    assert [h.borrowed for h in rebalance(CONFIG, holdings)] == [0, 2]
    assert [h.borrowed for h in rebalance(CONFIG, holdings[1:])] == [0]


def test_pools_are_filled_separately_and_queues_without_quota_only_borrow() -> None:
    holdings = [task("h", "a", 3, 1.0, model=H100), task("l", "a", 3, 1.0), task("b", "b", 1, 0.0)]
    assert [h.borrowed for h in rebalance(CONFIG, holdings)] == [1, 0, 1]


def test_without_queues_nothing_is_borrowed() -> None:
    assert rebalance(QueueConfig(), [task("t", "default", 8, 1.0, borrowed=3)])[0].borrowed == 0


def test_queue_use_sums_per_queue_and_model() -> None:
    holdings = [QueueHolding("1", "a", H100, 2, 1, True, 0.0, cpu=4, mem_gib=10),
                QueueHolding("2", "a", H100, 3, 0, True, 0.0, cpu=2),
                QueueHolding("3", "a", L4, 1, 0, False, 0.0),
                QueueHolding("4", "b", L4, 1, 1, True, 0.0, mem_gib=1)]
    assert queue_use(holdings) == {
        "a": QueueUse(gpus={H100: Held(4, 1), L4: Held(1, 0)}, cpu=6, mem_gib=10),
        "b": QueueUse(gpus={L4: Held(0, 1)}, cpu=0, mem_gib=1),
    }


@settings(max_examples=200, deadline=None)
@given(st.lists(st.builds(lambda i, q, m, g, s: task(f"t{i}", q, g, s, model=m), st.integers(0, 10 ** 6),
                          st.sampled_from(["a", "b"]), st.sampled_from([H100, L4]), st.integers(0, 4),
                          st.floats(0, 100)), max_size=12, unique_by=lambda h: h.task_id))
def test_rebalance_fills_exactly_the_quota_with_the_oldest(holdings: list[QueueHolding]) -> None:
    out = rebalance(CONFIG, holdings)
    assert [h.task_id for h in out] == [h.task_id for h in holdings]
    per_pool: dict[tuple[str, str], list[QueueHolding]] = defaultdict(list)
    for h in out:
        assert 0 <= h.borrowed <= h.gpus
        per_pool[h.queue, CONFIG.pool_of(h.gpu_model)].append(h)
    for (queue, pool), tasks in per_pool.items():
        quota = CONFIG.get(queue).quota_in(pool)
        total = sum(h.gpus for h in tasks)
        assert sum(h.gpus - h.borrowed for h in tasks) == min(total, quota)
        ordered = sorted(tasks, key=lambda h: (h.start_time, h.task_id))
        first_borrowing = next((i for i, h in enumerate(ordered) if h.borrowed), len(ordered))
        assert all(h.borrowed == h.gpus for h in ordered[first_borrowing + 1:])   # newer ones borrow all
