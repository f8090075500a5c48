"""Budgets: how much of its :class:`~coordinator.queues.model.Budget` a queue has used,
when to warn, and what its new work may do past 100 %.

- :func:`period_start` — the start of the calendar period (UTC) that holds ``now``: midnight for
  ``day``, Monday midnight for ``week``, the first of the month for ``month``.
- :func:`budget_state` — ``(fraction, period_start)``: the fraction of the budget that ``used``
  (consumed since the period start, in the budget's unit) makes. What was consumed comes from the
  usage report rows (:func:`coordinator.usage.report.summarize`): their GPU-hours, kWh or cost,
  the cost at the coordinator's ``--price-gpu-hour``/``--price-kwh`` prices.
- :func:`lines_crossed` — which of the lines (:data:`WARN_FRACTION`, 80 %, and 100 %) an accounting
  pass crossed: the pass that took the period's fraction from under a line to at or past it, however
  far past (a pass from 56 % to 167 % crosses both). Each pass adds to what the passes before it
  stored, so within a period every line is crossed by exactly one pass, whichever leader made it.
- :func:`budget_gate` — the decision for a queue's *new* work: ``run``; ``lowest`` (past 100 %
  with ``action = "lowest"`` and no other queue waiting: run at the lowest priority on capacity
  nobody else waits for); ``hold`` (past 100 % with ``action = "hold"``, or ``lowest`` while
  another queue waits). Running work is never stopped by a budget.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal, NamedTuple

from coordinator.queues.model import Budget, BudgetPeriod, Queue

__all__ = ["WARN_FRACTION", "BudgetState", "Gate", "budget_gate", "budget_state", "lines_crossed", "period_start"]

WARN_FRACTION = 0.8
"""Past this fraction of its budget, a queue's owners are told (once per period)."""
Gate = Literal["run", "lowest", "hold"]


class BudgetState(NamedTuple):
    """A reading of a budget: ``fraction`` used (may pass 1) in the period that began at
    ``period_start`` (seconds since the Unix epoch)."""

    fraction: float
    period_start: float


def period_start(period: BudgetPeriod, now: float) -> float:
    """Start (Unix seconds) of the UTC calendar ``period`` holding ``now`` (Unix seconds)."""
    moment = datetime.fromtimestamp(now, tz=UTC)
    midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start = midnight
    elif period == "week":
        start = midnight - timedelta(days=midnight.weekday())
    else:
        start = midnight.replace(day=1)
    return start.timestamp()


def budget_state(budget: Budget, used: float, now: float) -> BudgetState:
    """``(fraction, period_start)``: ``used`` (since the period began, in the budget's unit) over
    the budget's amount, and when the period holding ``now`` began."""
    return BudgetState(max(0.0, used) / budget.amount, period_start(budget.period, now))


def lines_crossed(before: float, after: float, lines: tuple[float, ...] = (WARN_FRACTION, 1.0)) -> list[float]:
    """The ``lines`` (fractions of a budget) that an accounting pass taking the period's fraction used from
    ``before`` to ``after`` crossed: those with ``before < line <= after``."""
    return [line for line in lines if before < line <= after]


def budget_gate(queue: Queue, state: BudgetState | None, others_waiting: bool) -> Gate:
    """What ``queue``'s new work may do given its budget reading (module docstring).

    :param state: the current reading of ``queue.budget`` (None: not read, taken as unused).
    :param others_waiting: whether another queue has work waiting for capacity.
    """
    if queue.budget is None or state is None or state.fraction < 1.0:
        return "run"
    if queue.budget.action == "hold" or others_waiting:
        return "hold"
    return "lowest"
