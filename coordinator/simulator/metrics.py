"""Time-weighted metrics of a replay, computed incrementally (paper Eq. 1-3 and job statistics).

The recorder keeps running sums over the nodes (Σu, Σu², Σpower, counts) and updates them by
the difference whenever one node changes, so advancing the clock costs O(1) whatever the
cluster size. Between two events everything is constant, so each integral is a sum of
``value × dt`` over the intervals.

Definitions (all over the replay's horizon, from the first submission to the last event):

- ``util_mean`` (Eq. 1): time average of ``U(t) = (1/N_on) Σ_{n on} u_n`` over powered GPU
  nodes, ``u_n`` = GPUs running work / GPUs of the node (CPU-only nodes have no compute
  utilization and are left out). Intervals with no powered GPU node are skipped.
- ``util_std`` (Eq. 2): time average of ``σ(t) = sqrt((1/N_on) Σ_{n on} (u_n − U)²)``.
- ``energy_kwh``, ``mean_power_w`` (Eq. 3): ``∫ Σ_{n on} (idle_n + (max_n − idle_n)·u_n) dt``;
  a powered node with no work still draws its idle power, a powered-down node nothing.
- ``active_node_hours``: ``∫ N_on dt`` over every powered node; ``busy_node_hours``: the same
  over nodes running at least one job.
- ``powered_gpu_hours``: ``∫ Σ_{n on} GPUs_n dt``; ``allocated_gpu_hours``: ``∫ Σ_n used_n dt`` (GPUs
  held by running jobs).
- ``fragmentation``: time average of the GPUs free on partly used nodes (stranded: a job
  needing a whole server cannot use them), as a fraction of the cluster's GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["JobRecord", "MetricsRecorder", "Series", "summarize_jobs"]

_J_PER_KWH = 3.6e6
_LARGE_GPUS = 8.0  # a whole 8-GPU server or more: the jobs that need an empty node
_EPS = 1e-9


@dataclass(slots=True)
class Series:
    """Step-function samples taken after every event timestamp (for plots).

    :param t_s: sample times.
    :param util_mean: Eq. 1 at each time.
    :param util_std: Eq. 2 at each time.
    :param power_w: Eq. 3 at each time.
    :param queue_len: jobs waiting at each time.
    :param powered: powered nodes at each time.
    """

    t_s: list[float] = field(default_factory=list)
    util_mean: list[float] = field(default_factory=list)
    util_std: list[float] = field(default_factory=list)
    power_w: list[float] = field(default_factory=list)
    queue_len: list[int] = field(default_factory=list)
    powered: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to one job.

    :param job_id: the job.
    :param submit_s: submission time.
    :param start_s: when it started running (after any wake-up delay).
    :param end_s: when it finished.
    :param gpus: its compute demand over all its nodes (``Request.compute_demand``).
    :param energy_j: the power of the GPUs it held over its run, as the agent attributes a task's
        energy (each GPU's share of its node's idle and dynamic power, Eq. 3), summed over its nodes.
    """

    job_id: str
    submit_s: float
    start_s: float
    end_s: float
    gpus: float = 0.0
    energy_j: float = 0.0


