"""The one classification of a GPU's health signals, for real (NVML) and simulated GPUs alike.

A backend reads its GPUs' signals each tick (:class:`~agent.collectors.base.GpuSignals`) and hands
them to a :class:`HealthWatch`, which keeps one :class:`GpuHealthTracker` per GPU and returns its
:class:`~agent.collectors.base.GpuHealthReading`. The table (docs/gpu-health-signals.md):

==============================================  ===========  =======  =====================
signal                                          state        action   clears
==============================================  ===========  =======  =====================
application XID (13, 31, 43, 45, 68)            healthy      none     (counted on the GPU)
XID of the replace list (74, 79), GPU lost,     unhealthy    replace  when the agent restarts
row remap failure
XID of the reset list (48, 63, 64, 92, 94,      unhealthy    reset    after a GPU reset
95, ...), any other XID, double-bit ECC event
uncorrectable volatile ECC > 0, row remap       unhealthy    reset    when it reads healthy
pending, retired pages pending, NVML says                             again (after a reset)
"reset required"
hardware slowdown, thermal slowdown, power      degraded     none     when it reads healthy
brake, PCIe link narrower (or, while busy,
slower) than its maximum, an NVLink that was
up at start and is down now
==============================================  ===========  =======  =====================

XIDs are events: one of the reset kind holds the GPU unhealthy until the GPU shows it was reset
(``GpuSignals.reset_seen``); the other reset-kind signals are levels and clear as soon as they
read healthy. Replace-kind findings hold until the agent restarts; the coordinator's admin resume is
the gate that brings such a GPU back into service.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from agent.health.readings import GpuHealthReading, GpuSignals
from common.errors import ConfigError, ValidationError

if TYPE_CHECKING:
    from agent.collectors.base import GpuReading

__all__ = [
    "CLOCKS_HW_POWER_BRAKE",
    "CLOCKS_HW_SLOWDOWN",
    "CLOCKS_HW_THERMAL",
    "CLOCKS_SW_THERMAL",
    "DEFAULT_APP_XIDS",
    "DEFAULT_REPLACE_XIDS",
    "DEFAULT_RESET_XIDS",
    "DEGRADED",
    "HEALTHY",
    "REPLACE",
    "RESET",
    "UNHEALTHY",
    "GpuHealthTracker",
    "HealthWatch",
    "XidPolicy",
    "format_xids",
    "parse_xids",
    "xid_list_problem",
]

HEALTHY, DEGRADED, UNHEALTHY = "healthy", "degraded", "unhealthy"
NONE, RESET, REPLACE = "none", "reset", "replace"

DEFAULT_APP_XIDS = (13, 31, 43, 45, 68)
"""The application's own faults (graphics engine exception, MMU fault, reset channel, NVDEC/NVJPG
errors): the task is told, the GPU stays healthy."""
DEFAULT_RESET_XIDS = (48, 61, 62, 63, 64, 92, 94, 95, 119, 120, 140)
"""Faults a GPU reset clears: double-bit ECC (48), micro-controller breakpoint/halt (61, 62), row
remap or page retirement recorded / failed to record (63, 64), high single-bit ECC rate (92),
contained and uncontained ECC errors (94, 95), GSP timeout and error (119, 120), unrecovered ECC (140)."""
DEFAULT_REPLACE_XIDS = (74, 79)
"""Faults a reset does not clear: NVLink error (74), the GPU fell off the bus (79)."""

# NVML's clocks event (throttle) reasons bits.
CLOCKS_HW_SLOWDOWN = 0x08
CLOCKS_SW_THERMAL = 0x20
CLOCKS_HW_THERMAL = 0x40
CLOCKS_HW_POWER_BRAKE = 0x80
_THROTTLES = ((CLOCKS_HW_POWER_BRAKE, "power brake"), (CLOCKS_HW_THERMAL, "thermal slowdown"),
              (CLOCKS_SW_THERMAL, "thermal slowdown"), (CLOCKS_HW_SLOWDOWN, "hardware slowdown"))

MAX_XID = 65535
_MAX_LATCHED = 16       # distinct latched findings kept per GPU (the first ones; the state is the same)
_MAX_EVIDENCE = 256

Log = structlog.typing.FilteringBoundLogger


def parse_xids(text: str, field: str) -> tuple[int, ...]:
    """A comma list of XID codes (``"13,31, 43"``; ``""`` is none), sorted, each once.

    :raises ValidationError: naming ``field`` and the entry that is not an XID (1..65535).
    """
    codes: set[int] = set()
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        if not entry.isdigit() or not 1 <= int(entry) <= MAX_XID:
            raise ValidationError(field, f"{entry[:16]!r} is not an XID code (1..{MAX_XID})")
        codes.add(int(entry))
    return tuple(sorted(codes))


def xid_list_problem(value: str) -> str | None:
    """A config check (``option(check=...)``): None when ``value`` is a valid XID list."""
    try:
        parse_xids(value, "xids")
    except ValidationError as e:
        return e.problem
    return None


def format_xids(codes: Iterable[int]) -> str:
    """XID codes as the comma list the config takes."""
    return ",".join(str(c) for c in sorted(codes))


@dataclass(frozen=True, slots=True)
class XidPolicy:
    """Which XIDs are the application's fault, which need a reset and which a replacement.

    An XID in none of the lists is treated as needing a reset (critical until a reset shows otherwise).
    """

    app: frozenset[int] = frozenset(DEFAULT_APP_XIDS)
    reset: frozenset[int] = frozenset(DEFAULT_RESET_XIDS)
    replace: frozenset[int] = frozenset(DEFAULT_REPLACE_XIDS)

    @classmethod
    def from_lists(cls, app: str, reset: str, replace: str) -> XidPolicy:
        """The policy from the config's three comma lists.

        :raises ConfigError: an entry that is not an XID, or an XID in two lists (naming both flags).
        """
        try:
            lists = {"app_xids": parse_xids(app, "app_xids"), "reset_xids": parse_xids(reset, "reset_xids"),
                     "replace_xids": parse_xids(replace, "replace_xids")}
        except ValidationError as e:
            raise ConfigError(f"--{e.field.replace('_', '-')}: {e.problem}") from None
        names = list(lists)
        for i, first in enumerate(names):
            for second in names[i + 1:]:
                both = set(lists[first]) & set(lists[second])
                if both:
                    raise ConfigError(f"--{second.replace('_', '-')}: XID {min(both)} is also in "
                                      f"--{first.replace('_', '-')}; each XID belongs to one list")
        return cls(frozenset(lists["app_xids"]), frozenset(lists["reset_xids"]), frozenset(lists["replace_xids"]))

    def kind(self, xid: int) -> str:
        """``app``, ``replace``, ``reset`` or ``unknown`` (which is handled as ``reset``)."""
        if xid in self.app:
            return "app"
        if xid in self.replace:
            return REPLACE
        return RESET if xid in self.reset else "unknown"


@dataclass(frozen=True, slots=True)
class _Finding:
    action: str       # NONE for degraded findings
    reason: str
    evidence: str


class GpuHealthTracker:
    """One GPU's health over time: latched XIDs and replace-kind findings, the level signals' last values.

    :param policy: the XID lists. :param simulated: the signals come from ``--simulate-faults``.
    """

    def __init__(self, policy: XidPolicy, *, simulated: bool = False) -> None:
        self.policy = policy
        self.simulated = simulated
        self._replace: dict[str, _Finding] = {}     # by reason; until the agent restarts
        self._reset_xids: dict[str, _Finding] = {}  # by reason; until the GPU shows a reset
        self._levels: dict[str, tuple[_Finding, ...]] = {}   # per signal, its findings as last read
        self._state = (HEALTHY, NONE)
        self._since = 0.0
        self.app_xid_count = 0
        self.app_xid_last = 0
        self.app_xid_unix_s = 0.0
        self.xid_last: int | None = None

    def update(self, signals: GpuSignals, now_unix_s: float) -> GpuHealthReading:
        """Fold this tick's signals in and return the GPU's health now."""
        if signals.reset_seen:
            self._reset_xids.clear()
        for code, at in signals.xids:
            self._xid(code, at)
        if signals.lost:
            self._latch(self._replace, _Finding(REPLACE, "gpu lost", signals.lost))
        if signals.remap_failure:
            self._latch(self._replace, _Finding(REPLACE, "row remap failure", "remapped_rows_failure=1"))
        self._level("reset_required", True,
                    [_Finding(RESET, "reset required", signals.reset_required)] if signals.reset_required else [])
        self._level("ecc", signals.ecc_uncorrected_volatile is not None,
                    [_Finding(RESET, "uncorrectable ecc",
                              f"ecc_uncorrected_volatile={signals.ecc_uncorrected_volatile}")]
                    if (signals.ecc_uncorrected_volatile or 0) > 0 else [])
        self._level("remap", signals.remap_pending is not None,
                    [_Finding(RESET, "row remap pending",
                              f"remapped_rows_pending=1 uncorrectable={signals.remapped_uncorrectable or 0}")]
                    if signals.remap_pending else [])
        self._level("retired", signals.retired_pages_pending is not None,
                    [_Finding(RESET, "page retirement pending", "retired_pages_pending=1")]
                    if signals.retired_pages_pending else [])
        self._level("clocks", signals.clocks_event_reasons is not None, _throttle(signals.clocks_event_reasons))
        self._level("pcie", signals.pcie_width is not None or signals.pcie_gen is not None, _pcie(signals))
        self._level("nvlink", signals.nvlinks_down is not None,
                    [_Finding(NONE, "nvlink down", "nvlink " + ",".join(map(str, signals.nvlinks_down)) + " down")]
                    if signals.nvlinks_down else [])
        return self._reading(now_unix_s)

    @property
    def state(self) -> tuple[str, str]:
        """(state, action) as of the last update."""
        return self._state

    def _xid(self, code: int, at: float) -> None:
        self.xid_last = code
        kind = self.policy.kind(code)
        if kind == "app":
            self.app_xid_count += 1
            self.app_xid_last, self.app_xid_unix_s = code, at
        elif kind == REPLACE:
            self._latch(self._replace, _Finding(REPLACE, f"xid {code}", f"xid={code}"))
        else:
            reason = f"xid {code}" if kind == RESET else f"xid {code} (unclassified)"
            self._latch(self._reset_xids, _Finding(RESET, reason, f"xid={code}"))

    @staticmethod
    def _latch(into: dict[str, _Finding], finding: _Finding) -> None:
        if finding.reason not in into and len(into) < _MAX_LATCHED:
            into[finding.reason] = finding

    def _level(self, signal: str, read: bool, findings: Sequence[_Finding]) -> None:
        """A level signal's findings as read now; an unread signal keeps its last findings."""
        if read:
            self._levels[signal] = tuple(findings)

    def _reading(self, now_unix_s: float) -> GpuHealthReading:
        levels = [f for found in self._levels.values() for f in found]
        replace = list(self._replace.values())
        reset = list(self._reset_xids.values()) + [f for f in levels if f.action == RESET]
        degraded = [f for f in levels if f.action == NONE]
        if replace:
            state, findings = (UNHEALTHY, REPLACE), replace
        elif reset:
            state, findings = (UNHEALTHY, RESET), reset
        elif degraded:
            state, findings = (DEGRADED, NONE), degraded
        else:
            state, findings = (HEALTHY, NONE), []
        if state != self._state or self._since == 0.0:
            self._state, self._since = state, now_unix_s
        evidence = "; ".join(dict.fromkeys(f.evidence for f in findings))
        if self.simulated and evidence:
            evidence += " (simulated)"
        return GpuHealthReading(
            state=state[0], action=state[1], reason=findings[0].reason if findings else "",
            evidence=evidence[:_MAX_EVIDENCE], since_unix_s=self._since, simulated=self.simulated,
            app_xid_count=self.app_xid_count, app_xid_last=self.app_xid_last, app_xid_unix_s=self.app_xid_unix_s,
        )


