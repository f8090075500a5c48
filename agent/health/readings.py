"""The plain readings of GPU health: what a backend read (:class:`GpuSignals`) and what the
classifier concluded (:class:`GpuHealthReading`). Re-exported by :mod:`agent.collectors.base`, whose
``GpuReading`` carries both; this module imports nothing of the agent, so both packages can use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.pb.gptrm.v1 import types_pb2
from common.pbenum import pb_enum

__all__ = ["GpuHealthReading", "GpuSignals"]


@dataclass(frozen=True, slots=True)
class GpuSignals:
    """What was read of one GPU's health signals at one tick (classified by :mod:`agent.health`).

    None: not read this tick (the GPU does not support it, or a slow signal was not due); the
    classifier then keeps what it concluded from that signal last time.
    """

    lost: str = ""
    """Why the GPU no longer answers (NVML's GPU-is-lost); "" when it answers."""
    reset_required: str = ""
    """Why NVML says the GPU needs a reset before it answers again; "" otherwise."""
    xids: tuple[tuple[int, float], ...] = ()
    """XID events since the last tick: (code, wall-clock seconds); a double-bit ECC event counts as XID 48."""
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_volatile: int | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages_pending: bool | None = None
    """Pages waiting to be retired at the next reset (GPUs older than row remapping)."""
    retired_pages_dbe: int | None = None
    clocks_event_reasons: int | None = None
    """NVML's clocks event (throttle) reasons bitmask."""
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    busy: bool = False
    """The GPU was computing this tick (a slower PCIe generation at idle is power saving, not a fault)."""
    nvlinks_down: tuple[int, ...] | None = None
    """NVLinks that were up when the agent started and are down now."""
    reset_seen: bool = False
    """The GPU was reset since the last tick (its volatile counters went back, a pending remap cleared)."""


@dataclass(frozen=True, slots=True)
class GpuHealthReading:
    """A GPU's health as :mod:`agent.health` classifies it; the fields of ``GpuHealth``."""

    state: str = "healthy"
    """``healthy``, ``degraded`` or ``unhealthy``."""
    action: str = "none"
    """For ``unhealthy``: ``reset`` (back by itself once healthy again) or ``replace`` (an admin resumes it)."""
    reason: str = ""
    evidence: str = ""
    since_unix_s: float = 0.0
    simulated: bool = False
    app_xid_count: int = 0
    app_xid_last: int = 0
    app_xid_unix_s: float = 0.0

    def to_proto(self) -> types_pb2.GpuHealth:
        """This reading as a ``GpuHealth`` message."""
        return types_pb2.GpuHealth(
            state=pb_enum(types_pb2.GpuHealthState, _HEALTH_STATES[self.state]),
            action=pb_enum(types_pb2.GpuHealthAction, _HEALTH_ACTIONS[self.action]),
            reason=self.reason, evidence=self.evidence, since_unix_s=self.since_unix_s, simulated=self.simulated,
            app_xid_count=self.app_xid_count, app_xid_last=self.app_xid_last, app_xid_unix_s=self.app_xid_unix_s,
        )


_HEALTH_STATES = {"healthy": types_pb2.GPU_HEALTH_STATE_HEALTHY, "degraded": types_pb2.GPU_HEALTH_STATE_DEGRADED,
                  "unhealthy": types_pb2.GPU_HEALTH_STATE_UNHEALTHY}
_HEALTH_ACTIONS = {"none": types_pb2.GPU_HEALTH_ACTION_NONE, "reset": types_pb2.GPU_HEALTH_ACTION_RESET,
                   "replace": types_pb2.GPU_HEALTH_ACTION_REPLACE}