class MetricsRecorder:
    """Integrates Eq. 1-3 and node-hours over virtual time; nodes change one at a time.

    :param cap_gpus: GPUs per node.
    :param idle_w: idle power per node (watts).
    :param max_w: full-load power per node (watts).
    :param start_s: virtual time the replay starts (every node powered on, no work).
    :param keep_series: record a sample per timestamp for plots.
    :param checkpoint_s: also keep the summary as it stands at this time (e.g. the last
        arrival), in :attr:`checkpoint`; None for none.
    """

    def __init__(
        self,
        cap_gpus: list[float],
        idle_w: list[float],
        max_w: list[float],
        start_s: float,
        *,
        keep_series: bool = True,
        checkpoint_s: float | None = None,
    ) -> None:
        n = len(cap_gpus)
        self.cap = list(cap_gpus)
        self.idle = list(idle_w)
        self.slope = [m - i for m, i in zip(max_w, idle_w, strict=True)]
        self.used = [0.0] * n
        self.powered = [True] * n
        self.busy = [False] * n
        self.total_gpus = float(sum(cap_gpus))
        self.start_s = self.last_s = start_s
        self.series = Series() if keep_series else None
        self.checkpoint_s = checkpoint_s
        self.checkpoint: dict[str, float] | None = None
        # running sums over powered nodes (n_on, Σu, Σu², Σpower), busy nodes, stranded GPUs
        self.n_on = n
        self.n_gpu_on = sum(1 for c in cap_gpus if c > 0)
        self.sum_u = 0.0
        self.sum_u2 = 0.0
        self.power_w = float(sum(idle_w))
        self.n_busy = 0
        self.stranded = 0.0
        # integrals
        self.t_on = 0.0
        self.int_util = 0.0
        self.int_std = 0.0
        self.energy_j = 0.0
        self.int_on = 0.0
        self.int_busy = 0.0
        self.int_stranded = 0.0
        self.gpus_on = self.total_gpus
        self.gpus_used = 0.0
        self.int_gpus_on = 0.0
        self.int_gpus_used = 0.0

    def _contribution(self, i: int) -> tuple[int, int, float, float, float, int, float]:
        """Node ``i``'s share of the running sums: (on, has GPUs, u, u², power, busy, stranded GPUs)."""
        if not self.powered[i]:
            return (0, 0, 0.0, 0.0, 0.0, 0, 0.0)
        cap = self.cap[i]
        busy = self.busy[i]
        if cap <= 0:
            # A CPU-only node has no compute utilization (Eq. 1-2 are over GPU nodes) but counts as on.
            return (1, 0, 0.0, 0.0, self.idle[i], int(busy), 0.0)
        used = self.used[i]
        u = used / cap
        stranded = cap - used if used > _EPS and cap - used > _EPS else 0.0
        return (1, 1, u, u * u, self.idle[i] + self.slope[i] * u, int(busy), stranded)

    def _apply(self, c: tuple[int, int, float, float, float, int, float], sign: int) -> None:
        """Add (+1) or remove (-1) one node's contribution."""
        self.n_on += sign * c[0]
        self.n_gpu_on += sign * c[1]
        self.sum_u += sign * c[2]
        self.sum_u2 += sign * c[3]
        self.power_w += sign * c[4]
        self.n_busy += sign * c[5]
        self.stranded += sign * c[6]

    def set_node(self, i: int, *, used_gpus: float | None = None, busy: bool | None = None,
                 powered: bool | None = None) -> None:
        """Change node ``i``'s running GPUs, whether it runs anything, and/or its power state, now.

        :param i: node index.
        :param used_gpus: GPUs now running work on it (None: unchanged).
        :param busy: whether any job runs on it (None: unchanged).
        :param powered: whether it is powered (None: unchanged).
        """
        self._apply(self._contribution(i), -1)
        self.gpus_on -= self.cap[i] if self.powered[i] else 0.0
        self.gpus_used -= self.used[i]
        if used_gpus is not None:
            self.used[i] = used_gpus if used_gpus > _EPS else 0.0
        if busy is not None:
            self.busy[i] = busy
        if powered is not None:
            self.powered[i] = powered
        self._apply(self._contribution(i), +1)
        self.gpus_on += self.cap[i] if self.powered[i] else 0.0
        self.gpus_used += self.used[i]

    def gpu_power_w(self, i: int, gpus: float) -> float:
        """What ``gpus`` busy GPUs of node ``i`` draw (their share of its idle and full-load power)."""
        cap = self.cap[i]
        return gpus * (self.idle[i] + self.slope[i]) / cap if cap > 0 else 0.0

    def instant(self) -> tuple[float, float]:
        """Eq. 1 and Eq. 2 now (0, 0 when no node is powered).

        :returns: ``(U, σ)``.
        """
        if self.n_gpu_on <= 0:
            return (0.0, 0.0)
        mean = self.sum_u / self.n_gpu_on
        var = self.sum_u2 / self.n_gpu_on - mean * mean
        return (mean, math.sqrt(var) if var > 0 else 0.0)

    def advance(self, t_s: float) -> None:
        """Integrate the current state from the last time to ``t_s`` (taking the checkpoint on the way).

        :param t_s: the new virtual time (≥ the last one).
        """
        cut = self.checkpoint_s
        if cut is not None and self.checkpoint is None and t_s >= cut:
            self._integrate(cut)
            self.checkpoint = self.summary()
        self._integrate(t_s)

    def _integrate(self, t_s: float) -> None:
        """Add ``value × dt`` of every running sum up to ``t_s``."""
        dt = t_s - self.last_s
        if dt <= 0:
            return
        if self.n_gpu_on > 0:
            mean, std = self.instant()
            self.t_on += dt
            self.int_util += mean * dt
            self.int_std += std * dt
        self.energy_j += self.power_w * dt
        self.int_on += self.n_on * dt
        self.int_busy += self.n_busy * dt
        self.int_stranded += self.stranded * dt
        self.int_gpus_on += self.gpus_on * dt
        self.int_gpus_used += self.gpus_used * dt
        self.last_s = t_s

    def sample(self, t_s: float, queue_len: int) -> None:
        """Record the state at a time for plots.

        :param t_s: the time.
        :param queue_len: jobs waiting now.
        """
        if self.series is None:
            return
        mean, std = self.instant()
        s = self.series
        s.t_s.append(t_s)
        s.util_mean.append(mean)
        s.util_std.append(std)
        s.power_w.append(self.power_w)
        s.queue_len.append(queue_len)
        s.powered.append(self.n_on)

    def summary(self) -> dict[str, float]:
        """The time-weighted metrics over ``[start_s, last time]``.

        :returns: ``util_mean``, ``util_std``, ``energy_kwh``, ``mean_power_w``, ``active_node_hours``,
            ``busy_node_hours``, ``fragmentation``, ``fragmented_gpus_mean``, ``horizon_s``,
            ``powered_gpu_hours``, ``allocated_gpu_hours``.
        """
        horizon = self.last_s - self.start_s
        on = self.t_on if self.t_on > 0 else 1.0
        span = horizon if horizon > 0 else 1.0
        stranded_mean = self.int_stranded / span
        return {
            "util_mean": self.int_util / on,
            "util_std": self.int_std / on,
            "energy_kwh": self.energy_j / _J_PER_KWH,
            "mean_power_w": self.energy_j / span,
            "active_node_hours": self.int_on / 3600.0,
            "busy_node_hours": self.int_busy / 3600.0,
            "fragmentation": stranded_mean / self.total_gpus if self.total_gpus > 0 else 0.0,
            "fragmented_gpus_mean": stranded_mean,
            "horizon_s": horizon,
            "powered_gpu_hours": self.int_gpus_on / 3600.0,
            "allocated_gpu_hours": self.int_gpus_used / 3600.0,
        }


