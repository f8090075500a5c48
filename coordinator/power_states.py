"""Names of a node's power states, shared by the Resource Adaptor and gptrmctl."""

from __future__ import annotations

from common.pb.gptrm.v1 import types_pb2

__all__ = ["POWER_LABELS", "power_label"]

_PS = types_pb2.NodePowerState
POWER_LABELS: dict[int, str] = {_PS.NODE_POWER_STATE_UNSPECIFIED: "ready", _PS.NODE_POWER_STATE_READY: "ready",
                _PS.NODE_POWER_STATE_DRAINING: "draining", _PS.NODE_POWER_STATE_POWERING_OFF: "powering-off",
                _PS.NODE_POWER_STATE_OFF: "off", _PS.NODE_POWER_STATE_POWERING_ON: "powering-on"}
"""Power state → the word shown in gptrmctl, events and metrics."""


def power_label(state: int) -> str:
    """``ready``, ``draining``, ``powering-off``, ``off`` or ``powering-on`` (unset reads as ready)."""
    return POWER_LABELS.get(state, "ready")
