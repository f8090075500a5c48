"""Fair share: usage decay in explicit time, weighted dominant share, the queue order and the
interleaving of pending tasks."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import ValidationError
from coordinator.queues import (
    Consumed,
    Held,
    Pending,
    Queue,
    QueueConfig,
    QueueUse,
    UsageDecay,
    order_pending,
    order_queues,
    weighted_share,
)

H100 = "NVIDIA H100 80GB HBM3"
HOUR = 3600.0


def holding(gpus: int, cpu: float = 0.0) -> QueueUse:
    return QueueUse(gpus={H100: Held(gpus)}, cpu=cpu)


def test_usage_halves_every_half_life() -> None:
    decay = UsageDecay(HOUR)
    decay.add("a", now=0.0, gpu_s=100.0, cpu_s=40.0)
    assert decay.at("a", 0.0) == Consumed(100.0, 40.0)
    assert decay.at("a", HOUR) == Consumed(50.0, 20.0)
    assert decay.at("a", 3 * HOUR).gpu_s == pytest.approx(12.5)
    decay.add("a", now=HOUR, gpu_s=50.0)
    assert decay.at("a", HOUR).gpu_s == pytest.approx(100.0)
    assert decay.at("nobody", 5.0) == Consumed()


def test_usage_does_not_grow_going_back_in_time() -> None:
    decay = UsageDecay(HOUR)
    decay.add("a", now=HOUR, gpu_s=10.0)
    assert decay.at("a", 0.0).gpu_s == 10.0
    decay.add("a", now=0.0, gpu_s=10.0)           # late report: added without decay
    assert decay.at("a", HOUR).gpu_s == 20.0


def test_usage_decay_round_trips_and_forgets() -> None:
    decay = UsageDecay(HOUR)
    decay.add("a", now=10.0, gpu_s=7.0, cpu_s=3.0)
    decay.add("b", now=20.0, gpu_s=1.0)
    copy = UsageDecay.from_dict(decay.to_dict())
    assert copy.snapshot(100.0) == decay.snapshot(100.0)
    decay.forget("a")
    assert list(decay.snapshot(100.0)) == ["b"]


def test_usage_decay_validates() -> None:
    with pytest.raises(ValidationError):
        UsageDecay(0)
    with pytest.raises(ValidationError):
        UsageDecay(HOUR).add("a", 0.0, gpu_s=-1.0)
    assert UsageDecay.for_config(QueueConfig(half_life_h=2)).half_life_s == 2 * HOUR


def test_steady_use_gives_a_past_term_equal_to_the_fraction_held() -> None:
    decay = UsageDecay(HOUR)
    for t in range(0, 20 * 3600, 60):            # 4 of 8 GPUs for 20 hours, reported every minute
        decay.add("a", now=float(t), gpu_s=4 * 60.0)
    config = QueueConfig(queues=(Queue("a"),))
    share = weighted_share(config, "a", 0, 0, decay.at("a", 20 * 3600.0), {H100: 8}, decay.tau_s)
    assert share == pytest.approx(0.5, rel=0.02)


def test_weight_divides_the_dominant_share() -> None:
    config = QueueConfig(queues=(Queue("a", weight=2.0), Queue("b")))
    tau = HOUR / math.log(2)
    # dominant resource: CPU for a (8/16 > 2/8), GPU for b
    assert weighted_share(config, "a", 2, 8, Consumed(), {H100: 8}, tau, cpu_capacity=16) == pytest.approx(0.25)
    assert weighted_share(config, "b", 4, 0, Consumed(), {H100: 8}, tau, cpu_capacity=16) == pytest.approx(0.5)
    assert weighted_share(config, "b", 4, 0, Consumed(), {}, tau) == 0.0


def test_order_queues_lowest_weighted_share_first_ties_by_name() -> None:
    config = QueueConfig(queues=(Queue("org"), Queue("c", parent="org"), Queue("b", parent="org", weight=2),
                                 Queue("a", parent="org")))
    use = {"a": holding(2), "b": holding(2), "c": holding(0)}
    assert order_queues(config, use, {}, {H100: 8}, now=0.0) == ["c", "b", "a"]
    assert order_queues(config, {}, {}, {H100: 8}, now=0.0) == ["a", "b", "c"]


def test_order_queues_weighs_decayed_past_usage() -> None:
    config = QueueConfig(queues=(Queue("a"), Queue("b")), half_life_h=1)
    decay = UsageDecay.for_config(config)
    decay.add("a", now=0.0, gpu_s=8 * HOUR)      # a used the whole cluster for an hour
    assert order_queues(config, {"b": holding(2)}, decay, {H100: 8}, now=0.0) == ["b", "a"]
    # many half-lives later a's past no longer outweighs b's present
    assert order_queues(config, {"b": holding(2)}, decay, {H100: 8}, now=10 * HOUR) == ["a", "b"]
    # a snapshot works as well as the accumulator
    assert order_queues(config, {"b": holding(2)}, decay.snapshot(0.0), {H100: 8}, now=0.0) == ["b", "a"]


def test_order_pending_recomputes_the_share_after_each_task() -> None:
    config = QueueConfig(queues=(Queue("a"), Queue("b")))
    pending = [Pending("a1", "a", 2), Pending("a2", "a", 2), Pending("a3", "a", 2),
               Pending("b1", "b", 2), Pending("b2", "b", 2)]
    # b already holds 4 of 8: a gets two tasks before b's share is reached
    order = order_pending(config, pending, {"b": holding(4)}, {}, {H100: 8}, now=0.0)
    # after a2 both hold 4 of 8: the tie goes to b, which has had fewer tasks taken
    assert order == ["a1", "a2", "b1", "a3", "b2"]
    # no history: equal shares alternate
    order = order_pending(config, pending, {}, {}, {H100: 8}, now=0.0)
    assert order == ["a1", "b1", "a2", "b2", "a3"]


def test_order_pending_weights_and_keeps_the_order_within_a_queue() -> None:
    config = QueueConfig(queues=(Queue("a", weight=3), Queue("b")))
    pending = [Pending(f"b{i}", "b", 1) for i in range(3)] + [Pending(f"a{i}", "a", 1) for i in range(6)]
    order = order_pending(config, pending, {}, {}, {H100: 8}, now=0.0)
    assert [t for t in order if t.startswith("a")] == [f"a{i}" for i in range(6)]
    assert [t for t in order if t.startswith("b")] == [f"b{i}" for i in range(3)]
    assert order == ["a0", "b0", "a1", "a2", "b1", "a3", "a4", "a5", "b2"]   # a: 3 GPUs per 1 of b's


def test_order_pending_alternates_when_no_share_changes() -> None:
    config = QueueConfig(queues=(Queue("a"), Queue("b")))
    pending = [Pending("a1", "a"), Pending("a2", "a"), Pending("b1", "b"), Pending("b2", "b")]
    assert order_pending(config, pending, {}, {}, {}, now=0.0) == ["a1", "b1", "a2", "b2"]


def test_order_pending_refuses_an_unknown_queue() -> None:
    with pytest.raises(ValidationError) as excinfo:
        order_pending(QueueConfig(queues=(Queue("a"),)), [Pending("t", "x", 1)], {}, {}, {H100: 1}, now=0.0)
    assert excinfo.value.field == "pending[0].queue"


# -- hypothesis: the order is deterministic and a permutation ----------------------------------

queue_names = ["a", "b", "c", "d"]


@st.composite
def scenario(draw: st.DrawFn) -> tuple[QueueConfig, list[Pending], dict[str, QueueUse], dict[str, Consumed]]:
    config = QueueConfig(queues=tuple(Queue(n, weight=draw(st.floats(0.1, 10))) for n in queue_names))
    pending = [Pending(f"t{i}", draw(st.sampled_from(queue_names)), draw(st.integers(0, 4)), draw(st.floats(0, 8)))
               for i in range(draw(st.integers(0, 20)))]
    use = {n: holding(draw(st.integers(0, 8)), draw(st.floats(0, 32))) for n in queue_names if draw(st.booleans())}
    past = {n: Consumed(draw(st.floats(0, 1e6)), draw(st.floats(0, 1e6))) for n in queue_names if draw(st.booleans())}
    return config, pending, use, past


@settings(max_examples=200, deadline=None)
@given(scenario())
def test_order_is_deterministic_and_keeps_every_task(
        case: tuple[QueueConfig, list[Pending], dict[str, QueueUse], dict[str, Consumed]]) -> None:
    config, pending, use, past = case
    first = order_pending(config, pending, use, past, {H100: 8}, now=0.0, cpu_capacity=64)
    again = order_pending(config, list(pending), dict(reversed(list(use.items()))), past, {H100: 8}, now=0.0,
                          cpu_capacity=64)
    assert first == again
    assert sorted(first) == sorted(t.task_id for t in pending)
    for name in queue_names:                      # within a queue, the order given
        assert [t for t in first if t in {p.task_id for p in pending if p.queue == name}] == \
            [p.task_id for p in pending if p.queue == name]
    queues = order_queues(config, use, past, {H100: 8}, now=0.0, cpu_capacity=64)
    assert queues == order_queues(config, dict(reversed(list(use.items()))), past, {H100: 8}, now=0.0,
                                  cpu_capacity=64)
    assert sorted(queues) == queue_names
