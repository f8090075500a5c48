"""GPU health: the agent's one classification of its GPUs' signals (XID events, ECC, row remaps,
retired pages, NVLink, clocks event reasons, PCIe link, a lost GPU) into healthy, degraded or unhealthy.

- :mod:`agent.health.classify`: the XID lists (``--app-xids``, ``--reset-xids``, ``--replace-xids``),
  the per-GPU tracker and :class:`HealthWatch`, which both GPU backends feed.
- :mod:`agent.health.faults`: faults injected into simulated GPUs (``--simulate-faults FILE``).

See docs/gpu-health-signals.md for the table, the defaults and the fault file's format.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.health.classify import (
    DEFAULT_APP_XIDS,
    DEFAULT_REPLACE_XIDS,
    DEFAULT_RESET_XIDS,
    DEGRADED,
    HEALTHY,
    REPLACE,
    RESET,
    UNHEALTHY,
    GpuHealthTracker,
    HealthWatch,
    XidPolicy,
    format_xids,
    parse_xids,
    xid_list_problem,
)
from agent.health.faults import FaultFile, SimFaults, parse_fault
from agent.health.readings import GpuHealthReading, GpuSignals

__all__ = [
    "DEFAULT_APP_XIDS",
    "DEFAULT_HEALTH_READ_S",
    "DEFAULT_REPLACE_XIDS",
    "DEFAULT_RESET_XIDS",
    "DEGRADED",
    "HEALTHY",
    "REPLACE",
    "RESET",
    "UNHEALTHY",
    "FaultFile",
    "GpuHealthReading",
    "GpuHealthTracker",
    "GpuSignals",
    "HealthOptions",
    "HealthWatch",
    "SimFaults",
    "XidPolicy",
    "format_xids",
    "parse_fault",
    "parse_xids",
    "xid_list_problem",
]

DEFAULT_HEALTH_READ_S = 10.0
"""How often the slow signals (row remaps, retired pages, NVLink, PCIe) are read per GPU."""


@dataclass(frozen=True, slots=True)
class HealthOptions:
    """What the agent's config says about GPU health watching."""

    policy: XidPolicy = field(default_factory=XidPolicy)
    read_s: float = DEFAULT_HEALTH_READ_S
    """Seconds between reads of the slow signals (0: every tick)."""
    simulate_faults: str = ""
    """``--simulate-faults FILE`` ("": none); simulated GPUs only."""
    enabled: bool = True
    """Watch the signals (``--gpu-health on``); off: only a lost GPU is noticed, as it always was."""
