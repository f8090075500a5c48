"""Resource Monitor (coordinator side): telemetry history, current values, cluster objectives.

Each node keeps its history of every GPU and host field in packed float32 rings (numpy,
preallocated once, see :class:`NodeHistory`): the last ``fine_s`` seconds (default a minute)
per sample, the rest of ``history_s`` per minute (each field's mean and maximum), so a node's
memory is fixed whatever its uptime or the ingest rate: about 37 KiB for 8 GPUs and 15 minutes,
where one row per second for 15 minutes took 369 KiB. Absent fields (NVML ``NotSupported``) are
stored as NaN.

The paper's objectives over the active nodes reflect every batch received (recomputed,
vectorised, by the first reader after a batch):

- Eq. 1, mean compute utilization: ``U = (1/N) Σ_n u_n`` with ``u_n`` the mean GPU
  utilization of node n (host CPU utilization for a node without GPUs);
- Eq. 2, standard deviation of compute utilization: ``σ = sqrt((1/N) Σ_n (u_n − U)²)``;
- Eq. 3, total power: ``P = Σ_n (Σ_g p_{n,g} + p_cpu,n)``.

Energy since start integrates each node's power over time, or uses the difference of the
NVML total-energy counters where every GPU of the node reports one.

Inference tasks that declare a metrics endpoint arrive with a QoS reading in each sample
(latency p95, tokens/s, queue depth, from the task's own metrics); the newest per task is
kept, validated and bounded, in :class:`~coordinator.monitor.task_qos.TaskQosStore` and read with
:meth:`ResourceMonitor.task_qos`.

Each sample's per-task energy shares add up, per task over its nodes, in
:class:`~coordinator.monitor.task_energy.TaskEnergy` (``ResourceMonitor.task_energy``) until the
task ends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from common.pb.gptrm.v1 import types_pb2
from coordinator.monitor.power_model import PowerModel
from coordinator.monitor.sample_check import sample_problem
from coordinator.monitor.task_energy import TaskEnergy
from coordinator.monitor.task_qos import TaskQos, TaskQosStore

__all__ = ["COARSE_BUCKET_S", "FINE_HISTORY_S", "GPU_FIELDS", "HOST_FIELDS", "NODE_HISTORY_BYTES", "ClusterObjectives",
           "NodeHistory", "ResourceMonitor", "TaskQos"]

GPU_FIELDS = (
    "util_gpu", "util_mem", "mem_used_bytes", "mem_total_bytes", "power_w", "power_limit_w", "energy_j",
    "temperature_c", "sm_clock_mhz", "mem_clock_mhz", "ecc_corrected_total", "ecc_uncorrected_total",
)
HOST_FIELDS = (
    "cpu_util", "load1", "mem_used_bytes", "mem_total_bytes", "net_rx_bytes_total", "net_tx_bytes_total", "cpu_power_w",
)
NODE_HISTORY_BYTES = 4 * 1024 * 1024
"""Most bytes of telemetry history kept per node: a node with many GPUs keeps fewer samples."""
FINE_HISTORY_S = 60.0
"""Default seconds of history kept per sample (the fine ring); older history is kept per bucket."""
COARSE_BUCKET_S = 60.0
"""Seconds of one bucket of the downsampled (coarse) history: per-minute means and maxima."""
_G = {name: i for i, name in enumerate(GPU_FIELDS)}
_WIDTH = len(GPU_FIELDS)
# protobuf field number -> ring column, for reading a GpuSample with ListFields().
_GPU_COLUMN = {types_pb2.GpuSample.DESCRIPTOR.fields_by_name[name].number: i for i, name in enumerate(GPU_FIELDS)}
_UTIL, _POWER, _MEM_USED, _MEM_TOTAL, _ENERGY = (_G[f] for f in ("util_gpu", "power_w", "mem_used_bytes",
                                                                  "mem_total_bytes", "energy_j"))


@dataclass(frozen=True, slots=True)
class ClusterObjectives:
    """The paper's objectives plus memory utilization and energy, over active nodes."""

    util_mean: float = 0.0
    util_std: float = 0.0
    power_w: float = 0.0
    gpu_mem_util: float = 0.0
    energy_j: float = 0.0
    nodes: int = 0


