"""Admission: within quota, borrowing up to the limit from idle lendable quota and unassigned
capacity, ancestors' limits, cpu/memory caps, pools, and the implicit default queue."""

from __future__ import annotations

import pytest

from common.errors import ValidationError
from coordinator.queues import Demand, Held, Queue, QueueConfig, QueueUse, admit, pool_state, room

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def two_teams(**a: object) -> QueueConfig:
    return QueueConfig(queues=(
        Queue("org"),
        Queue("a", parent="org", **{"gpus": {"*": 4}, "limit": {"*": 8}, **a}),  # type: ignore[arg-type]
        Queue("b", parent="org", gpus={"*": 4}),
    ))


def use(own: int = 0, borrowed: int = 0, model: str = H100, cpu: float = 0.0, mem_gib: float = 0.0) -> QueueUse:
    return QueueUse(gpus={model: Held(own, borrowed)}, cpu=cpu, mem_gib=mem_gib)


CAPACITY = {H100: 8}


def test_within_quota_is_admitted_without_borrowing() -> None:
    decision = admit(two_teams(), {"a": use(2)}, CAPACITY, Demand("a", H100, 2))
    assert (decision.admit, decision.borrowed) == (True, 0)
    assert decision.reason == "Queue a would hold 4 GPUs with this task, within its quota of 4."


def test_within_quota_is_admitted_even_while_others_borrow_it() -> None:
    # b borrows all of a's idle quota; a's quota is still guaranteed (reclaim takes it back)
    decision = admit(two_teams(), {"b": use(4, 4)}, CAPACITY, Demand("a", H100, 4))
    assert (decision.admit, decision.borrowed) == (True, 0)


def test_beyond_quota_borrows_idle_lendable_quota() -> None:
    decision = admit(two_teams(), {"a": use(4)}, CAPACITY, Demand("a", H100, 3))
    assert (decision.admit, decision.borrowed) == (True, 3)
    assert decision.reason == ("Queue a would hold 7 GPUs with this task: 4 within its quota of 4 and 3 borrowed, "
                               "of 4 that can be borrowed.")


def test_only_the_part_beyond_quota_is_borrowed() -> None:
    decision = admit(two_teams(), {"a": use(3)}, CAPACITY, Demand("a", H100, 3))
    assert (decision.admit, decision.borrowed) == (True, 2)


def test_limit_bounds_what_a_queue_holds_borrowed_included() -> None:
    decision = admit(two_teams(limit={"*": 5}), {"a": use(4)}, CAPACITY, Demand("a", H100, 2))
    assert not decision.admit
    assert decision.borrowed == 0
    assert decision.reason == ("Queue a would hold 6 GPUs with this task, more than its limit of 5; its quota "
                               "is 4.")


def test_lend_caps_what_others_may_borrow() -> None:
    config = QueueConfig(queues=(Queue("a", gpus={"*": 4}), Queue("b", gpus={"*": 4}, lend={"*": 1})))
    assert admit(config, {"a": use(4)}, CAPACITY, Demand("a", H100, 1)).borrowed == 1
    decision = admit(config, {"a": use(4)}, CAPACITY, Demand("a", H100, 2))
    assert not decision.admit
    assert decision.reason == ("Queue a would hold 6 GPUs with this task, more than its quota of 4, so the task "
                               "needs 2 borrowed; only 1 can be borrowed now (1 lent by other queues plus 0 under no "
                               "queue's quota, minus 0 already borrowed).")


def test_a_lender_lends_only_its_idle_quota() -> None:
    # b uses 3 of its 4: only 1 is idle
    decision = admit(two_teams(), {"a": use(4), "b": use(3)}, CAPACITY, Demand("a", H100, 2))
    assert not decision.admit
    assert admit(two_teams(), {"a": use(4), "b": use(3)}, CAPACITY, Demand("a", H100, 1)).admit


def test_what_is_already_borrowed_leaves_the_pool() -> None:
    config = QueueConfig(queues=(Queue("a", gpus={"*": 2}), Queue("b", gpus={"*": 2}), Queue("c", gpus={"*": 4})))
    held = {"a": use(2, 3)}                         # a already borrows 3 of c's 4 idle
    assert admit(config, held, CAPACITY, Demand("b", H100, 3)).admit is True       # 2 own + 1 borrowed
    assert admit(config, held, CAPACITY, Demand("b", H100, 4)).admit is False      # 2 own + 2 borrowed


