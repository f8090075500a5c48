"""``gptrmctl reservations``: GPUs kept for a queue's or users' work during a window (docs/limits-and-reservations.md).

- ``gptrmctl reservations``: every reservation by start time, with its state (upcoming, active, ended), the
  GPUs it keeps now and how many of them its own work holds.
- ``gptrmctl reservations create NAME --gpus N [--gpu-model M] [--nodes N1,N2] --start T (--end T | --duration D)
  (--queue Q | --users U1,U2)``: T is ``now``, an ISO 8601 time or a duration from now (``+2h``, ``30m``).
- ``gptrmctl reservations rm NAME``.

``create`` and ``rm`` are words of the command: a reservation cannot be named ``create`` or ``rm``.
Creating and removing need the admin role. The ``-o json`` document is pinned by ``schemas/reservations.json``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from common.errors import UsageError
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.ctl import human

__all__ = ["add_reservations_parser", "reservation_dict", "reservation_from_args", "reservations_dict",
           "reservations_table"]


def add_reservations_parser(sub: Any, fn: Callable[..., Any]) -> None:
    """The ``reservations`` subcommand."""
    sp = sub.add_parser("reservations", help="GPUs kept for a queue or users in a window: reservations | "
                                             "reservations create NAME ... | reservations rm NAME")
    sp.add_argument("words", nargs="*", metavar="[create|rm] NAME", help="create or rm, and the reservation")
    sp.add_argument("--gpus", type=int, metavar="N", help="GPUs to keep")
    sp.add_argument("--gpu-model", default="", metavar="M", help="only GPUs whose model contains M")
    sp.add_argument("--nodes", metavar="N1,N2", help="only on these nodes")
    sp.add_argument("--start", metavar="TIME", help="now, an ISO 8601 time, or a duration from now (+2h)")
    sp.add_argument("--end", metavar="TIME", help="an ISO 8601 time, or a duration from now")
    sp.add_argument("--duration", metavar="D", help="instead of --end: how long from the start (4h, 1:30:00)")
    sp.add_argument("--queue", metavar="Q", help="the queue whose work may use the GPUs")
    sp.add_argument("--users", metavar="U1,U2", help="or the submitters whose work may use them")
    sp.set_defaults(fn=fn)


def _time(text: str, flag: str, now: float) -> float:
    from coordinator.profiler.qos_spec import parse_deadline

    if text.strip().lower() == "now":
        return now
    try:
        return parse_deadline(text.strip().removeprefix("+"), now)
    except ValueError:
        raise UsageError(f"{flag}: expected now, an ISO 8601 time or a duration such as +2h, got {text[:64]!r}") \
            from None


def reservation_from_args(name: str, args: argparse.Namespace, now: float | None = None) -> types_pb2.Reservation:
    """The reservation ``create`` sends (the coordinator validates it again).

    :raises UsageError: a flag missing or malformed."""
    from coordinator.profiler.qos_spec import parse_time_limit

    now = time.time() if now is None else now
    if args.gpus is None or args.start is None:
        raise UsageError("reservations create: give --gpus N and --start TIME")
    if (args.end is None) == (args.duration is None):
        raise UsageError("reservations create: give --end TIME or --duration D")
    if (args.queue is None) == (args.users is None):
        raise UsageError("reservations create: give --queue Q or --users U1,U2")
    if not 0 < args.gpus < 2**32:
        raise UsageError(f"--gpus: must be a whole number ≥ 1, got {args.gpus}")
    start = _time(args.start, "--start", now)
    if args.duration is not None:
        try:
            end = start + parse_time_limit(args.duration)
        except ValueError as e:
            raise UsageError(f"--duration: {e}") from None
    else:
        end = _time(args.end, "--end", now)
    r = types_pb2.Reservation(name=name, gpus=args.gpus, gpu_model=args.gpu_model or "", start_unix_s=start,
                              end_unix_s=end, queue=args.queue or "")
    r.nodes.extend(n for n in (s.strip() for s in (args.nodes or "").split(",")) if n)
    r.users.extend(u for u in (s.strip() for s in (args.users or "").split(",")) if u)
    return r


def reservation_dict(v: admin_pb2.ReservationView) -> dict[str, Any]:
    """One reservation of the ``reservations`` document."""
    r = v.reservation
    return {
        "name": r.name, "state": v.state, "gpus": r.gpus, "gpu_model": r.gpu_model, "nodes": list(r.nodes),
        "start_unix_s": r.start_unix_s, "end_unix_s": r.end_unix_s, "queue": r.queue or None,
        "users": list(r.users), "created_by": r.created_by, "created_unix_s": r.created_unix_s,
        "held": [{"node_id": h.node_id, "gpu_indices": list(h.gpu_indices)} for h in v.held],
        "used_gpus": v.used_gpus,
    }


def reservations_dict(resp: admin_pb2.ListReservationsResponse) -> dict[str, Any]:
    """The ``reservations`` document (schema ``reservations.json``)."""
    return {"reservations": [reservation_dict(v) for v in resp.reservations]}


def _when(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def reservations_table(d: Mapping[str, Any]) -> str:
    """``gptrmctl reservations``: one row per reservation."""
    if not d["reservations"]:
        return "no reservations (gptrmctl reservations create NAME --gpus N --start T --duration D --queue Q)"
    rows = []
    for r in d["reservations"]:
        held = sum(len(h["gpu_indices"]) for h in r["held"])
        where = ",".join(f"{h['node_id']}:{','.join(map(str, h['gpu_indices']))}" for h in r["held"]) or "-"
        whom = f"queue {r['queue']}" if r["queue"] else "users " + ",".join(r["users"])
        rows.append([human.truncate(r["name"], 40), r["state"].upper(), f"{held}/{r['gpus']}",
                     f"{r['used_gpus']}/{held}", _when(r["start_unix_s"]), _when(r["end_unix_s"]),
                     human.truncate(whom, 40), human.truncate(where, 60)])
    return human.table(["RESERVATION", "STATE", "KEPT", "USED", "START", "END", "FOR", "GPUS"], rows, right=(2, 3))
