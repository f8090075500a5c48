"""Team queues under contention: quotas generated from a trace, per-queue figures, per-job records.

- :func:`proportional_queues` — one leaf queue per trace group, quota proportional to the group's
  GPU-hours in the replayed jobs (largest-remainder rounding, summing to at most the cluster's
  GPUs), lending everything, no limit, weight 1. :func:`strict` makes every leaf's ``limit`` its
  quota (nobody borrows).
- :func:`queue_stats` — per queue, over the **contended time** of a run (the instants when the GPUs
  of running plus pending jobs exceed the cluster's GPUs): GPU-hours of its *entitlement*
  ``min(quota, its demand)`` (demand: the whole GPUs of its running and pending jobs), GPU-hours it
  *received* (held by its running jobs), ``share = received / entitlement`` (can pass 1 when it
  borrows) and ``met = ∫ min(received, entitlement) / ∫ entitlement`` (the entitlement actually
  covered, never above 1); and over all its jobs the waiting time (mean, p95), GPU-hours held,
  preemptions suffered and jobs that never finished. A job's waiting time is its final end − its
  submission − the time it ran (every run, preempted ones included), i.e. the first start −
  submission for a job never preempted.
- :func:`write_records` — one CSV row per run of a job, with the header :data:`RECORDS_HEADER`, so
  every figure above can be recomputed from it (a preempted job has one row per run; a job that
  never started has one row with empty ``start_s`` and ``end_s``).

GPUs are whole GPUs over all a job's nodes, as the queues count them
(:func:`coordinator.simulator.queues.whole_gpus`); times are seconds from the replay's first
submission.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from coordinator.queues import ANY_MODEL, Queue, QueueConfig
from coordinator.simulator.engine import SimJob, SimResult
from coordinator.simulator.queues import whole_gpus

__all__ = ["RECORDS_HEADER", "proportional_queues", "queue_stats", "queue_table_rows", "strict", "write_records"]

RECORDS_HEADER = ("job_id", "queue", "submit_s", "start_s", "end_s", "gpus", "nodes", "resizes")
"""The records file's columns; ``resizes`` is empty but for an elastic job that was resized: then every row
of it holds ``time:size`` pairs separated by ``;``, the start and GPUs of each run after a resize."""


def proportional_queues(jobs: Sequence[SimJob], cluster_gpus: int) -> QueueConfig:
    """One leaf queue per job queue, quota proportional to its GPU-hours (module docstring).

    :param jobs: the replayed jobs (their :attr:`~SimJob.queue`, whole GPUs and duration).
    :param cluster_gpus: the replayed cluster's GPUs.
    :returns: the configuration (quotas under ``"*"``, summing to at most ``cluster_gpus``).
    """
    hours: dict[str, float] = defaultdict(float)
    for j in jobs:
        hours[j.queue] += whole_gpus(j.request) * j.duration_s / 3600
    total = sum(hours.values())
    names = sorted(hours)
    exact = {q: cluster_gpus * hours[q] / total if total > 0 else 0.0 for q in names}
    quota = {q: math.floor(exact[q]) for q in names}
    left = cluster_gpus - sum(quota.values()) if total > 0 else 0
    for q in sorted(names, key=lambda q: (-(exact[q] - quota[q]), q))[:max(0, left)]:
        quota[q] += 1
    return QueueConfig(queues=tuple(Queue(name=q, gpus={ANY_MODEL: quota[q]}) for q in names))


def strict(config: QueueConfig) -> QueueConfig:
    """``config`` with every leaf queue's ``limit`` set to its quota in each of its pools (nobody borrows)."""
    queues = []
    for q in config:
        if config.is_leaf(q.name):
            q = replace(q, limit={**dict(q.gpus), ANY_MODEL: q.quota_in(ANY_MODEL)})
        queues.append(q)
    return replace(config, queues=tuple(queues))


def _quota(config: QueueConfig, queue: str) -> int:
    """A queue's quota over every pool (0 for a queue the configuration does not have)."""
    return sum(config.get(queue).gpus.values()) if queue in config else 0


