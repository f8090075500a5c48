"""Budgets: calendar periods in UTC, the fraction used, the 80 % warning once per period, the gate
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
    period_start,
    warning_due,
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


def test_warning_fires_once_per_period() -> None:
    nov, dec = ts(2026, 11, 1), ts(2026, 12, 1)
    assert not warning_due(None, BudgetState(0.5, nov))
    assert warning_due(None, BudgetState(0.8, nov))                        # first reading already past
    assert warning_due(BudgetState(0.79, nov), BudgetState(0.8, nov))      # crossed
    assert not warning_due(BudgetState(0.85, nov), BudgetState(0.9, nov))  # already past: no repeat
    assert not warning_due(BudgetState(0.9, nov), BudgetState(0.1, dec))   # new period, below
    assert warning_due(BudgetState(0.9, nov), BudgetState(0.95, dec))      # new period, past again
    assert warning_due(BudgetState(0.1, nov), BudgetState(0.5, nov), line=0.5)


@given(st.lists(st.floats(0, 2), min_size=1, max_size=30))
def test_warning_fires_at_most_once_within_a_rising_period(readings: list[float]) -> None:
    rising = sorted(readings)
    previous: BudgetState | None = None
    fired = 0
    for fraction in rising:
        current = BudgetState(fraction, 0.0)
        fired += warning_due(previous, current)
        previous = current
    assert fired == (1 if rising[-1] >= 0.8 else 0)


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