def test_unassigned_capacity_is_free_to_borrow_and_counts_as_borrowed() -> None:
    config = QueueConfig(queues=(Queue("a", gpus={"*": 2}, lend={"*": 0}), Queue("b", gpus={"*": 2}, lend={"*": 0})))
    state = pool_state(config, {}, {H100: 10}, "*", borrower="a")
    assert (state.lendable, state.unassigned, state.borrowed) == (0, 6, 0)
    decision = admit(config, {}, {H100: 10}, Demand("a", H100, 8))
    assert (decision.admit, decision.borrowed) == (True, 6)
    assert not admit(config, {}, {H100: 10}, Demand("a", H100, 9)).admit


def test_a_queue_without_quota_only_borrows() -> None:
    config = QueueConfig(queues=(Queue("a", gpus={"*": 4}), Queue("free")))
    decision = admit(config, {}, CAPACITY, Demand("free", H100, 6))
    assert (decision.admit, decision.borrowed) == (True, 6)    # 4 lendable from a + 4 unassigned


def test_an_ancestors_limit_bounds_its_subtree() -> None:
    config = QueueConfig(queues=(
        Queue("org", gpus={"*": 4}, limit={"*": 6}),
        Queue("a", parent="org", gpus={"*": 2}),
        Queue("b", parent="org", gpus={"*": 2}),
        Queue("c", gpus={"*": 4}),
    ))
    held = {"a": use(2), "b": use(2, 1)}
    decision = admit(config, held, CAPACITY, Demand("a", H100, 2))
    assert not decision.admit
    assert decision.reason == ("Queue org, above queue a, would hold 7 GPUs in all with this task, more than its "
                               "limit of 6.")
    assert admit(config, held, CAPACITY, Demand("a", H100, 1)).admit


def test_cpu_and_memory_caps_apply_to_the_queue_and_its_ancestors() -> None:
    config = QueueConfig(queues=(Queue("org", cpu=16, mem_gib=100), Queue("a", parent="org", cpu=10),
                                 Queue("b", parent="org")))
    decision = admit(config, {"a": use(cpu=8)}, CAPACITY, Demand("a", H100, 0, cpu=4))
    assert not decision.admit
    assert decision.reason == ("Queue a's tasks would ask for 12 cores in all with this one, more than its cap of "
                               "10 cores.")
    decision = admit(config, {"a": use(cpu=8), "b": use(cpu=6)}, CAPACITY, Demand("b", H100, 0, cpu=4))
    assert decision.reason == ("Queue org's tasks would ask for 18 cores in all with this one, more than its cap of "
                               "16 cores.")
    decision = admit(config, {"b": use(mem_gib=90)}, CAPACITY, Demand("b", H100, 0, mem_gib=20))
    assert decision.reason == ("Queue org's tasks would ask for 110 GiB of memory in all with this one, more than its "
                               "cap of 100 GiB of memory.")
    assert admit(config, {"a": use(cpu=8)}, CAPACITY, Demand("a", H100, 0, cpu=2)).admit


def test_named_models_are_pools_of_their_own() -> None:
    config = QueueConfig(queues=(Queue("a", gpus={H100: 2, "*": 2}), Queue("b", gpus={H100: 2})))
    capacity = {H100: 4, A100: 2}
    held = {"a": QueueUse(gpus={H100: Held(2), A100: Held(1)})}
    decision = admit(config, held, capacity, Demand("a", H100, 1))
    assert (decision.admit, decision.borrowed, decision.pool) == (True, 1, H100)   # borrows b's idle H100
    decision = admit(config, held, capacity, Demand("a", A100, 1))
    assert (decision.admit, decision.borrowed, decision.pool) == (True, 0, "*")    # its "*" quota
    decision = admit(config, held, capacity, Demand("b", A100, 2))
    assert (decision.admit, decision.borrowed) == (False, 0)                        # only 1 A100-pool GPU idle
    assert "[*]" not in decision.reason


