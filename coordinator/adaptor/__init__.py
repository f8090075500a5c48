"""Resource Adaptor (paper §3): how much of the cluster is on and asked for — scale-out requests when a
task fits nowhere, and the node power-state model (idle nodes powered down, woken on demand) that the
simulator drives."""

from __future__ import annotations

from coordinator.adaptor.scale_out import SCALE_OUT_POLICIES, ScaleOutRequests

__all__ = ["SCALE_OUT_POLICIES", "ScaleOutRequests"]