def summarize_jobs(records: list[JobRecord], unplaced: int) -> dict[str, Any]:
    """Completion-time and queueing statistics of finished jobs.

    :param records: one record per finished job.
    :param unplaced: jobs still waiting when the replay ended (never placed).
    :returns: ``jct_mean_s``, ``jct_p50_s``, ``jct_p99_s``, ``queue_delay_mean_s``,
        ``queue_delay_p99_s``, ``queue_delay_large_mean_s`` (jobs of ≥ 8 GPUs: whole servers and
        gangs), ``makespan_s``, ``completed_jobs``, ``waited_jobs`` (started later than submitted:
        refused at least once, or woke a node), ``unplaced_jobs``.
    """
    if not records:
        timing = ("jct_mean_s", "jct_p50_s", "jct_p99_s", "queue_delay_mean_s", "queue_delay_p99_s")
        zero = dict.fromkeys((*timing, "queue_delay_large_mean_s"), 0.0)
        return {**zero, "makespan_s": 0.0, "completed_jobs": 0, "waited_jobs": 0, "unplaced_jobs": unplaced,
                "job_energy_mean_kwh": 0.0}
    submit = np.array([r.submit_s for r in records])
    start = np.array([r.start_s for r in records])
    end = np.array([r.end_s for r in records])
    jct = end - submit
    wait = start - submit
    large = np.array([r.gpus >= _LARGE_GPUS for r in records])
    return {
        "jct_mean_s": float(jct.mean()),
        "jct_p50_s": float(np.percentile(jct, 50)),
        "jct_p99_s": float(np.percentile(jct, 99)),
        "queue_delay_mean_s": float(wait.mean()),
        "queue_delay_p99_s": float(np.percentile(wait, 99)),
        "queue_delay_large_mean_s": float(wait[large].mean()) if large.any() else 0.0,
        "makespan_s": float(end.max() - submit.min()),
        "completed_jobs": len(records),
        "waited_jobs": int(np.count_nonzero(wait > 0)),
        "unplaced_jobs": unplaced,
        "job_energy_mean_kwh": float(np.mean([r.energy_j for r in records])) / _J_PER_KWH,
    }
