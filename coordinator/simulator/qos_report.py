"""What preemption buys the high classes and costs the low one: per-priority queueing delay with and
without preemption (``gptrmctl simulate --qos``).

A job's queueing delay is the time it spent waiting: completion − submission − its duration − the
run time it lost to preemptions (so a preempted job's waits after each preemption count, the run it
lost does not). Lost GPU-time is that lost run time × the job's GPUs over all its nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from coordinator.simulator.engine import SimJob, SimResult

__all__ = ["CLASS_NAMES", "class_stats", "qos_table"]

CLASS_NAMES: dict[int, str] = {20: "high (Guaranteed/LS)", 10: "middle (Burstable)", 0: "low (BE)"}
"""Row labels of the priorities :func:`coordinator.simulator.qos.priority_of` gives."""


def class_stats(result: SimResult, jobs: Sequence[SimJob]) -> dict[int, dict[str, Any]]:
    """Per priority: finished jobs, mean and p99 queueing delay, lost GPU-hours, preemptions suffered.

    :param result: one replay.
    :param jobs: the jobs it replayed.
    :returns: ``priority → stats``, highest priority first.
    """
    by_id = {j.request.task_id: j for j in jobs}
    waits: dict[int, list[float]] = {}
    lost_gpu_s: dict[int, float] = {}
    preempted: dict[int, int] = {}
    for r in result.jobs:
        job = by_id[r.job_id]
        prio = job.request.priority
        count, lost_s = result.preempted.get(r.job_id, (0, 0.0))
        waits.setdefault(prio, []).append(max(0.0, r.end_s - r.submit_s - job.duration_s - lost_s))
        lost_gpu_s[prio] = lost_gpu_s.get(prio, 0.0) + lost_s * job.request.compute_demand
        preempted[prio] = preempted.get(prio, 0) + count
    out: dict[int, dict[str, Any]] = {}
    for prio in sorted(waits, reverse=True):
        w = np.array(waits[prio])
        out[prio] = {"jobs": len(w), "delay_mean_s": float(w.mean()), "delay_p99_s": float(np.percentile(w, 99)),
                     "lost_gpu_h": lost_gpu_s[prio] / 3600, "preempted": preempted[prio]}
    return out


def qos_table(runs: Mapping[str, tuple[SimResult, SimResult]], jobs: Sequence[SimJob]) -> str:
    """A markdown table: per policy and priority class, delay without → with preemption, and the cost.

    :param runs: policy → (replay without preemption, replay with it).
    :param jobs: the jobs replayed.
    :returns: the table, ending with a newline.
    """
    lines = ["| policy | class | jobs | mean delay s (off → on) | p99 delay s (off → on) | lost GPU-h (on) "
             "| times preempted (on) |", "|---|---|---|---|---|---|---|"]
    for policy, (off, on) in runs.items():
        a, b = class_stats(off, jobs), class_stats(on, jobs)
        for prio in sorted(set(a) | set(b), reverse=True):
            x, y = a.get(prio, {}), b.get(prio, {})
            lines.append(
                f"| {policy} | {CLASS_NAMES.get(prio, f'priority {prio}')} | {y.get('jobs', x.get('jobs', 0)):,} "
                f"| {x.get('delay_mean_s', 0.0):,.0f} → {y.get('delay_mean_s', 0.0):,.0f} "
                f"| {x.get('delay_p99_s', 0.0):,.0f} → {y.get('delay_p99_s', 0.0):,.0f} "
                f"| {y.get('lost_gpu_h', 0.0):,.1f} | {y.get('preempted', 0):,} |")
        lines.append(f"| {policy} | all | | | | | preemptions: {on.metrics.get('preemptions', 0):,}; "
                     f"unplaced off/on: {off.metrics['unplaced_jobs']}/{on.metrics['unplaced_jobs']} |")
    return "\n".join(lines) + "\n"
