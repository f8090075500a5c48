"""``gptrmctl usage``: accounted usage and cost per queue, user or GPU model (like Slurm's sreport).

Times (``--since``, ``--until``) are ISO dates or times (``2026-11-01``, ``2026-11-01T08:00``,
``2026-11-01T08:00+01:00``; without an offset they are UTC), ``now``, or an age: a number and a unit
(``90m``, ``24h``, ``7d``, ``2w``) before now. The coordinator reports whole hours (UTC) holding the
period.

The ``-o json`` document is pinned by ``schemas/usage.json``; ``-o csv`` writes a header row and one row
per key (a cell that a spreadsheet would read as a formula starts with ``'``).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from common.errors import UsageError
from common.pb.gptrm.v1 import admin_pb2
from coordinator.ctl import human

__all__ = ["CSV_COLUMNS", "parse_time", "usage_csv", "usage_dict", "usage_table"]

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

CSV_COLUMNS = ("key", "gpu_hours", "cpu_core_hours", "energy_kwh", "cost", "tasks", "gpu_hours_by_model")
"""The CSV header (``gpu_hours_by_model`` is ``MODEL=HOURS`` pairs separated by ``;``)."""


def parse_time(text: str, now: float, what: str) -> float:
    """``text`` (ISO date or time, ``now``, or an age such as ``7d``) as unix seconds.

    :raises UsageError: naming ``what`` (the flag).
    """
    if text.strip().lower() == "now":
        return now
    m = _AGE.match(text)
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"{what}: expected an ISO date or time (2026-11-01, 2026-11-01T08:00), now, or an age "
                         f"(24h, 7d), got {text[:64]!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    value = when.timestamp()
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{what}: {text[:64]!r} is before 1970")
    return value


def _row(r: admin_pb2.UsageReportRow | None, key: str = "") -> dict[str, Any]:
    if r is None:
        return {"key": key, "gpu_hours": 0.0, "gpu_hours_by_model": {}, "cpu_core_hours": 0.0, "energy_kwh": 0.0,
                "cost": 0.0, "tasks": 0}
    return {"key": r.key, "gpu_hours": r.gpu_hours, "gpu_hours_by_model": dict(sorted(r.gpu_hours_by_model.items())),
            "cpu_core_hours": r.cpu_core_hours, "energy_kwh": r.energy_kwh, "cost": r.cost, "tasks": r.tasks}


def usage_dict(report: admin_pb2.UsageReport) -> dict[str, Any]:
    """The ``usage`` document (schema ``usage.json``): the rows by key and their total."""
    rows = [_row(r) for r in report.rows]
    total = _row(None)
    del total["key"]
    for r in rows:
        for name in ("gpu_hours", "cpu_core_hours", "energy_kwh", "cost", "tasks"):
            total[name] += r[name]
        for model, hours in r["gpu_hours_by_model"].items():
            total["gpu_hours_by_model"][model] = total["gpu_hours_by_model"].get(model, 0.0) + hours
    total["gpu_hours_by_model"] = dict(sorted(total["gpu_hours_by_model"].items()))
    return {
        "since_unix_s": report.since_unix_s,
        "until_unix_s": report.until_unix_s,
        "by": report.by,
        "accounted_until_unix_s": report.accounted_until_unix_s or None,
        "prices": {"gpu_hour": dict(sorted(report.price_gpu_hour.items())), "kwh": report.price_kwh},
        "rows": rows,
        "total": total,
        "budgets": [{"queue": b.queue, "kind": b.kind, "amount": b.amount, "period": b.period, "action": b.action,
                     "fraction": b.fraction, "gate": b.gate} for b in report.budgets],
    }


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def _models(by_model: Mapping[str, float]) -> str:
    return ", ".join(f"{m or '-'} {h:.2f}" for m, h in by_model.items()) or "-"


def usage_table(d: Mapping[str, Any]) -> str:
    """``gptrmctl usage``: the period, one row per key and the total."""
    label = {"queue": "QUEUE", "user": "USER", "model": "GPU MODEL"}.get(d["by"], d["by"].upper())
    headers = [label, "GPU-HOURS", "CPU-CORE-HOURS", "ENERGY (kWh)", "COST", "TASKS"]
    if d["by"] != "model":
        headers.append("GPU-HOURS BY MODEL")
    rows = []
    for r in [*d["rows"], {**d["total"], "key": "TOTAL"}]:
        row = [human.truncate(r["key"] or "-", 40), f"{r['gpu_hours']:.2f}", f"{r['cpu_core_hours']:.2f}",
               f"{r['energy_kwh']:.3f}", f"{r['cost']:.2f}", r["tasks"]]
        if d["by"] != "model":
            row.append(human.truncate(_models(r["gpu_hours_by_model"]), 60))
        rows.append(row)
    head = f"usage {_when(d['since_unix_s'])} → {_when(d['until_unix_s'])} by {d['by']}"
    if d["accounted_until_unix_s"]:
        head += f" (accounted until {_when(d['accounted_until_unix_s'])})"
    text = head + "\n" + human.table(headers, rows, right=(1, 2, 3, 4, 5))
    if d.get("budgets"):
        text += "\nbudgets (current period):\n" + human.table(
            ["QUEUE", "BUDGET", "USED", "NEW WORK"],
            [[human.truncate(b["queue"], 40), f"{b['amount']:g} {b['kind']}/{b['period']} ({b['action']})",
              f"{b['fraction'] * 100:.0f}%", b["gate"]] for b in d["budgets"]], right=(2,))
    return text


def _cell(value: Any) -> str:
    text = str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def usage_csv(d: Mapping[str, Any]) -> str:
    """The rows as CSV with a header row (:data:`CSV_COLUMNS`); numbers with 10 significant digits."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in d["rows"]:
        models = ";".join(f"{m}={h:.10g}" for m, h in r["gpu_hours_by_model"].items())
        writer.writerow([_cell(r["key"]), f"{r['gpu_hours']:.10g}", f"{r['cpu_core_hours']:.10g}",
                         f"{r['energy_kwh']:.10g}", f"{r['cost']:.10g}", r["tasks"], _cell(models)])
    return out.getvalue().rstrip("\n")


def add_usage_parser(sub: Any, fn: Callable[..., Any]) -> None:
    """The ``usage`` subcommand."""
    sp = sub.add_parser("usage", help="accounted GPU-hours, CPU core-hours, energy and cost per queue, user or "
                        "GPU model (whole hours, UTC)")
    sp.add_argument("--since", default="7d", metavar="T",
                    help="start: ISO date/time (UTC unless it has an offset), now, or an age like 24h, 7d "
                    "(default: 7d)")
    sp.add_argument("--until", default="now", metavar="T", help="end, like --since (default: now)")
    sp.add_argument("--by", choices=("queue", "user", "model"), default="queue", help="one row per (default queue)")
    sp.set_defaults(fn=fn)


def usage_request(args: argparse.Namespace, now: Callable[[], float] = time.time) -> admin_pb2.UsageRequest:
    """The request for ``args`` (``--since``, ``--until``, ``--by``).

    :raises UsageError: a time does not parse, or the period is empty.
    """
    t = now()
    since, until = parse_time(args.since, t, "--since"), parse_time(args.until, t, "--until")
    if not since < until:
        raise UsageError(f"--since: {args.since!r} is not before --until {args.until!r}")
    return admin_pb2.UsageRequest(since_unix_s=since, until_unix_s=until, by=args.by)