class NodeHistory:
    """One node's telemetry history in packed float32 arrays, at two resolutions.

    Every sample is one row of ``n_gpus * len(GPU_FIELDS) + len(HOST_FIELDS)`` float32 values
    (GPU ``g``'s field ``f`` at column ``g * len(GPU_FIELDS) + f``, then the host fields):

    - the fine ring keeps the last ``capacity`` samples as they came (per second at 1 Hz);
    - the coarse ring keeps, per ``bucket_s`` bucket of sample time (per minute), each field's
      mean and maximum over the bucket's samples, for ``coarse_capacity`` buckets. A bucket is
      closed when the first sample of a later bucket arrives; its samples are then the newest
      rows of the fine ring, which therefore covers at least one bucket (see ``ResourceMonitor``).

    Everything is allocated (and written) once, so a node's memory is fixed whatever its uptime.

    :param n_gpus: GPUs in the node's inventory (fixed for the life of the history).
    :param capacity: samples of the fine ring.
    :param coarse_capacity: buckets of the coarse ring (0: no downsampled history).
    :param bucket_s: seconds of one coarse bucket.
    """

    __slots__ = ("_bucket", "_bucket_n", "_energy_start", "bucket_s", "capacity", "ccount", "chead",
                 "coarse_capacity", "coarse_max", "coarse_mean", "coarse_times", "count", "energy_delta_j", "energy_j",
                 "gpu_point", "head", "last_power_w", "last_time", "n_gpus", "rows", "times")

    def __init__(self, n_gpus: int, capacity: int, coarse_capacity: int = 0, bucket_s: float = COARSE_BUCKET_S) -> None:
        self.n_gpus = n_gpus
        self.capacity = capacity
        width = n_gpus * _WIDTH + len(HOST_FIELDS)
        self.times = np.zeros(capacity, dtype=np.float64)
        self.rows = np.full((capacity, width), np.nan, dtype=np.float32)
        self.head = 0
        self.count = 0
        self.coarse_capacity = coarse_capacity
        self.bucket_s = bucket_s
        self.coarse_times = np.zeros(coarse_capacity, dtype=np.float64)     # each bucket's start
        self.coarse_mean = np.full((coarse_capacity, width), np.nan, dtype=np.float32)
        self.coarse_max = np.full((coarse_capacity, width), np.nan, dtype=np.float32)
        self.chead = 0
        self.ccount = 0
        self._bucket = -math.inf    # index (sample time // bucket_s) of the open bucket
        self._bucket_n = 0          # rows of the fine ring in the open bucket
        self.energy_j = 0.0
        self.energy_delta_j = 0.0
        self.last_time = 0.0
        self.last_power_w = math.nan
        self._energy_start: float | None = None
        # (mean GPU utilization, sum of GPU power) of the last sample, None when it lacked either.
        self.gpu_point: tuple[float, float] | None = None

    @property
    def gpu(self) -> np.ndarray:
        """The fine ring's GPU fields as a (capacity, n_gpus, len(GPU_FIELDS)) view."""
        return self.rows[:, :self.n_gpus * _WIDTH].reshape(self.capacity, self.n_gpus, _WIDTH)

    @property
    def host(self) -> np.ndarray:
        """The fine ring's host fields as a (capacity, len(HOST_FIELDS)) view."""
        return self.rows[:, self.n_gpus * _WIDTH:]

    def append(self, sample: types_pb2.TelemetrySample) -> tuple[float, float, float, float]:
        """Store one sample; returns (compute util, power W, GPU memory used, GPU memory total).

        Hot path (one call per node per second): the set fields of each GPU are read with
        ``ListFields`` (one C call per GPU), gathered into a flat list with the host fields and
        copied into the ring row in one numpy assignment; the node summary is summed from the
        same list. A sample of a later bucket first closes the open one (once a minute).
        """
        t = sample.time_unix_s
        if self.coarse_capacity:
            bucket = t // self.bucket_s
            if bucket > self._bucket:     # an older sample (a late batch) joins the open bucket
                if self._bucket_n:
                    self._close_bucket()
                self._bucket = bucket
            self._bucket_n = min(self._bucket_n + 1, self.capacity)
        i = self.head
        self.times[i] = t
        n, width = self.n_gpus, _WIDTH
        flat = [math.nan] * (n * width)
        column = _GPU_COLUMN.get
        for g in sample.gpus:
            idx = g.index
            if idx >= n:
                continue
            base = idx * width
            for fd, value in g.ListFields():
                col = column(fd.number)
                if col is not None:
                    flat[base + col] = value
        h = sample.host
        host = [h.cpu_util, h.load1, h.mem_used_bytes, h.mem_total_bytes, h.net_rx_bytes_total, h.net_tx_bytes_total,
                h.cpu_power_w if h.HasField("cpu_power_w") else math.nan]
        self.rows[i] = flat + host
        self.head = (i + 1) % self.capacity
        self.count = min(self.count + 1, self.capacity)
        self.gpu_point = None
        if n:
            utils = [v for v in flat[_UTIL::width] if v == v]    # v == v: not NaN
            u = sum(utils) / len(utils) if utils else 0.0
            powers = [v for v in flat[_POWER::width] if v == v]
            power = sum(powers)
            if utils and powers:
                self.gpu_point = (u, power)
            mem_used = sum(v for v in flat[_MEM_USED::width] if v == v)
            mem_total = sum(v for v in flat[_MEM_TOTAL::width] if v == v)
            energy = flat[_ENERGY::width]
            counters = None if any(v != v for v in energy) else sum(energy)
        else:
            u, power, mem_used, mem_total, counters = host[0], 0.0, 0.0, 0.0, None
        if not math.isnan(host[6]):
            power += host[6]
        self._integrate(t, power, counters)
        return u, power, mem_used, mem_total

    def _close_bucket(self) -> None:
        """Downsample the open bucket (the newest ``_bucket_n`` rows of the fine ring) into the coarse ring:
        per column the mean and the maximum of the values present (NaN where none was)."""
        k = self._bucket_n
        block = self.rows[(np.arange(k) + (self.head - k)) % self.capacity]
        present = ~np.isnan(block)
        counts = present.sum(axis=0)
        sums = np.where(present, block, 0.0).sum(axis=0, dtype=np.float64)
        j = self.chead
        with np.errstate(invalid="ignore", divide="ignore"):
            self.coarse_mean[j] = sums / counts
        self.coarse_max[j] = np.fmax.reduce(block, axis=0)    # fmax skips NaN
        self.coarse_times[j] = self._bucket * self.bucket_s
        self.chead = (j + 1) % self.coarse_capacity
        self.ccount = min(self.ccount + 1, self.coarse_capacity)
        self._bucket_n = 0

    def _integrate(self, t: float, power: float, counters: float | None) -> None:
        """Energy since the first sample: from the summed NVML counters when every GPU has one
        (``counters``), else the trapezoid rule over the node's power."""
        before = self.energy_j
        self._integrate_counters(t, power, counters)
        self.energy_delta_j = self.energy_j - before

    def _integrate_counters(self, t: float, power: float, counters: float | None) -> None:
        if counters is not None:
            total = counters
            if self._energy_start is None:
                self._energy_start = total - self.energy_j
            self.energy_j = max(self.energy_j, total - self._energy_start)
        elif t > self.last_time and not math.isnan(self.last_power_w):
            # Trapezoid rule over the sampling interval.
            self.energy_j += 0.5 * (power + self.last_power_w) * (t - self.last_time)
        self.last_time = t
        self.last_power_w = power

    def _column(self, field: str, gpu_index: int | None) -> int:
        if gpu_index is None:
            return self.n_gpus * _WIDTH + HOST_FIELDS.index(field)
        if not 0 <= gpu_index < self.n_gpus:
            raise IndexError(f"GPU index {gpu_index} out of range (the node has {self.n_gpus})")
        return gpu_index * _WIDTH + _G[field]

    def series(self, field: str, gpu_index: int | None = None, stat: str = "mean") -> tuple[np.ndarray, np.ndarray]:
        """(times, values) oldest first for one GPU field (with ``gpu_index``) or host field.

        The samples of the fine ring come as they were; before them, one value per closed bucket
        that began before the oldest of those samples, timed at the bucket's start: the bucket's
        mean (``stat="mean"``) or maximum (``stat="max"``, e.g. for a peak of memory). The bucket
        the fine ring starts in is thus both in its per-bucket value and in its samples that remain.
        """
        col = self._column(field, gpu_index)
        order = (np.arange(self.count) + (self.head - self.count)) % self.capacity
        times, values = self.times[order], self.rows[order, col]
        if not self.ccount:
            return times, values
        if stat not in ("mean", "max"):
            raise ValueError(f"stat must be 'mean' or 'max', not {stat!r}")
        corder = (np.arange(self.ccount) + (self.chead - self.ccount)) % self.coarse_capacity
        ctimes = self.coarse_times[corder]
        keep = corder[ctimes < times[0]] if len(times) else corder
        coarse = self.coarse_mean if stat == "mean" else self.coarse_max
        return np.concatenate([self.coarse_times[keep], times]), np.concatenate([coarse[keep, col], values])

    def latest(self, field: str, gpu_index: int) -> float | None:
        """One GPU field of the latest sample (None when there is none, or it was not measured)."""
        if self.count == 0 or not 0 <= gpu_index < self.n_gpus:
            return None
        value = float(self.rows[(self.head - 1) % self.capacity, gpu_index * _WIDTH + _G[field]])
        return None if math.isnan(value) else value

    @property
    def nbytes(self) -> int:
        return (self.times.nbytes + self.rows.nbytes + self.coarse_times.nbytes + self.coarse_mean.nbytes
                + self.coarse_max.nbytes)


