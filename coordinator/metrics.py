"""Prometheus metrics of the coordinator (names ``gptrm_<subsystem>_<name>_<unit>``).

Per-GPU and per-node gauges are produced at scrape time from the Resource Monitor's
latest samples by a custom collector, so the telemetry hot path pays nothing for them
however many GPUs report. Counters and histograms that the code updates live in
:class:`Metrics`, built once per process on its own registry (no global state).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from coordinator.monitor import ResourceMonitor
    from coordinator.registry import NodeRegistry

__all__ = ["Metrics", "serve_metrics"]

# (metric suffix, help, GpuSample field, scale)
_GPU_GAUGES = (
    ("power_watts", "GPU power draw", "power_w", 1.0),
    ("power_limit_watts", "GPU enforced power limit", "power_limit_w", 1.0),
    ("utilization_ratio", "GPU compute utilization (0..1)", "util_gpu", 1.0),
    ("memory_utilization_ratio", "GPU memory controller utilization (0..1)", "util_mem", 1.0),
    ("memory_used_bytes", "GPU memory used", "mem_used_bytes", 1.0),
    ("memory_total_bytes", "GPU memory total", "mem_total_bytes", 1.0),
    ("temperature_celsius", "GPU temperature", "temperature_c", 1.0),
    ("sm_clock_hertz", "GPU SM clock", "sm_clock_mhz", 1e6),
    ("energy_joules", "GPU energy counter since driver load", "energy_j", 1.0),
)


class _TelemetryCollector(Collector):
    """Turns the monitor's latest samples and the registry into gauges at scrape time."""

    def __init__(self, monitor: ResourceMonitor, registry: NodeRegistry,
                 task_counts: Callable[[], dict[str, int]]) -> None:
        self._monitor = monitor
        self._registry = registry
        self._task_counts = task_counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self._gpu_families()
        yield from self._node_families()
        obj = self._monitor.objectives
        for name, help_text, value in (
            ("gptrm_cluster_utilization_mean_ratio", "Eq. 1: mean compute utilization across nodes", obj.util_mean),
            ("gptrm_cluster_utilization_stddev_ratio", "Eq. 2: std-dev of compute utilization across nodes",
             obj.util_std),
            ("gptrm_cluster_power_watts", "Eq. 3: total power of the cluster", obj.power_w),
            ("gptrm_cluster_gpu_memory_utilization_ratio", "GPU memory used / total", obj.gpu_mem_util),
            ("gptrm_cluster_energy_joules", "energy since the coordinator started", obj.energy_j),
        ):
            yield GaugeMetricFamily(name, help_text, value=value)
        tasks = GaugeMetricFamily("gptrm_tasks", "tasks by state", labels=["state"])
        for state, count in sorted(self._task_counts().items()):
            tasks.add_metric([state], count)
        yield tasks
        nodes = GaugeMetricFamily("gptrm_nodes", "nodes by state", labels=["state"])
        for state, count in sorted(self._registry.counts().items()):
            nodes.add_metric([state], count)
        yield nodes

    def _gpu_families(self) -> Iterator[GaugeMetricFamily]:
        labels = ["node", "gpu", "model", "simulated"]
        fams = [GaugeMetricFamily(f"gptrm_gpu_{suffix}", h, labels=labels) for suffix, h, _, _ in _GPU_GAUGES]
        for node_id, sample in list(self._monitor.latest.items()):
            entry = self._registry.get(node_id)
            models = {g.index: g.model for g in entry.inventory.gpus} if entry else {}
            for g in sample.gpus:
                lv = [node_id, str(g.index), models.get(g.index, ""), "true" if g.simulated else "false"]
                for fam, (_, _, field, scale) in zip(fams, _GPU_GAUGES, strict=True):
                    if g.HasField(field):
                        fam.add_metric(lv, getattr(g, field) * scale)
        yield from fams

    def _node_families(self) -> Iterator[GaugeMetricFamily]:
        util = GaugeMetricFamily("gptrm_node_utilization_ratio", "node compute utilization (mean over GPUs)",
                                 labels=["node"])
        power = GaugeMetricFamily("gptrm_node_power_watts", "node power (GPUs + CPU package)", labels=["node"])
        cpu = GaugeMetricFamily("gptrm_node_cpu_utilization_ratio", "host CPU utilization", labels=["node"])
        cpu_power = GaugeMetricFamily("gptrm_node_cpu_power_watts", "CPU package power (RAPL)", labels=["node"])
        mem = GaugeMetricFamily("gptrm_node_memory_used_bytes", "host memory used", labels=["node"])
        for node_id, sample in list(self._monitor.latest.items()):
            current = self._monitor.node_current(node_id)
            if current is None:
                continue
            util.add_metric([node_id], current[0])
            power.add_metric([node_id], current[1])
            cpu.add_metric([node_id], sample.host.cpu_util)
            mem.add_metric([node_id], sample.host.mem_used_bytes)
            if sample.host.HasField("cpu_power_w") and math.isfinite(sample.host.cpu_power_w):
                cpu_power.add_metric([node_id], sample.host.cpu_power_w)
        yield from (util, power, cpu, cpu_power, mem)


class Metrics:
    """Counters and histograms the coordinator updates, on a private registry.

    :param monitor: source of per-GPU/per-node gauges and cluster objectives.
    :param registry: node registry (node counts by state, GPU models).
    :param task_counts: callable returning {state label: count}.
    """

    def __init__(self, monitor: ResourceMonitor, registry: NodeRegistry,
                 task_counts: Callable[[], dict[str, int]]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_TelemetryCollector(monitor, registry, task_counts))
        r = self.registry
        self.streams = Gauge("gptrm_agent_streams", "open agent streams", registry=r)
        self.samples = Counter("gptrm_telemetry_samples_total", "telemetry samples ingested", registry=r)
        self.dropped = Counter("gptrm_telemetry_dropped_samples_total",
                               "telemetry samples agents dropped while disconnected (as reported)", registry=r)
        self.ingest_lag = Histogram("gptrm_telemetry_ingest_lag_seconds", "sample time to ingestion",
                                    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.sched_latency = Histogram("gptrm_scheduler_cycle_duration_seconds", "one scheduling cycle",
                                       registry=r)
        self.decision_latency = Histogram("gptrm_scheduler_decision_duration_seconds",
                                          "time to place one task within a cycle",
                                          buckets=(1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5),
                                          registry=r)
        self.decisions = Counter("gptrm_scheduler_decisions_total", "placement decisions", ["outcome"], registry=r)
        self.commit_latency = Histogram("gptrm_sync_commit_duration_seconds", "etcd commit of a placement batch",
                                        registry=r)
        self.is_leader = Gauge("gptrm_coordinator_leader", "1 while this replica leads", registry=r)
        self.etcd_up = Gauge("gptrm_etcd_up", "1 while etcd answers (the coordinator starts only once it does)",
                             registry=r)
        self.etcd_up.set(1)


def serve_metrics(metrics: Metrics, listen: str) -> object:
    """Start the HTTP exposition server on ``HOST:PORT``; returns the server (``shutdown()`` to stop)."""
    host, _, port = listen.rpartition(":")
    server, _thread = start_http_server(int(port), addr=host, registry=metrics.registry)
    return server
