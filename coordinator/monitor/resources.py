"""Resource Monitor (coordinator side): telemetry history, current values, cluster objectives.

Each node keeps fixed-size ring buffers (numpy, preallocated once) of every GPU and host
field, so memory is bounded by ``history_s / interval`` samples whatever the ingest rate.
Absent fields (NVML ``NotSupported``) are stored as NaN.

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

__all__ = ["GPU_FIELDS", "HOST_FIELDS", "NODE_HISTORY_BYTES", "ClusterObjectives", "NodeHistory", "ResourceMonitor",
           "TaskQos"]

GPU_FIELDS = (
    "util_gpu", "util_mem", "mem_used_bytes", "mem_total_bytes", "power_w", "power_limit_w", "energy_j",
    "temperature_c", "sm_clock_mhz", "mem_clock_mhz", "ecc_corrected_total", "ecc_uncorrected_total",
)
HOST_FIELDS = (
    "cpu_util", "load1", "mem_used_bytes", "mem_total_bytes", "net_rx_bytes_total", "net_tx_bytes_total", "cpu_power_w",
)
NODE_HISTORY_BYTES = 4 * 1024 * 1024
"""Most bytes of telemetry history kept per node: a node with many GPUs keeps fewer samples."""
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
    """Ring buffers of one node's telemetry.

    :param n_gpus: GPUs in the node's inventory (fixed for the life of the history).
    :param capacity: samples kept (history seconds / sampling interval).
    """

    __slots__ = ("_energy_start", "capacity", "count", "energy_delta_j", "energy_j", "gpu", "gpu_point", "head",
                 "host", "last_power_w", "last_time", "n_gpus", "times")

    def __init__(self, n_gpus: int, capacity: int) -> None:
        self.n_gpus = n_gpus
        self.capacity = capacity
        self.times = np.zeros(capacity, dtype=np.float64)
        self.gpu = np.full((capacity, n_gpus, len(GPU_FIELDS)), np.nan, dtype=np.float32)
        self.host = np.full((capacity, len(HOST_FIELDS)), np.nan, dtype=np.float32)
        self.head = 0
        self.count = 0
        self.energy_j = 0.0
        self.energy_delta_j = 0.0
        self.last_time = 0.0
        self.last_power_w = math.nan
        self._energy_start: float | None = None
        # (mean GPU utilization, sum of GPU power) of the last sample, None when it lacked either.
        self.gpu_point: tuple[float, float] | None = None

    def append(self, sample: types_pb2.TelemetrySample) -> tuple[float, float, float, float]:
        """Store one sample; returns (compute util, power W, GPU memory used, GPU memory total).

        Hot path (one call per node per second): the set fields of each GPU are read with
        ``ListFields`` (one C call per GPU), gathered into a flat list and copied into the
        ring row in one numpy assignment; the node summary is summed from the same list.
        """
        i = self.head
        t = sample.time_unix_s
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
        if n:
            self.gpu[i] = np.asarray(flat, dtype=np.float32).reshape(n, width)
        h = sample.host
        host = [h.cpu_util, h.load1, h.mem_used_bytes, h.mem_total_bytes, h.net_rx_bytes_total, h.net_tx_bytes_total,
                h.cpu_power_w if h.HasField("cpu_power_w") else math.nan]
        self.host[i] = host
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

    def series(self, field: str, gpu_index: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(times, values) oldest first for one GPU field (with ``gpu_index``) or host field."""
        order = (np.arange(self.count) + (self.head - self.count)) % self.capacity
        if gpu_index is None:
            return self.times[order], self.host[order, HOST_FIELDS.index(field)]
        return self.times[order], self.gpu[order, gpu_index, _G[field]]

    def latest(self, field: str, gpu_index: int) -> float | None:
        """One GPU field of the latest sample (None when there is none, or it was not measured)."""
        if self.count == 0 or not 0 <= gpu_index < self.gpu.shape[1]:
            return None
        value = float(self.gpu[(self.head - 1) % self.capacity, gpu_index, _G[field]])
        return None if math.isnan(value) else value

    @property
    def nbytes(self) -> int:
        return self.times.nbytes + self.gpu.nbytes + self.host.nbytes


class ResourceMonitor:
    """Aggregates telemetry from every node.

    :param history_s: seconds of history kept per node.
    :param interval_s: the agents' sampling interval (sets the ring size).
    :param now: wall clock (injected in tests).
    :param power_model: fed every sample's (mean GPU utilization, summed GPU power), so that
        Alg. 3's per-node power curves are fitted from the node's own telemetry; None: not fed.
    :param max_qos_tasks: tasks whose latest QoS reading (from their own metrics) is kept.
    """

    def __init__(self, history_s: float, interval_s: float, now: Callable[[], float] = time.time,
                 power_model: PowerModel | None = None, max_qos_tasks: int = 4096) -> None:
        self.power_model = power_model
        self._task_qos = TaskQosStore(max_qos_tasks, now)
        self.task_energy = TaskEnergy()
        self.capacity = max(2, math.ceil(history_s / interval_s))
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
            per_sample = 8 + 4 * (n_gpus * len(GPU_FIELDS) + len(HOST_FIELDS))
            hist = NodeHistory(n_gpus, max(2, min(self.capacity, NODE_HISTORY_BYTES // per_sample)))
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
