"""Usage reports: the ledger's hourly rows summed per queue, user or GPU model, with their cost.

Cost is ``Σ GPU-hours × the model's price per GPU-hour + kWh × the price per kWh``. A model's price is
the one configured for exactly that model name, else for the longest configured name found in it
(case-insensitive: ``H100`` prices ``NVIDIA H100 80GB HBM3``), else 0.

Example::

    prices = Prices({"H100": 2.5}, per_kwh=0.2)
    rows = summarize([(hour, rows)], by="queue", prices=prices)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from common.errors import ValidationError
from coordinator.usage.ledger import RowKey, Rows

__all__ = ["BY", "Prices", "ReportRow", "summarize"]

BY = ("queue", "user", "model")
"""What a report's rows are keyed by."""

DEFAULT_QUEUE = "default"
"""The name the implicit queue (``""``) is reported under."""


@dataclass(frozen=True)
class Prices:
    """Prices per GPU-hour by model name, and per kWh: the coordinator's ``--price-gpu-hour`` and
    ``--price-kwh`` flags. The only prices in gptrm; the queue tree has none (``cost`` budgets are
    read from the cost of :func:`summarize`'s rows)."""

    per_gpu_hour: Mapping[str, float] = field(default_factory=dict)
    per_kwh: float = 0.0

    def gpu_hour(self, model: str) -> float:
        """The price of one GPU-hour of ``model`` (module docstring: exact name, else the longest
        configured name found in it, case-insensitive, else 0)."""
        if model in self.per_gpu_hour:
            return self.per_gpu_hour[model]
        found = [name for name in self.per_gpu_hour if name and name.lower() in model.lower()]
        return self.per_gpu_hour[max(found, key=len)] if found else 0.0


@dataclass
class ReportRow:
    """One key's usage over a report's period."""

    key: str
    gpu_hours_by_model: dict[str, float] = field(default_factory=dict)
    cpu_core_hours: float = 0.0
    energy_kwh: float = 0.0
    tasks: int = 0
    cost: float = 0.0

    @property
    def gpu_hours(self) -> float:
        return sum(self.gpu_hours_by_model.values())


def _key(row: RowKey, by: str) -> str:
    if by == "queue":
        return row.queue or DEFAULT_QUEUE
    if by == "user":
        return row.user
    return row.gpu_model


def summarize(hours: Iterable[Rows], *, by: str, prices: Prices) -> list[ReportRow]:
    """The rows of ``hours`` added up per ``by`` (queue, user or model), ordered by key.

    :raises ValidationError: ``by`` is not one of :data:`BY`.
    """
    if by not in BY:
        raise ValidationError("by", f"must be one of {', '.join(BY)}, got {by!r}")
    out: dict[str, ReportRow] = {}
    for rows in hours:
        for key, usage in rows.items():
            row = out.setdefault(_key(key, by), ReportRow(_key(key, by)))
            if usage.gpu_s > 0:
                row.gpu_hours_by_model[key.gpu_model] = row.gpu_hours_by_model.get(key.gpu_model, 0.0) + \
                    usage.gpu_s / 3600
            row.cpu_core_hours += usage.cpu_core_s / 3600
            row.energy_kwh += usage.energy_j / 3.6e6
            row.tasks += usage.tasks
    for row in out.values():
        row.cost = sum(hours * prices.gpu_hour(model) for model, hours in row.gpu_hours_by_model.items()) \
            + row.energy_kwh * prices.per_kwh
    return [out[k] for k in sorted(out)]