class ResourceMonitor:
    """Aggregates telemetry from every node.

    :param history_s: seconds of history kept per node.
    :param interval_s: the agents' sampling interval (sets the fine ring's size).
    :param fine_s: seconds of that history kept per sample (at least one coarse bucket when
        ``history_s`` is longer); the rest of ``history_s`` is kept per ``bucket_s`` (mean and
        maximum of each field), so a node's memory is bounded by both, whatever its uptime.
    :param bucket_s: seconds of one bucket of the downsampled history.
    :param now: wall clock (injected in tests).
    :param power_model: fed every sample's (mean GPU utilization, summed GPU power), so that
        Alg. 3's per-node power curves are fitted from the node's own telemetry; None: not fed.
    :param max_qos_tasks: tasks whose latest QoS reading (from their own metrics) is kept.
    """

    def __init__(self, history_s: float, interval_s: float, now: Callable[[], float] = time.time,
                 power_model: PowerModel | None = None, max_qos_tasks: int = 4096,
                 fine_s: float = FINE_HISTORY_S, bucket_s: float = COARSE_BUCKET_S) -> None:
        self.power_model = power_model
        self._task_qos = TaskQosStore(max_qos_tasks, now)
        self.task_energy = TaskEnergy()
        if history_s > fine_s:
            fine_s = max(fine_s, bucket_s)    # a closed bucket's samples are all still in the fine ring
            self.coarse_capacity = math.ceil((history_s - fine_s) / bucket_s) + 1   # +1: the one fine_s starts in
        else:
            fine_s, self.coarse_capacity = history_s, 0
        self.capacity = max(2, math.ceil(fine_s / interval_s))
        self.bucket_s = bucket_s
        self._now = now
        self._hist: dict[str, NodeHistory] = {}
        self._slot: dict[str, int] = {}
        self.latest: dict[str, types_pb2.TelemetrySample] = {}
        self._util = np.zeros(0)
        self._power = np.zeros(0)
        self._mem_used = np.zeros(0)
        self._mem_total = np.zeros(0)
        self._active = np.zeros(0, dtype=bool)
        self._energy_total = 0.0
        self._objectives = ClusterObjectives()
        self._stale = False
        self.samples_total = 0
        self.last_lag_s = 0.0
        # node id -> samples refused for an impossible value (NaN, inf, negative, out of range).
        self.rejected: dict[str, int] = {}
        self.last_rejection: dict[str, str] = {}

    def _ensure(self, node_id: str, n_gpus: int) -> tuple[NodeHistory, int]:
        hist = self._hist.get(node_id)
        if hist is None or hist.n_gpus != n_gpus:
            width = n_gpus * len(GPU_FIELDS) + len(HOST_FIELDS)
            fine, coarse = self.capacity, self.coarse_capacity
            size = fine * (8 + 4 * width) + coarse * (8 + 8 * width)    # times, rows; times, means and maxima
            if size > NODE_HISTORY_BYTES:    # hundreds of GPUs: fewer samples and buckets, same byte budget
                fine, coarse = max(2, fine * NODE_HISTORY_BYTES // size), coarse * NODE_HISTORY_BYTES // size
            hist = NodeHistory(n_gpus, fine, coarse, self.bucket_s)
            self._hist[node_id] = hist
        slot = self._slot.get(node_id)
        if slot is None:
            slot = len(self._slot)
            self._slot[node_id] = slot
            if slot >= len(self._util):
                grow = max(16, len(self._util))
                self._util = np.concatenate([self._util, np.zeros(grow)])
                self._power = np.concatenate([self._power, np.zeros(grow)])
                self._mem_used = np.concatenate([self._mem_used, np.zeros(grow)])
                self._mem_total = np.concatenate([self._mem_total, np.zeros(grow)])
                self._active = np.concatenate([self._active, np.zeros(grow, dtype=bool)])
        return hist, slot

    def ingest(self, node_id: str, n_gpus: int, samples: Sequence[types_pb2.TelemetrySample]) -> int:
        """Store a batch for ``node_id`` and recompute the cluster objectives.

        Samples with an impossible value (see :mod:`coordinator.monitor.sample_check`) are
        dropped and counted in ``rejected[node_id]``. Returns the number of samples stored.
        """
        if not samples:
            return 0
        now = self._now()
        good = []
        for s in samples:
            problem = sample_problem(s, now)
            if problem is None:
                good.append(s)
            else:
                self.rejected[node_id] = self.rejected.get(node_id, 0) + 1
                self.last_rejection[node_id] = problem
        samples = good
        if not samples:
            return 0
        hist, slot = self._ensure(node_id, n_gpus)
        power_model = self.power_model
        for s in samples:
            u, p, mu, mt = hist.append(s)
            self._energy_total += hist.energy_delta_j
            if s.host.tasks:
                self.task_energy.observe(node_id, s)
            if power_model is not None and hist.gpu_point is not None:
                power_model.observe(node_id, *hist.gpu_point)
        self._util[slot], self._power[slot], self._mem_used[slot], self._mem_total[slot] = u, p, mu, mt
        self._active[slot] = True
        self.latest[node_id] = samples[-1]
        if samples[-1].task_qos:
            self._task_qos.update(node_id, samples[-1])   # every sample carries all tasks: the newest suffices
        self.samples_total += len(samples)
        self.last_lag_s = max(0.0, now - samples[-1].time_unix_s)
        self._stale = True
        return len(samples)

    def deactivate(self, node_id: str) -> None:
        """Leave a node out of the objectives (it stopped reporting)."""
        slot = self._slot.get(node_id)
        if slot is not None and self._active[slot]:
            self._active[slot] = False
            self._stale = True

    def forget_node(self, node_id: str) -> None:
        """Drop a removed node's history and counters (its slot stays, inactive, for a node that returns)."""
        self.deactivate(node_id)
        self._hist.pop(node_id, None)
        self.latest.pop(node_id, None)
        self.rejected.pop(node_id, None)
        self.last_rejection.pop(node_id, None)

    @property
    def objectives(self) -> ClusterObjectives:
        """The cluster objectives as of the latest batch.

        Ingest only marks them stale; they are recomputed (vectorised over all nodes) by the
        first reader after a batch, so a burst of thousands of batches between two reads
        (Admin status, a scrape, the scheduler) costs one recompute, not thousands.
        """
        if self._stale:
            self._recompute()
        return self._objectives

    def _recompute(self) -> None:
        self._stale = False
        active = self._active
        n = int(active.sum())
        energy = self._energy_total
        if n == 0:
            self._objectives = ClusterObjectives(energy_j=energy)
            return
        util = self._util[active]
        mem_total = float(self._mem_total[active].sum())
        self._objectives = ClusterObjectives(
            util_mean=float(util.mean()),
            util_std=float(util.std()),
            power_w=float(self._power[active].sum()),
            gpu_mem_util=float(self._mem_used[active].sum()) / mem_total if mem_total else 0.0,
            energy_j=energy,
            nodes=n,
        )

    def task_qos(self, task_id: str) -> TaskQos | None:
        """The latest QoS reading of a task's own metrics (latency p95, tokens/s, queue), or None.

        Check ``received_unix_s`` for freshness and ``available`` before comparing with targets:
        an unreadable endpoint is reported, never a violation.
        """
        return self._task_qos.get(task_id)

    def task_qos_readings(self) -> list[TaskQos]:
        """Every task's latest QoS reading (bounded), least recently updated first."""
        return self._task_qos.readings()

    def forget_task_qos(self, task_id: str) -> None:
        """Drop a task's QoS reading (it ended)."""
        self._task_qos.forget(task_id)

    def history(self, node_id: str) -> NodeHistory | None:
        return self._hist.get(node_id)

    def node_current(self, node_id: str) -> tuple[float, float] | None:
        """(compute utilization, power W) of a node's latest sample."""
        slot = self._slot.get(node_id)
        if slot is None or not self._active[slot]:
            return None
        return float(self._util[slot]), float(self._power[slot])

    @property
    def memory_bytes(self) -> int:
        return sum(h.nbytes for h in self._hist.values())