def queue_stats(result: SimResult, jobs: Sequence[SimJob], config: QueueConfig, cluster_gpus: float) -> dict[str, Any]:
    """Per-queue figures of one run under contention (module docstring).

    :param result: the run.
    :param jobs: the jobs it replayed (same order as the simulator's).
    :param config: the queue tree whose quotas define the entitlements (also for a run without queues).
    :param cluster_gpus: the cluster's GPUs.
    :returns: ``{"contended_h", "util", "util_arrivals", "gpu_h", "queues": {queue: figures}}``.
    """
    t0 = min((j.request.submit_s for j in jobs), default=0.0)
    runs_of: dict[int, list[tuple[float, float]]] = defaultdict(list)
    finished: dict[int, float] = {}
    for r in result.runs:
        runs_of[r.job].append((r.start_s, r.end_s))
        if not r.preempted:
            finished[r.job] = r.end_s
    horizon = max([t0, *(j.request.submit_s for j in jobs), *(r.end_s for r in result.runs)])
    events: list[tuple[float, str, int, int]] = []       # (time, queue, Δdemand, Δheld)
    for k, j in enumerate(jobs):
        g = whole_gpus(j.request)
        events.append((j.request.submit_s, j.queue, g, 0))
        events.append((finished.get(k, horizon), j.queue, -g, 0))
        for start, end in runs_of.get(k, ()):
            events += [(start, j.queue, 0, g), (end, j.queue, 0, -g)]
    events.sort(key=lambda e: e[0])
    names = sorted({j.queue for j in jobs} | {q for q in config.leaves()})
    quota = {q: _quota(config, q) for q in names}
    demand: dict[str, int] = defaultdict(int)
    held: dict[str, int] = defaultdict(int)
    ent_s: dict[str, float] = defaultdict(float)
    got_s: dict[str, float] = defaultdict(float)
    met_s: dict[str, float] = defaultdict(float)
    contended_s = 0.0
    total_demand = 0
    i = 0
    while i < len(events):
        now = events[i][0]
        while i < len(events) and events[i][0] == now:
            _, q, dd, dh = events[i]
            demand[q] += dd
            held[q] += dh
            total_demand += dd
            i += 1
        if i == len(events):
            break
        dt = events[i][0] - now
        if dt <= 0 or total_demand <= cluster_gpus:
            continue
        contended_s += dt
        for q in names:
            ent = min(quota[q], demand[q])
            ent_s[q] += ent * dt
            got_s[q] += held[q] * dt
            met_s[q] += min(held[q], ent) * dt
    per_queue: dict[str, dict[str, Any]] = {}
    for q in names:
        ks = [k for k, j in enumerate(jobs) if j.queue == q]
        waits = [finished[k] - jobs[k].request.submit_s - sum(e - s for s, e in runs_of[k])
                 for k in ks if k in finished]
        gpu_s = sum(whole_gpus(jobs[k].request) * sum(e - s for s, e in runs_of.get(k, ())) for k in ks)
        preemptions = sum(result.preempted.get(jobs[k].request.task_id, (0, 0.0))[0] for k in ks)
        w = np.array(waits) if waits else np.zeros(0)
        per_queue[q] = {
            "quota": quota[q], "jobs": len(ks), "unfinished": len(ks) - len(waits),
            "wait_mean_s": float(w.mean()) if len(w) else 0.0,
            "wait_p95_s": float(np.percentile(w, 95)) if len(w) else 0.0,
            "gpu_h": gpu_s / 3600, "preempted": preemptions,
            "entitled_gpu_h": ent_s[q] / 3600, "received_gpu_h": got_s[q] / 3600,
            "share": got_s[q] / ent_s[q] if ent_s[q] > 0 else None,
            "met": met_s[q] / ent_s[q] if ent_s[q] > 0 else None,
        }
    arrivals = result.metrics.get("during_arrivals") or {}
    return {"contended_h": contended_s / 3600, "util": float(result.metrics.get("util_mean", 0.0)),
            "util_arrivals": float(arrivals.get("util_mean", 0.0)),
            "gpu_h": sum(s["gpu_h"] for s in per_queue.values()), "queues": per_queue}


_COLUMNS: tuple[tuple[str, str], ...] = (
    ("quota", "quota"), ("jobs", "jobs"), ("unfinished", "unfinished"), ("wait mean s", "wait_mean_s"),
    ("wait p95 s", "wait_p95_s"), ("GPU-h", "gpu_h"), ("entitled GPU-h", "entitled_gpu_h"),
    ("received GPU-h", "received_gpu_h"), ("share", "share"), ("met", "met"), ("preempted", "preempted"),
)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "—"
    if key in ("share", "met"):
        return f"{100 * value:.1f} %"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:,.1f}"


def queue_table_rows(stats: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-queue table: one row per run and queue, then one per run for the cluster.

    :param stats: run name → :func:`queue_stats`.
    """
    header = ["run", "queue", *(c[0] for c in _COLUMNS)]
    rows: list[list[str]] = []
    for run, s in stats.items():
        for q, fig in s["queues"].items():
            rows.append([run, q, *(_cell(key, fig[key]) for _, key in _COLUMNS)])
    for run, s in stats.items():
        rows.append([run, "(cluster)", "", "", "", "", "", f"{s['gpu_h']:,.0f}", "", "",
                     f"util {100 * s['util_arrivals']:.1f} % to last arrival, {100 * s['util']:.1f} % overall",
                     f"contended {s['contended_h']:,.1f} h", ""])
    return header, rows


def write_records(path: Path, result: SimResult, jobs: Sequence[SimJob]) -> None:
    """The per-job records of one run (module docstring), rows by job then start.

    :param path: the CSV file to write.
    :param result: the run.
    :param jobs: the jobs it replayed.
    """
    t0 = min((j.request.submit_s for j in jobs), default=0.0)
    runs_of: dict[int, list[tuple[float, float, float, int]]] = defaultdict(list)
    resized: set[int] = set()
    for r in result.runs:
        runs_of[r.job].append((r.start_s, r.end_s, r.placement.demand.gpus * len(r.placement.node_ids),
                               len(r.placement.node_ids)))
        if r.resized:
            resized.add(r.job)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(RECORDS_HEADER)
        for k, j in enumerate(jobs):
            req = j.request
            runs = sorted(runs_of.get(k, ()))
            if not runs:
                w.writerow([req.task_id, j.queue, _t(req.submit_s - t0), "", "", f"{whole_gpus(req)}", req.nodes, ""])
            sizes = ";".join(f"{_t(start - t0)}:{gpus:g}" for start, _e, gpus, _n in runs[1:]) if k in resized else ""
            for start, end, gpus, nodes in runs:
                w.writerow([req.task_id, j.queue, _t(req.submit_s - t0), _t(start - t0), _t(end - t0), f"{gpus:g}",
                            nodes, sizes])


def _t(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".")
