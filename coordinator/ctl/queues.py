"""``gptrmctl queues``: the team queues, what each holds and waits for, and the admin's changes.

- ``gptrmctl queues [NAME]``: every queue in tree order (or one): quota, limit and lend per GPU
  model, weight, what it holds within its quota and borrowed, running and pending tasks, its place
  in the fair-share order, its budget.
- ``gptrmctl queues set NAME [--parent P] --gpus N [--gpu-model M] [--limit L] [--lend L]
  [--weight W] [--cpu C] [--mem-gib G] [--members A,B] [--default-for A,B] [--budget KIND:AMOUNT/PERIOD[:ACTION]]``:
  create a queue, or change one (flags not given keep their value; ``--gpu-model`` chooses which
  model's quota ``--gpus``, ``--limit`` and ``--lend`` set, ``*`` by default).
- ``gptrmctl queues rm NAME``: remove a queue that holds and waits for nothing and has no children.

``set`` and ``rm`` are words of the command: a queue cannot be named ``set`` or ``rm``.
The ``-o json`` document is pinned by ``schemas/queues.json``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping
from typing import Any

from common.errors import UsageError
from common.pb.gptrm.v1 import admin_pb2
from coordinator.ctl import human

__all__ = ["add_queues_parser", "queue_dict", "queue_update", "queues_dict", "queues_table"]

_BUDGET = re.compile(r"^(gpu_hours|kwh|cost):([0-9]+(?:\.[0-9]+)?)/(day|week|month)(?::(hold|lowest))?$")


def add_queues_parser(sub: Any, fn: Callable[..., Any]) -> None:
    """The ``queues`` subcommand."""
    sp = sub.add_parser("queues", help="team queues: queues [NAME] | queues set NAME --gpus N ... | queues rm NAME")
    sp.add_argument("words", nargs="*", metavar="[set|rm] NAME", help="a queue to show, or set/rm and the queue")
    sp.add_argument("--parent", help="the queue above it (an organisation); '' makes it a root")
    sp.add_argument("--gpus", type=_count, metavar="N", help="GPUs guaranteed (its quota) of --gpu-model")
    sp.add_argument("--gpu-model", default="*", metavar="M", help="the GPU model the quota is of (default * any)")
    sp.add_argument("--limit", type=_count_or_none, metavar="L", default=argparse.SUPPRESS,
                    help="most GPUs of the model it may hold, borrowed included ('none': no limit)")
    sp.add_argument("--lend", type=_count_or_none, metavar="L", default=argparse.SUPPRESS,
                    help="how much of its idle quota others may borrow ('all': all of it)")
    sp.add_argument("--weight", type=float, metavar="W", help="its share of what nobody is guaranteed (default 1)")
    sp.add_argument("--cpu", type=float, metavar="C", help="cores it may hold (a cap)")
    sp.add_argument("--mem-gib", type=float, metavar="G", help="memory it may hold, GiB (a cap)")
    sp.add_argument("--members", metavar="A,B", help="identities that may submit to it (* anyone)")
    sp.add_argument("--default-for", metavar="A,B", help="identities whose default queue it is")
    sp.add_argument("--mount-allowed", metavar="DIR,DIR",
                    help="host directories its tasks (and its sub-queues') may mount into their containers, beyond "
                         "the coordinator's --mount-allowed ('' none; docs/containers.md)")
    sp.add_argument("--budget", metavar="KIND:AMOUNT/PERIOD[:ACTION]",
                    help="gpu_hours|kwh|cost : amount / day|week|month [: hold|lowest] ('none' removes it)")
    for flag, what in (("--default-time", "time limit of its tasks that give none (4h, 1:30:00)"),
                       ("--max-time", "the longest time limit its tasks may ask for"),
                       ("--default-min-runtime", "protected run time of its tasks that give none"),
                       ("--grace", "checkpoint grace of its tasks that give none: signal, then stop after it")):
        sp.add_argument(flag, type=_duration, metavar="DURATION", help=f"{what} ('none' removes it)")
    sp.set_defaults(fn=fn)


def _duration(text: str) -> float:
    """A queue's time setting: a duration as ``submit --time`` takes it; ``none`` (0) removes it."""
    from coordinator.profiler.qos_spec import parse_time_limit

    if text.strip().lower() == "none":
        return 0.0
    try:
        return parse_time_limit(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of GPUs, got {text!r}") from None
    if not 0 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{value} is out of range 0..1000000")
    return value


def _count_or_none(text: str) -> int | None:
    return None if text in ("none", "all") else _count(text)


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [n for n in (s.strip() for s in text.split(",")) if n]


def queue_update(current: admin_pb2.Queue | None, name: str, args: argparse.Namespace) -> admin_pb2.Queue:
    """The queue ``set`` sends: ``current`` (None: a new queue) with the flags given applied.

    :raises UsageError: a new queue without ``--gpus``, or a malformed ``--budget``."""
    q = admin_pb2.Queue(name=name, weight=1.0)
    if current is not None:
        q.CopyFrom(current)
    elif args.gpus is None:
        raise UsageError(f"queues set {name}: a new queue needs --gpus N (its quota; 0 for none)")
    if args.parent is not None:
        q.parent = args.parent
    given = vars(args)
    if args.gpus is not None or "limit" in given or "lend" in given:
        model = args.gpu_model or "*"
        quota = next((x for x in q.quotas if x.gpu_model == model), None)
        if quota is None:
            quota = q.quotas.add(gpu_model=model)
        if args.gpus is not None:
            quota.gpus = args.gpus
        if "limit" in given:
            quota.has_limit, quota.limit = given["limit"] is not None, given["limit"] or 0
        if "lend" in given:
            quota.has_lend, quota.lend = given["lend"] is not None, given["lend"] or 0
    if args.weight is not None:
        q.weight = args.weight
    if args.cpu is not None:
        q.has_cpu, q.cpu = True, args.cpu
    if args.mem_gib is not None:
        q.has_mem_gib, q.mem_gib = True, args.mem_gib
    for field, value in (("default_time_limit_s", args.default_time), ("max_time_limit_s", args.max_time),
                         ("default_min_runtime_s", args.default_min_runtime), ("grace_s", args.grace)):
        if value is not None:
            setattr(q, field, value)
    for field, text in (("members", args.members), ("default_for", args.default_for),
                        ("mount_allowed", args.mount_allowed)):
        names = _names(text)
        if names is not None:
            del getattr(q, field)[:]
            getattr(q, field).extend(names)
    if args.budget is not None:
        if args.budget == "none":
            q.ClearField("budget")
            q.has_budget = False
        else:
            m = _BUDGET.match(args.budget.strip())
            if m is None:
                raise UsageError(f"--budget: expected KIND:AMOUNT/PERIOD[:ACTION] such as gpu_hours:500/week:hold, "
                                 f"got {args.budget[:64]!r}")
            q.has_budget = True
            q.budget.CopyFrom(admin_pb2.QueueBudget(kind=m.group(1), amount=float(m.group(2)), period=m.group(3),
                                                    action=m.group(4) or "hold"))
    return q


def queue_dict(v: admin_pb2.QueueView) -> dict[str, Any]:
    """One queue of the ``queues`` document; ``queues set``'s adds ``existing_work`` (what the change did with
    existing tasks)."""
    q = v.queue
    out = {
        "name": q.name,
        "parent": q.parent or None,
        "leaf": v.leaf,
        "weight": q.weight,
        "quotas": [{"gpu_model": x.gpu_model, "gpus": x.gpus, "limit": x.limit if x.has_limit else None,
                    "lend": x.lend if x.has_lend else None} for x in q.quotas],
        "cpu": q.cpu if q.has_cpu else None,
        "mem_gib": q.mem_gib if q.has_mem_gib else None,
        "members": list(q.members),
        "default_for": list(q.default_for),
        "mount_allowed": list(q.mount_allowed),
        "budget": ({"kind": q.budget.kind, "amount": q.budget.amount, "period": q.budget.period,
                    "action": q.budget.action} if q.has_budget else None),
        "held": [{"gpu_model": h.gpu_model, "own": h.own, "borrowed": h.borrowed} for h in v.held],
        "running": v.running,
        "pending": v.pending,
        "fair_order": v.fair_order,
        "budget_used": v.budget_used,
        "budget_gate": v.budget_gate or "run",
        "default_time_limit_s": q.default_time_limit_s or None,
        "max_time_limit_s": q.max_time_limit_s or None,
        "default_min_runtime_s": q.default_min_runtime_s or None,
        "grace_s": q.grace_s or None,
    }
    if v.existing_work:
        out["existing_work"] = v.existing_work
    return out


def queues_dict(resp: admin_pb2.ListQueuesResponse) -> dict[str, Any]:
    """The ``queues`` document (schema ``queues.json``)."""
    return {"managed": resp.managed, "half_life_h": resp.half_life_h, "stale": resp.stale,
            "queues": [queue_dict(v) for v in resp.queues]}


def _quota_text(quotas: list[Mapping[str, Any]], what: str) -> str:
    parts = []
    for x in quotas:
        value = x[what]
        if what != "gpus" and value is None:
            continue
        parts.append(f"{value}" if x["gpu_model"] == "*" else f"{x['gpu_model']}={value}")
    return ",".join(parts) or ("-" if what == "gpus" else "none" if what == "limit" else "all")


def queues_table(d: Mapping[str, Any]) -> str:
    """``gptrmctl queues``: one row per queue, indented under its parent."""
    if not d["managed"]:
        return "no queues configured: every task runs in the default queue (gptrmctl queues set NAME --gpus N)"
    depth: dict[str, int] = {}
    rows = []
    for q in d["queues"]:
        depth[q["name"]] = depth.get(q["parent"], -1) + 1 if q["parent"] else 0
        own = sum(h["own"] for h in q["held"])
        borrowed = sum(h["borrowed"] for h in q["held"])
        budget = "-"
        if q["budget"]:
            b = q["budget"]
            budget = f"{q['budget_used'] * 100:.0f}% of {b['amount']:g} {b['kind']}/{b['period']}"
            if q["budget_gate"] != "run":
                budget += f" ({q['budget_gate']})"
        rows.append(["  " * depth[q["name"]] + human.truncate(q["name"], 40), _quota_text(q["quotas"], "gpus"),
                     _quota_text(q["quotas"], "limit"), _quota_text(q["quotas"], "lend"), f"{q['weight']:g}",
                     own, borrowed, q["running"], q["pending"], q["fair_order"] or "-", budget])
    headers = ["QUEUE", "QUOTA", "LIMIT", "LEND", "WEIGHT", "OWN", "BORROWED", "RUNNING", "PENDING", "FAIR", "BUDGET"]
    head = f"fair share: weighted dominant share, decayed usage half-life {d['half_life_h']:g} h"
    return head + "\n" + human.table(headers, rows, right=(5, 6, 7, 8, 9))
