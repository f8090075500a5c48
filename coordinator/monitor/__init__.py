"""Resource Monitor (paper §3): per-node telemetry history, the Eq. 1-3 objectives, Prometheus metrics,
the node registry (liveness) and the GPU power model fitted from telemetry.

The agents sample; this package aggregates what they stream.
"""

from __future__ import annotations

from coordinator.monitor.metrics import Metrics, serve_metrics
from coordinator.monitor.nodes import NodeEntry, NodeRegistry
from coordinator.monitor.power_model import PowerModel
from coordinator.monitor.resources import ClusterObjectives, NodeHistory, ResourceMonitor

__all__ = [
    "ClusterObjectives",
    "Metrics",
    "NodeEntry",
    "NodeHistory",
    "NodeRegistry",
    "PowerModel",
    "ResourceMonitor",
    "serve_metrics",
]
