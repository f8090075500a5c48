"""The per-GPU gauges (and the energy counter) rendered the way prometheus-client renders any collector: the
baseline that coordinator/metrics.py's direct rendering must equal (unit tests) and beat
(tests/bench/bench_metrics.py)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coordinator.monitor.metrics import _GPU_COUNTERS, _GPU_GAUGES
from coordinator.monitor.nodes import NodeRegistry
from coordinator.monitor.resources import ResourceMonitor

__all__ = ["ClientRendered"]


class ClientRendered(Collector):
    """The per-GPU gauges the way prometheus-client renders them (label dicts, sample objects)."""

    def __init__(self, monitor: ResourceMonitor, registry: NodeRegistry) -> None:
        self.monitor, self.registry = monitor, registry

    def collect(self) -> Iterator[Metric]:
        labels = ["node", "gpu", "model", "simulated"]
        fams: list[GaugeMetricFamily | CounterMetricFamily] = [
            (CounterMetricFamily if suffix in _GPU_COUNTERS else GaugeMetricFamily)(f"gptrm_gpu_{suffix}", h,
                                                                                  labels=labels)
            for suffix, h, _, _ in _GPU_GAUGES]
        for node_id, sample in self.monitor.latest.items():
            models = {g.index: g.model for g in self.registry.get(node_id).inventory.gpus}
            for g in sample.gpus:
                lv = [node_id, str(g.index), models[g.index], "true" if g.simulated else "false"]
                for fam, (_, _, field, scale) in zip(fams, _GPU_GAUGES, strict=True):
                    if g.HasField(field):
                        fam.add_metric(lv, getattr(g, field) * scale)
        yield from fams