def test_any_model_prefers_a_pool_without_borrowing() -> None:
    config = QueueConfig(queues=(Queue("a", gpus={H100: 2, "*": 2}), Queue("b", gpus={H100: 2})))
    capacity = {H100: 4, A100: 4}
    decision = admit(config, {"a": QueueUse(gpus={H100: Held(2)})}, capacity, Demand("a", "*", 2))
    assert (decision.admit, decision.borrowed, decision.pool) == (True, 0, "*")
    decision = admit(config, {"a": QueueUse(gpus={A100: Held(2)})}, capacity, Demand("a", "", 2))
    assert (decision.admit, decision.borrowed, decision.pool) == (True, 0, H100)
    decision = admit(config, {"a": QueueUse(gpus={A100: Held(2, 2), H100: Held(2)})}, capacity,
                     Demand("a", "*", 3))
    assert not decision.admit
    assert decision.reason.startswith(f"For {H100} GPUs: Queue a would hold 5 GPUs of model {H100} with this task, "
                                      f"more than its quota of 2, so the task needs 3 borrowed; only ")
    assert (" For GPUs of models no queue names: Queue a would hold 7 GPUs with this task, more than its quota of 2, "
            "so the task needs 3 borrowed; only ") in decision.reason
    assert "[" not in decision.reason


def test_without_queues_everything_is_admitted_and_nothing_borrowed() -> None:
    decision = admit(QueueConfig(), {"default": use(100)}, CAPACITY, Demand("default", H100, 50))
    assert (decision.admit, decision.borrowed) == (True, 0)
    assert decision.reason == "No queues are configured, so every task is admitted."


@pytest.mark.parametrize(("demand", "field"), [
    (Demand("nope", H100, 1), "demand.queue"),
    (Demand("org", H100, 1), "demand.queue"),
    (Demand("a", H100, -1), "demand.gpus"),
    (Demand("a", H100, 1, cpu=-1), "demand.cpu"),
])
def test_invalid_demands_name_the_field(demand: Demand, field: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        admit(two_teams(), {}, CAPACITY, demand)
    assert excinfo.value.field == field


def test_a_parent_limited_to_its_quota_keeps_borrowing_among_its_children() -> None:
    config = QueueConfig(queues=(
        Queue("org", gpus={"*": 4}, limit={"*": 4}),
        Queue("a", parent="org", gpus={"*": 2}),
        Queue("b", parent="org", gpus={"*": 2}),
        Queue("other", gpus={"*": 4}),
    ))
    capacity = {H100: 8}
    assert admit(config, {}, capacity, Demand("a", H100, 4)).borrowed == 2          # b's idle quota
    decision = admit(config, {"b": use(2)}, capacity, Demand("a", H100, 3))          # would need other's
    assert not decision.admit
    assert decision.reason == ("Queue org, above queue a, would hold 5 GPUs in all with this task, more than its "
                               "limit of 4.")
    assert admit(config, {}, capacity, Demand("other", H100, 8)).borrowed == 4      # others may borrow org's


def test_room_is_the_idle_quota_and_what_may_be_borrowed_within_the_limits() -> None:
    """What an elastic task of a may grow by: a holds 2 of its quota 4 (limit 8) and b lends its idle 4: 2 own + 4
    borrowed = 6, within the limit; the most admit admits. Its limit (5) or its parent's (org: 6 over the subtree)
    cuts it; b holding its quota leaves only a's idle quota."""
    config = two_teams()
    assert room(config, {"a": use(2)}, CAPACITY, "a", "*") == 6
    assert admit(config, {"a": use(2)}, CAPACITY, Demand("a", H100, 6)).admit
    assert not admit(config, {"a": use(2)}, CAPACITY, Demand("a", H100, 7)).admit
    assert room(two_teams(limit={"*": 5}), {"a": use(2)}, CAPACITY, "a", "*") == 3
    capped = QueueConfig(queues=(Queue("org", limit={"*": 6}), *list(config)[1:]))
    assert room(capped, {"a": use(2), "b": use(1)}, CAPACITY, "a", "*") == 3
    assert room(config, {"a": use(2), "b": use(4)}, CAPACITY, "a", "*") == 2
    with pytest.raises(ValidationError):
        room(config, {}, CAPACITY, "org", "*")
