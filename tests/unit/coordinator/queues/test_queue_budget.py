"""Budgets: calendar periods in UTC, the fraction used, the lines an accounting pass crossed, the gate
past 100 %."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.queues import (
    Budget,
    BudgetState,
    Queue,
    budget_gate,
    budget_state,
    lines_crossed,
    period_start,
)

H100 = "NVIDIA H100 80GB HBM3"


def ts(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def test_period_start_is_the_utc_calendar_period() -> None:
    now = ts(2026, 11, 25, 17, 30)                 # a Wednesday
    assert period_start("day", now) == ts(2026, 11, 25)
    assert period_start("week", now) == ts(2026, 11, 23)      # Monday
    assert period_start("month", now) == ts(2026, 11, 1)
    assert period_start("week", ts(2026, 11, 23)) == ts(2026, 11, 23)
    assert period_start("month", ts(2026, 3, 1, 0, 0, 1)) == ts(2026, 3, 1)


@given(st.floats(0, 4e9), st.sampled_from(["day", "week", "month"]))
def test_period_start_is_at_or_before_now(now: float, period: str) -> None:
    start = period_start(period, now)  # type: ignore[arg-type]
    assert start <= now
    assert period_start(period, start) == start  # type: ignore[arg-type]


def test_budget_state_is_the_fraction_and_the_period() -> None:
    budget = Budget("gpu_hours", 200, "month", "hold")
    state = budget_state(budget, 150, ts(2026, 11, 25))
    assert state == BudgetState(0.75, ts(2026, 11, 1))
    fraction, start = state                       # unpacks as a pair
    assert (fraction, start) == (0.75, ts(2026, 11, 1))
    assert budget_state(budget, 300, ts(2026, 11, 25)).fraction == 1.5
    assert budget_state(budget, -5, ts(2026, 11, 25)).fraction == 0.0


def test_a_pass_crosses_the_lines_between_its_before_and_after() -> None:
    assert lines_crossed(0.5, 0.79) == []
    assert lines_crossed(0.79, 0.8) == [0.8]
    assert lines_crossed(0.56, 1.67) == [0.8, 1.0]          # one pass past both: both announced
    assert lines_crossed(0.85, 0.9) == []                   # already past: no repeat
    assert lines_crossed(0.9, 1.0) == [1.0]
    assert lines_crossed(1.2, 1.5) == []
    assert lines_crossed(0.0, 0.95, lines=(0.5,)) == [0.5]


@given(st.lists(st.floats(0, 0.5), min_size=1, max_size=30))
def test_each_line_is_crossed_by_one_pass_of_a_period(additions: list[float]) -> None:
    """Passes add to what the passes before them stored: each line reached is crossed by exactly one pass."""
    used, fired = 0.0, []
    for added in additions:
        fired += lines_crossed(used, used + added)
        used += added
    assert fired == [line for line in (0.8, 1.0) if used >= line]


@pytest.mark.parametrize(("action", "fraction", "others_waiting", "gate"), [
    ("hold", 0.99, True, "run"),
    ("hold", 1.0, False, "hold"),
    ("lowest", 1.2, False, "lowest"),
    ("lowest", 1.2, True, "hold"),
    ("lowest", 0.5, True, "run"),
])
def test_budget_gate(action: str, fraction: float, others_waiting: bool, gate: str) -> None:
    queue = Queue("a", budget=Budget("kwh", 10, "day", action))  # type: ignore[arg-type]
    assert budget_gate(queue, BudgetState(fraction, 0.0), others_waiting) == gate


def test_budget_gate_without_budget_or_reading_runs() -> None:
    assert budget_gate(Queue("a"), BudgetState(5.0, 0.0), True) == "run"
    assert budget_gate(Queue("a", budget=Budget("kwh", 1)), None, True) == "run"