def _throttle(reasons: int | None) -> list[_Finding]:
    if not reasons:
        return []
    for bit, reason in _THROTTLES:
        if reasons & bit:
            return [_Finding(NONE, reason, f"clocks_event_reasons={reasons:#x}")]
    return []


def _pcie(s: GpuSignals) -> list[_Finding]:
    found = []
    if s.pcie_width is not None and s.pcie_width_max and s.pcie_width < s.pcie_width_max:
        found.append(_Finding(NONE, "pcie link narrower", f"pcie_width={s.pcie_width} max={s.pcie_width_max}"))
    if s.busy and s.pcie_gen is not None and s.pcie_gen_max and s.pcie_gen < s.pcie_gen_max:
        found.append(_Finding(NONE, "pcie link slower", f"pcie_gen={s.pcie_gen} max={s.pcie_gen_max}"))
    return found


class HealthWatch:
    """The node's GPUs' trackers, one per GPU index, and the log of their changes.

    :param count: GPUs. :param policy: the XID lists. :param log: where changes are logged.
    :param simulated: the signals come from ``--simulate-faults``. :param now: wall clock.
    """

    def __init__(self, count: int, policy: XidPolicy, log: Log, *, simulated: bool = False,
                 now: Callable[[], float] = time.time) -> None:
        self._trackers = [GpuHealthTracker(policy, simulated=simulated) for _ in range(count)]
        self._last: list[GpuHealthReading | None] = [None] * count
        self._log = log
        self._now = now

    def forget(self, index: int) -> None:
        """Start GPU ``index``'s health over, as after the agent restarts (latched findings dropped)."""
        old = self._trackers[index]
        self._trackers[index] = GpuHealthTracker(old.policy, simulated=old.simulated)
        self._last[index] = None

    def update(self, index: int, signals: GpuSignals) -> tuple[GpuHealthReading, int | None]:
        """GPU ``index``'s health after this tick's signals, and its last XID (None: none yet)."""
        tracker = self._trackers[index]
        app_before = tracker.app_xid_count
        reading = tracker.update(signals, self._now())
        last = self._last[index]
        if tracker.app_xid_count != app_before:
            self._log.info("gpu_app_xid", gpu_index=index, xid=tracker.app_xid_last, count=tracker.app_xid_count,
                           simulated=reading.simulated)
        was = (last.state, last.action, last.reason) if last is not None else (HEALTHY, NONE, "")
        if was != (reading.state, reading.action, reading.reason):
            level = self._log.info if reading.state == HEALTHY else self._log.warning
            level("gpu_health_changed", gpu_index=index, state=reading.state, action=reading.action,
                  reason=reading.reason, evidence=reading.evidence, simulated=reading.simulated)
        self._last[index] = reading
        return reading, tracker.xid_last

    def classify(self, reading: GpuReading, signals: GpuSignals) -> GpuReading:
        """``reading`` with its health, its last XID and the signals; an unhealthy GPU also reads
        ``healthy=False`` with the reason (what readers older than ``GpuSample.health`` look at)."""
        health, xid_last = self.update(reading.index, signals)
        unhealthy = health.state == UNHEALTHY
        reason = health.reason + (" (simulated)" if health.simulated else "") if unhealthy else ""
        return dataclasses.replace(reading, health=health, xid_last=xid_last, signals=signals,
                                   healthy=not unhealthy, health_reason=reason)
