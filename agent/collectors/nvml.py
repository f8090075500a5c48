"""Real GPUs through NVML (``pynvml`` from nvidia-ml-py).

``pynvml`` is imported inside :func:`open_nvml`, so this module imports on machines
without NVML. Handles are opened once there; every tick :meth:`NvmlCollector.collect`
reads each GPU's raw values (``_read_*``) and :func:`parse_gpu_reading` turns them into a
:class:`GpuReading` with SI units.

At open, each GPU's topology is read too (:func:`read_topology`): its NUMA node, the CPUs
close to it and how it reaches every other GPU (active NVLinks per peer, else the PCIe common
ancestor). A query that fails leaves that fact unknown and is logged once, at open.

A field the GPU does not support is absent from the reading and never queried again on
that GPU; a GPU that fell off the bus is reported ``healthy=False`` while the others are
still sampled.

Health signals (:class:`NvmlHealth`, classified by :mod:`agent.health` like simulated GPUs' faults):

- XID events (``nvmlEventTypeXidCriticalError``, and ``nvmlEventTypeDoubleBitEccError`` where the GPU
  offers it, counted as XID 48), registered once on one event set and waited for with
  ``nvmlEventSetWait_v2`` in a thread of their own: the wait blocks inside NVML (no CPU while idle) and
  times out every :data:`EVENT_WAIT_MS` to see whether the agent is stopping.
- Every tick, with the other fields: volatile ECC (already read) and the clocks event reasons
  (``nvmlDeviceGetCurrentClocksEventReasons``, else the older ``...ThrottleReasons``).
- Every ``--health-read-interval`` seconds (10 by default), the slow signals: remapped rows
  (``nvmlDeviceGetRemappedRows``: pending, failure), or on GPUs older than row remapping the retired
  pages (``nvmlDeviceGetRetiredPagesPendingStatus``, ``nvmlDeviceGetRetiredPages``); the PCIe link's
  current generation and width against its maximum (read once at open); and each NVLink that was up
  at open (``nvmlDeviceGetNvLinkState``).

A signal the GPU does not support (NotSupported, FunctionNotFound) is skipped on that GPU from then on
and logged once (``gpu_health_signal_unsupported``). A GPU reset shows as its volatile ECC counters
going back, a pending remap clearing, or a GPU that NVML said needed a reset answering again
(``GpuSignals.reset_seen``).

The energy counter is the exception to reading everything every tick: its query costs about
4 ms of CPU per GPU on an H200 (driver 580), where every other field of a tick together costs
under 1 ms, so 8 GPUs read at 1 Hz would take 3 % of a core for it alone. It is read every
:data:`ENERGY_READ_S` seconds and carried forward in between by the GPU's power readings
(:class:`EnergyCounter`): the reported counter is exact at each read and never goes back.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import structlog

from agent.collectors.base import GpuDevice, GpuProcessReading, GpuReading, GpuSignals
from agent.health import HealthOptions, HealthWatch
from common.errors import CollectorError, ValidationError
from common.topology import MAX_CPUS, MAX_NUMA_NODE, GpuTopologyFacts, LinkLevel

__all__ = [
    "ENERGY_READ_S",
    "EVENT_WAIT_MS",
    "NAME",
    "EnergyCounter",
    "NvmlCollector",
    "NvmlEvents",
    "NvmlHealth",
    "load_pynvml",
    "open_nvml",
    "parse_gpu_reading",
    "parse_topology_groups",
    "read_topology",
]

NAME = "nvml"
ENERGY_READ_S = 10.0   # a GPU's energy counter is read this often, carried forward by its power in between
EVENT_WAIT_MS = 1000   # the XID event thread's longest wait; it stops within this after close()
_EVENTS_KEPT = 64      # XID events kept per GPU between two ticks (the oldest dropped beyond)
_XID_DBE = 48          # a double-bit ECC event is what XID 48 reports

Log = structlog.typing.FilteringBoundLogger
RawGpu = Mapping[str, Any]
"""Raw NVML results of one GPU by field name (see ``_FIELDS``); unsupported fields are missing."""

# One entry per NVML query made every tick. Each takes (pynvml, handle).
_FIELDS: dict[str, Callable[[Any, Any], Any]] = {
    "utilization": lambda m, h: m.nvmlDeviceGetUtilizationRates(h),
    "memory": lambda m, h: m.nvmlDeviceGetMemoryInfo(h),
    "power_usage": lambda m, h: m.nvmlDeviceGetPowerUsage(h),
    "power_limit": lambda m, h: m.nvmlDeviceGetEnforcedPowerLimit(h),
    "energy": lambda m, h: m.nvmlDeviceGetTotalEnergyConsumption(h),
    "temperature": lambda m, h: m.nvmlDeviceGetTemperature(h, m.NVML_TEMPERATURE_GPU),
    "sm_clock": lambda m, h: m.nvmlDeviceGetClockInfo(h, m.NVML_CLOCK_SM),
    "mem_clock": lambda m, h: m.nvmlDeviceGetClockInfo(h, m.NVML_CLOCK_MEM),
    "ecc_corrected": lambda m, h: m.nvmlDeviceGetTotalEccErrors(
        h, m.NVML_MEMORY_ERROR_TYPE_CORRECTED, m.NVML_VOLATILE_ECC
    ),
    "ecc_uncorrected": lambda m, h: m.nvmlDeviceGetTotalEccErrors(
        h, m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, m.NVML_VOLATILE_ECC
    ),
    "processes": lambda m, h: m.nvmlDeviceGetComputeRunningProcesses(h),
    "mig_mode": lambda m, h: m.nvmlDeviceGetMigMode(h),
}


def load_pynvml() -> ModuleType:
    """Import ``pynvml``.

    :raises CollectorError: when nvidia-ml-py is not installed.
    """
    try:
        return importlib.import_module("pynvml")
    except ImportError as e:
        raise CollectorError(f"NVML unavailable: cannot import pynvml (nvidia-ml-py): {e}") from e


def open_nvml(log: Log, module: ModuleType | None = None, *, sysfs: Path = Path("/sys"),
              clock: Callable[[], float] = time.monotonic, energy_read_s: float = ENERGY_READ_S,
              health: HealthOptions | None = None, event_wait_ms: int = EVENT_WAIT_MS) -> NvmlCollector:
    """Initialise NVML, open every GPU's handle and read the inventory.

    Example::

        gpus = open_nvml(log)
        readings = gpus.collect()
        gpus.close()

    :param log: logger for GPU health changes.
    :param module: the ``pynvml`` module (tests pass a fake); imported when None.
    :param sysfs: where sysfs is mounted (a GPU's NUMA node when NVML does not tell it).
    :param clock: monotonic seconds (tests pass a fake one).
    :param energy_read_s: how often each GPU's energy counter is read (0: every tick).
    :param health: GPU health watching (XID lists, slow-signal interval); defaults when None.
    :param event_wait_ms: the XID event thread's longest wait (it stops within this of ``close``).
    :returns: the collector, owning NVML until :meth:`NvmlCollector.close`.
    :raises CollectorError: when pynvml is missing, the library is not found or nvmlInit fails.
    """
    nvml = module if module is not None else load_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        raise CollectorError(f"NVML unavailable: nvmlInit failed: {e}") from e
    try:
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    except nvml.NVMLError as e:
        _shutdown_quietly(nvml)
        raise CollectorError(f"NVML unavailable: cannot open GPU handles: {e}") from e
    devices = _read_inventory(nvml, handles)
    facts = read_topology(nvml, handles, [d.pci_bus_id for d in devices], log, sysfs=sysfs)
    devices = [
        dataclasses.replace(d, numa_node=f.numa_node, cpu_affinity=f.cpu_affinity, links=f.links)
        for d, f in zip(devices, facts, strict=True)
    ]
    log.info("nvml_opened", gpu_count=count, models=sorted({d.model for d in devices}))
    health = health or HealthOptions()
    watcher = NvmlHealth(nvml, handles, log, health, clock=clock, wait_ms=event_wait_ms) if health.enabled else None
    return NvmlCollector(nvml, handles, devices, log, clock=clock, energy_read_s=energy_read_s, health=health,
                         watcher=watcher)


class EnergyCounter:
    """One GPU's energy counter as the collector reports it, in mJ: NVML's counter where it was just
    read, else the counter at the last read plus the trapezoid of the power readings since.

    The value never decreases: where the power readings ran ahead of the counter, the value is held
    until the counter (or the next estimate from it) passes it, so an estimate's error is never
    carried past the next read. Only the counter itself going back (the driver reloaded) sets it lower.
    """

    __slots__ = ("_at", "_power_mw", "_raw", "_since_read", "read_at", "value")

    def __init__(self) -> None:
        self.value: float | None = None    # what was reported last (mJ)
        self.read_at: float | None = None  # clock of the last counter read
        self._raw = 0.0                    # the counter at that read
        self._since_read = 0.0             # mJ the power readings add up to since then
        self._at = 0.0                     # clock of the last power reading
        self._power_mw: float | None = None

    def due(self, now: float, every_s: float) -> bool:
        """Whether the counter should be read now: never read, ``every_s`` passed, or no power to
        carry it by."""
        return self.read_at is None or now - self.read_at >= every_s or self._power_mw is None

    def read(self, now: float, raw_mj: float, power_mw: float | None) -> float:
        """The value after a read of the counter (``raw_mj``) with the power at the same tick."""
        raw = float(raw_mj)
        if self.value is None or raw < self._raw:
            self.value = raw   # the first read, or the counter restarted
        else:
            self.value = max(self.value, raw)
        self._raw, self._since_read, self.read_at, self._at, self._power_mw = raw, 0.0, now, now, power_mw
        return self.value

    def carry(self, now: float, power_mw: float | None) -> float | None:
        """The value at a tick without a read (None before the first read): the counter at the last
        read plus the mean of each two successive power readings times the time between them
        (mW × s = mJ). Without a power reading the value stays and the next tick reads the counter."""
        if self.value is None:
            return None
        if power_mw is not None and self._power_mw is not None and now > self._at:
            self._since_read += 0.5 * (power_mw + self._power_mw) * (now - self._at)
            self.value = max(self.value, self._raw + self._since_read)
        self._at, self._power_mw = now, power_mw
        return self.value


class NvmlCollector:
    """The node's GPUs read through NVML; built by :func:`open_nvml`.

    :param clock: monotonic seconds (tests pass a fake one).
    :param energy_read_s: how often each GPU's energy counter is read (0: every tick).
    """

    name = NAME
    backend = NAME
    simulated = False

    def __init__(self, nvml: Any, handles: list[Any], devices: list[GpuDevice], log: Log, *,
                 clock: Callable[[], float] = time.monotonic, energy_read_s: float = ENERGY_READ_S,
                 health: HealthOptions | None = None, watcher: NvmlHealth | None = None,
                 now: Callable[[], float] = time.time) -> None:
        """:param nvml: the initialised ``pynvml`` module. :param handles: one per GPU index.
        :param watcher: reads the health signals beyond the tick's fields (None: ``--gpu-health off``)."""
        self._nvml = nvml
        self._handles = handles
        self._devices = devices
        self._log = log
        self._clock = clock
        self._energy_read_s = energy_read_s
        self._energy = [EnergyCounter() for _ in handles]
        self._unsupported: list[set[str]] = [set() for _ in handles]
        self._watch = HealthWatch(len(handles), (health or HealthOptions()).policy, log, now=now)
        self._watcher = watcher
        self._resetting: set[int] = set()   # GPUs NVML last said need a reset
        self._closed = False

    def devices(self) -> list[GpuDevice]:
        """The inventory, with each GPU's enforced power limit as last read."""
        return list(self._devices)

    def collect(self) -> list[GpuReading]:
        """Read every GPU; a lost GPU yields an unhealthy reading, the others are unaffected."""
        readings = []
        lost, reset_required = self._nvml.NVMLError_GpuIsLost, self._nvml.NVMLError_ResetRequired
        for index, device in enumerate(self._devices):
            try:
                raw = self._read_gpu(index)
                reading = parse_gpu_reading(index, device.uuid, raw)
                signals = self._signals(index, raw, reading)
                if index in self._resetting:   # it needed a reset and answers again: it was reset
                    self._resetting.discard(index)
                    signals = dataclasses.replace(signals, reset_seen=True)
            except (lost, reset_required) as e:
                # Only "the GPU is gone" errors get here (see _read_gpu); report it, keep going.
                reading = GpuReading(index=index, uuid=device.uuid)
                why = str(e) or type(e).__name__
                if isinstance(e, reset_required):
                    self._resetting.add(index)
                signals = GpuSignals(lost=why if isinstance(e, lost) else "", xids=self._xids(index),
                                     reset_required=why if isinstance(e, reset_required) else "")
            reading = self._watch.classify(reading, signals)
            if reading.power_limit_w is not None and reading.power_limit_w != device.power_limit_w:
                self._devices[index] = dataclasses.replace(device, power_limit_w=reading.power_limit_w)
            readings.append(reading)
        return readings

    def set_power_limit(self, index: int, watts: float) -> None:
        """Set GPU ``index``'s power limit (needs root).

        Example: ``gpus.set_power_limit(0, 350.0)``.

        :raises ValidationError: when the index is unknown or ``watts`` is outside [min, max].
        :raises CollectorError: when NVML refuses (no permission, not supported).
        """
        device = _checked_device(self._devices, index, watts)
        try:
            self._nvml.nvmlDeviceSetPowerManagementLimit(self._handles[index], round(watts * 1000))
        except self._nvml.NVMLError as e:
            raise CollectorError(f"setting the power limit of GPU {index} to {watts} W failed: {e}") from e
        self._devices[index] = dataclasses.replace(device, power_limit_w=float(watts))

    def close(self) -> None:
        """Stop the XID event thread and shut NVML down; calling it twice is harmless."""
        if not self._closed:
            self._closed = True
            if self._watcher is not None:
                self._watcher.close()
            _shutdown_quietly(self._nvml)

    def _xids(self, index: int) -> tuple[tuple[int, float], ...]:
        return self._watcher.events.drain(index) if self._watcher is not None else ()

    def _signals(self, index: int, raw: Mapping[str, Any], reading: GpuReading) -> GpuSignals:
        """The tick's health signals of GPU ``index``: the fields read anyway, and the watcher's."""
        base = GpuSignals(ecc_uncorrected_volatile=raw.get("ecc_uncorrected"),
                          ecc_corrected_volatile=raw.get("ecc_corrected"),
                          busy=(reading.util_gpu or 0.0) >= _BUSY)
        if self._watcher is None:
            return base
        return self._watcher.signals(index, base)

    def _read_gpu(self, index: int) -> dict[str, Any]:
        """Raw values of every supported field of GPU ``index`` (the energy counter read when due,
        else carried forward: :class:`EnergyCounter`).

        :raises NVMLError: only GpuIsLost or ResetRequired; other failures drop the field.
        """
        nvml, handle, unsupported = self._nvml, self._handles[index], self._unsupported[index]
        lost = (nvml.NVMLError_GpuIsLost, nvml.NVMLError_ResetRequired)
        not_supported = (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound)
        now, energy = self._clock(), self._energy[index]
        read_energy = energy.due(now, self._energy_read_s)
        raw: dict[str, Any] = {}
        for field, call in _FIELDS.items():
            if field in unsupported or (field == "energy" and not read_energy):
                continue
            try:
                raw[field] = call(nvml, handle)
            except lost:
                raise
            except not_supported:
                unsupported.add(field)
                self._log.debug("gpu_field_marked_unsupported", gpu_index=index, field=field)
            except nvml.NVMLError as e:
                self._log.debug("gpu_field_failed", gpu_index=index, field=field, reason=str(e))
        if "energy" in raw:
            raw["energy"] = energy.read(now, raw["energy"], raw.get("power_usage"))
        elif "energy" not in unsupported:
            carried = energy.carry(now, raw.get("power_usage"))
            if carried is not None:
                raw["energy"] = carried
        return raw



_BUSY = 0.1
"""A GPU at least this busy keeps its PCIe link at full speed (idle links slow down to save power)."""


class NvmlEvents:
    """XID (and double-bit ECC) events of every GPU, waited for in a thread of its own.

    One event set holds every GPU's registration; the thread blocks in ``nvmlEventSetWait_v2`` (NVML waits,
    Python does not run) for up to ``wait_ms`` at a time, files each event under its GPU, and stops
    within ``wait_ms`` of :meth:`close`. Nothing is registered (and no thread runs) where NVML offers no
    events; that is logged once.
    """

    def __init__(self, nvml: Any, handles: list[Any], log: Log, *, wait_ms: int = EVENT_WAIT_MS,
                 now: Callable[[], float] = time.time) -> None:
        self._nvml = nvml
        self._log = log
        self._wait_ms = wait_ms
        self._now = now
        self._queues: list[collections.deque[tuple[int, float]]] = [
            collections.deque(maxlen=_EVENTS_KEPT) for _ in handles]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: Any = None
        self._xid_type = int(getattr(nvml, "nvmlEventTypeXidCriticalError", 0x8))
        self._dbe_type = int(getattr(nvml, "nvmlEventTypeDoubleBitEccError", 0x2))
        self.registered: list[int] = []
        try:
            self._set = nvml.nvmlEventSetCreate()
        except (nvml.NVMLError, AttributeError) as e:
            log.info("gpu_health_signal_unsupported", signal="xid_events", gpu_index=-1, reason=str(e))
            return
        for index, handle in enumerate(handles):
            self._register(index, handle)
        if not self.registered:
            self._free()
            return
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()

    def _register(self, index: int, handle: Any) -> None:
        nvml = self._nvml
        wanted = self._xid_type | self._dbe_type
        try:
            types = wanted & int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
        except nvml.NVMLError:
            types = self._xid_type
        if not types & self._xid_type:
            self._log.info("gpu_health_signal_unsupported", signal="xid_events", gpu_index=index,
                           reason="the GPU offers no XID events")
            return
        try:
            nvml.nvmlDeviceRegisterEvents(handle, types, self._set)
        except nvml.NVMLError as e:
            self._log.info("gpu_health_signal_unsupported", signal="xid_events", gpu_index=index, reason=str(e))
            return
        self.registered.append(index)

    def drain(self, index: int) -> tuple[tuple[int, float], ...]:
        """GPU ``index``'s events since the last drain: (XID, wall-clock seconds)."""
        with self._lock:
            queue = self._queues[index]
            events = tuple(queue)
            queue.clear()
        return events

    def close(self) -> None:
        """Stop the thread (within ``wait_ms``) and free the event set; calling it twice is harmless."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._wait_ms / 1000.0 + 2.0)
            self._thread = None
        self._free()

    def _free(self) -> None:
        if self._set is not None:
            event_set, self._set = self._set, None
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlEventSetFree(event_set)

    def _run(self) -> None:
        nvml = self._nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        timeout = getattr(nvml, "NVMLError_Timeout", ())
        uninitialized = getattr(nvml, "NVMLError_Uninitialized", ())
        failed = ""
        while not self._stop.is_set():
            try:
                data = wait(self._set, self._wait_ms)
            except timeout:
                continue
            except uninitialized:
                return   # NVML was shut down under us
            except (nvml.NVMLError_FunctionNotFound, nvml.NVMLError_NotSupported) as e:
                self._log.info("gpu_health_signal_unsupported", signal="xid_events", gpu_index=-1, reason=str(e))
                return
            except nvml.NVMLError as e:
                if str(e) != failed:   # logged once per kind of failure; retried after a pause
                    failed = str(e)
                    self._log.warning("gpu_xid_wait_failed", reason=failed)
                self._stop.wait(1.0)
                continue
            self._file(data)

    def _file(self, data: Any) -> None:
        event_type = int(data.eventType)
        code = _XID_DBE if event_type & self._dbe_type and not event_type & self._xid_type else int(data.eventData)
        try:
            indices = [int(self._nvml.nvmlDeviceGetIndex(data.device))]
        except (self._nvml.NVMLError, ValueError, TypeError, AttributeError):
            indices = []
        if not indices or not 0 <= indices[0] < len(self._queues):
            # An event NVML does not tie to one GPU concerns them all.
            self._log.warning("gpu_xid_unattributed", xid=code)
            indices = list(self.registered)
        at = self._now()
        with self._lock:
            for index in indices:
                self._queues[index].append((code, at))


@dataclasses.dataclass(slots=True)
class _SlowSignals:
    """One GPU's slow signals as last read, carried between reads."""

    read_at: float | None = None
    remap: tuple[int, int, bool, bool] | None = None
    retired_pending: bool | None = None
    retired_dbe: int | None = None
    pcie: tuple[int, int] | None = None      # current (gen, width)
    pcie_max: tuple[int, int] | None = None  # read at open
    nvlinks_up: tuple[int, ...] = ()         # up at open
    nvlinks_down: tuple[int, ...] | None = None
    ecc: tuple[int | None, int | None] = (None, None)   # last tick's volatile (corrected, uncorrected)


class NvmlHealth:
    """The health signals NVML gives beyond the tick's fields: XID events (:class:`NvmlEvents`), the clocks
    event reasons every tick, and the slow signals every ``options.read_s`` (see the module docstring).

    :param clock: monotonic seconds, for the slow signals' cadence. :param wait_ms: the event thread's wait.
    """

    def __init__(self, nvml: Any, handles: list[Any], log: Log, options: HealthOptions, *,
                 clock: Callable[[], float] = time.monotonic, wait_ms: int = EVENT_WAIT_MS) -> None:
        self._nvml = nvml
        self._handles = handles
        self._log = log
        self._read_s = options.read_s
        self._clock = clock
        self._unsupported: list[set[str]] = [set() for _ in handles]
        self._slow = [_SlowSignals() for _ in handles]
        for index, handle in enumerate(handles):
            slow = self._slow[index]
            try:
                slow.pcie_max = self._ask(index, "pcie", lambda h: (int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(h)),
                                                                    int(nvml.nvmlDeviceGetMaxPcieLinkWidth(h))))
            except nvml.NVMLError:
                slow.pcie_max = None   # lost at open: it is reported lost at the first tick
            slow.nvlinks_up = _nvlinks_up(nvml, handle)
        self.events = NvmlEvents(nvml, handles, log, wait_ms=wait_ms)

    def close(self) -> None:
        """Stop the event thread."""
        self.events.close()

    def signals(self, index: int, base: GpuSignals) -> GpuSignals:
        """GPU ``index``'s signals this tick: ``base`` (the ECC counters and business read with the tick's
        fields) with its XID events, clocks reasons and slow signals (read when due, else carried).

        :raises NVMLError: GpuIsLost or ResetRequired (the GPU is reported lost by the collector).
        """
        nvml, slow = self._nvml, self._slow[index]
        now = self._clock()
        reset_seen = _went_back(slow.ecc, (base.ecc_corrected_volatile, base.ecc_uncorrected_volatile))
        slow.ecc = (base.ecc_corrected_volatile, base.ecc_uncorrected_volatile)
        reasons = self._ask(index, "clocks_event_reasons", lambda h: _clocks_reasons_of(nvml, h))
        if slow.read_at is None or now - slow.read_at >= self._read_s:
            slow.read_at = now
            was_pending = slow.remap[2] if slow.remap is not None else False
            slow.remap = self._ask(index, "remapped_rows", lambda h: _remapped_rows(nvml, h))
            if slow.remap is None and "remapped_rows" in self._unsupported[index]:
                slow.retired_pending = self._ask(index, "retired_pages", lambda h: bool(
                    nvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == getattr(nvml, "NVML_FEATURE_ENABLED", 1)))
                retired = self._ask(index, "retired_pages_dbe", lambda h: nvml.nvmlDeviceGetRetiredPages(
                    h, getattr(nvml, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)))
                slow.retired_dbe = len(retired) if retired is not None else None
            reset_seen = reset_seen or (was_pending and slow.remap is not None and not slow.remap[2])
            if slow.pcie_max is not None:
                slow.pcie = self._ask(index, "pcie", lambda h: (int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(h)),
                                                                int(nvml.nvmlDeviceGetCurrPcieLinkWidth(h))))
            if slow.nvlinks_up:
                slow.nvlinks_down = self._ask(index, "nvlink", lambda h: _nvlinks_down(nvml, h, slow.nvlinks_up))
        remap, pcie, pcie_max = slow.remap, slow.pcie, slow.pcie_max
        return dataclasses.replace(
            base, xids=self.events.drain(index), reset_seen=reset_seen, clocks_event_reasons=reasons,
            remapped_correctable=remap[0] if remap else None, remapped_uncorrectable=remap[1] if remap else None,
            remap_pending=remap[2] if remap else None, remap_failure=remap[3] if remap else None,
            retired_pages_pending=slow.retired_pending, retired_pages_dbe=slow.retired_dbe,
            pcie_gen=pcie[0] if pcie else None, pcie_width=pcie[1] if pcie else None,
            pcie_gen_max=pcie_max[0] if pcie_max else None, pcie_width_max=pcie_max[1] if pcie_max else None,
            nvlinks_down=slow.nvlinks_down,
        )

    def _ask(self, index: int, signal: str, call: Callable[[Any], Any]) -> Any:
        """``call(handle)``; None when the signal is unsupported (then never asked again) or failed this time.

        :raises NVMLError: GpuIsLost or ResetRequired.
        """
        nvml, unsupported = self._nvml, self._unsupported[index]
        if signal in unsupported:
            return None
        try:
            return call(self._handles[index])
        except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_ResetRequired):
            raise
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, AttributeError) as e:
            unsupported.add(signal)
            self._log.info("gpu_health_signal_unsupported", signal=signal, gpu_index=index,
                           reason=str(e) or type(e).__name__)
        except nvml.NVMLError as e:
            self._log.debug("gpu_health_signal_failed", signal=signal, gpu_index=index, reason=str(e))
        return None


def _clocks_reasons_of(nvml: Any, handle: Any) -> int:
    """The clocks event reasons bitmask; the older name where the driver lacks the new one."""
    try:
        return int(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    except (nvml.NVMLError_FunctionNotFound, AttributeError):
        return int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


def _remapped_rows(nvml: Any, handle: Any) -> tuple[int, int, bool, bool]:
    correctable, uncorrectable, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
    return int(correctable), int(uncorrectable), bool(pending), bool(failure)


def _nvlinks_up(nvml: Any, handle: Any) -> tuple[int, ...]:
    """The NVLinks up now (at open); () where the GPU has none or NVML cannot tell."""
    state = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
    if state is None:
        return ()
    up = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if state(handle, link) == getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                up.append(link)
        except nvml.NVMLError:
            if link == 0:
                break   # no NVLink at all
            continue    # past this GPU's last link
    return tuple(up)


def _nvlinks_down(nvml: Any, handle: Any, up_at_start: tuple[int, ...]) -> tuple[int, ...]:
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    return tuple(link for link in up_at_start if nvml.nvmlDeviceGetNvLinkState(handle, link) != enabled)


def _went_back(before: tuple[int | None, int | None], now: tuple[int | None, int | None]) -> bool:
    """A volatile counter lower than last tick: the GPU was reset (they count from the last reset)."""
    return any(b is not None and n is not None and n < b for b, n in zip(before, now, strict=True))


def parse_gpu_reading(index: int, uuid: str, raw: RawGpu) -> GpuReading:
    """Turn raw NVML values into a reading: percent → 0..1, mW → W, mJ → J.

    :param index: GPU index. :param uuid: GPU UUID.
    :param raw: results by ``_FIELDS`` name; a missing key becomes a None field.
    """
    util, mem, mig = raw.get("utilization"), raw.get("memory"), raw.get("mig_mode")
    procs = raw.get("processes") or []
    return GpuReading(
        index=index,
        uuid=uuid,
        util_gpu=util.gpu / 100.0 if util is not None else None,
        util_mem=util.memory / 100.0 if util is not None else None,
        mem_used_bytes=int(mem.used) if mem is not None else None,
        mem_total_bytes=int(mem.total) if mem is not None else None,
        power_w=_scaled(raw.get("power_usage"), 1000.0),
        power_limit_w=_scaled(raw.get("power_limit"), 1000.0),
        energy_j=_scaled(raw.get("energy"), 1000.0),
        temperature_c=_scaled(raw.get("temperature"), 1.0),
        sm_clock_mhz=raw.get("sm_clock"),
        mem_clock_mhz=raw.get("mem_clock"),
        ecc_corrected_total=raw.get("ecc_corrected"),
        ecc_uncorrected_total=raw.get("ecc_uncorrected"),
        mig_enabled=bool(mig[0]) if mig is not None else None,
        processes=tuple(GpuProcessReading(pid=int(p.pid), used_mem_bytes=p.usedGpuMemory) for p in procs),
    )


def parse_topology_groups(count: int, linked: Mapping[tuple[int, int], bool | None]) -> list[int]:
    """Group GPUs that share an NVLink domain or a PCIe switch.

    :param count: number of GPUs.
    :param linked: for pairs ``(i, j)`` with i < j: True when close, False when not, None unknown.
    :returns: a group number per GPU (0, 1, ... in index order), all -1 when nothing is known.
    """
    if count > 1 and all(linked.get((i, j)) is None for i in range(count) for j in range(i + 1, count)):
        return [-1] * count
    parent = list(range(count))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for (i, j), close in linked.items():
        if close:
            parent[max(root(i), root(j))] = min(root(i), root(j))
    numbers: dict[int, int] = {}
    return [numbers.setdefault(root(i), len(numbers)) for i in range(count)]


def _scaled(value: float | None, divisor: float) -> float | None:
    return value / divisor if value is not None else None


def _checked_device(devices: list[GpuDevice], index: int, watts: float) -> GpuDevice:
    """The device at ``index`` once ``watts`` is known to be within its allowed range."""
    if not 0 <= index < len(devices):
        raise ValidationError("gpu_index", f"GPU {index} does not exist (this node has {len(devices)})")
    device = devices[index]
    if device.power_max_w > 0 and not device.power_min_w <= watts <= device.power_max_w:
        raise ValidationError(
            "power_limit_w",
            f"{watts} W is outside GPU {index}'s range [{device.power_min_w}, {device.power_max_w}] W",
        )
    return device


def _try(nvml: Any, call: Callable[[], Any]) -> Any:
    """``call()``, or None when NVML cannot answer (inventory fields are best effort)."""
    try:
        return call()
    except nvml.NVMLError:
        return None


def _read_inventory(nvml: Any, handles: list[Any]) -> list[GpuDevice]:
    """Read the static facts of every GPU once, at open."""
    groups = parse_topology_groups(len(handles), _read_links(nvml, handles))
    return [_read_device(nvml, index, handle, groups[index]) for index, handle in enumerate(handles)]


def _read_device(nvml: Any, index: int, handle: Any, topology_group: int) -> GpuDevice:
    """One GPU's inventory entry; what NVML cannot tell is left at its default."""

    def ask(function: str) -> Any:
        return _try(nvml, lambda: getattr(nvml, function)(handle))

    mem, pci, mig = ask("nvmlDeviceGetMemoryInfo"), ask("nvmlDeviceGetPciInfo"), ask("nvmlDeviceGetMigMode")
    min_mw, max_mw = ask("nvmlDeviceGetPowerManagementLimitConstraints") or (0, 0)
    return GpuDevice(
        index=index,
        uuid=_text(ask("nvmlDeviceGetUUID")) or f"GPU-unknown-{index}",
        model=_text(ask("nvmlDeviceGetName")) or "unknown",
        mem_total_bytes=int(mem.total) if mem is not None else 0,
        power_limit_w=(ask("nvmlDeviceGetEnforcedPowerLimit") or 0) / 1000.0,
        power_min_w=min_mw / 1000.0,
        power_max_w=max_mw / 1000.0,
        power_default_w=(ask("nvmlDeviceGetPowerManagementDefaultLimit") or 0) / 1000.0,
        pci_bus_id=_text(pci.busId) if pci is not None else "",
        topology_group=topology_group,
        mig_enabled=bool(mig[0]) if mig is not None else False,
    )


def _nvlink_status(nvml: Any, p2p_status: Callable[..., Any], a: Any, b: Any) -> Any:
    return p2p_status(a, b, nvml.NVML_P2P_CAPS_INDEX_NVLINK)


def _read_links(nvml: Any, handles: list[Any]) -> dict[tuple[int, int], bool | None]:
    """For each GPU pair: joined by NVLink or by a PCIe switch (no host bridge between)?"""
    common_ancestor = getattr(nvml, "nvmlDeviceGetTopologyCommonAncestor", None)
    p2p_status = getattr(nvml, "nvmlDeviceGetP2PStatus", None)
    links: dict[tuple[int, int], bool | None] = {}
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            a, b = handles[i], handles[j]
            level = _try(nvml, partial(common_ancestor, a, b)) if common_ancestor else None
            nvlink = _try(nvml, partial(_nvlink_status, nvml, p2p_status, a, b)) if p2p_status else None
            if level is None and nvlink is None:
                links[(i, j)] = None
            else:
                by_switch = level is not None and level <= nvml.NVML_TOPOLOGY_MULTIPLE
                links[(i, j)] = by_switch or nvlink == nvml.NVML_P2P_STATUS_OK
    return links


def read_topology(
    nvml: Any, handles: list[Any], bus_ids: list[str], log: Log, *, sysfs: Path = Path("/sys")
) -> list[GpuTopologyFacts]:
    """Each GPU's NUMA node, CPU affinity and links to the other GPUs.

    A link is NVLink when the two GPUs share active NVLinks (directly, or both reach NVSwitches);
    otherwise the PCIe common ancestor tells the same switch, the same socket or across sockets.
    Queries that fail leave their fact unknown; each GPU with such a failure is logged once
    (``gpu_topology_unknown``), a GPU without NVLink is not a failure.

    :param nvml: the initialised ``pynvml``. :param handles: one per GPU index.
    :param bus_ids: each GPU's PCI bus id (from the inventory).
    :param log: where failures are logged. :param sysfs: the sysfs mount, for NUMA nodes.
    :returns: one entry per GPU, index order.
    """
    count = len(handles)
    failures: list[dict[str, str]] = [{} for _ in handles]
    by_bus = {_bus_key(b): i for i, b in enumerate(bus_ids) if b}
    peers: list[dict[int, int]] = []
    to_switch: list[int] = []
    for i, handle in enumerate(handles):
        direct, switch = _read_nvlinks(nvml, handle, by_bus, i, failures[i])
        peers.append(direct)
        to_switch.append(switch)
    numa = [_read_numa(nvml, h, bus_ids[i], sysfs, failures[i]) for i, h in enumerate(handles)]
    cpus = [_read_cpus(nvml, h, failures[i]) for i, h in enumerate(handles)]
    ancestor = getattr(nvml, "nvmlDeviceGetTopologyCommonAncestor", None)
    links: list[list[tuple[int, int, int]]] = [[] for _ in handles]
    for i in range(count):
        for j in range(i + 1, count):
            nvlinks = peers[i].get(j, 0) or peers[j].get(i, 0) or min(to_switch[i], to_switch[j])
            if nvlinks:
                level = LinkLevel.NVLINK
            else:
                level = _pcie_level(nvml, ancestor, handles[i], handles[j], (failures[i], failures[j]))
            if level != LinkLevel.UNKNOWN:
                links[i].append((j, int(level), nvlinks))
                links[j].append((i, int(level), nvlinks))
    for i, failed in enumerate(failures):
        if failed:
            log.warning("gpu_topology_unknown", gpu_index=i, failed=sorted(failed), reason=next(iter(failed.values())))
    return [
        GpuTopologyFacts(numa_node=numa[i], cpu_affinity=cpus[i], links=tuple(sorted(links[i])))
        for i in range(count)
    ]


def _read_nvlinks(
    nvml: Any, handle: Any, by_bus: dict[str, int], index: int, failures: dict[str, str]
) -> tuple[dict[int, int], int]:
    """Active NVLinks of one GPU: ``({peer index: links}, links to NVSwitches or other devices)``."""
    state = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
    remote = getattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", None)
    peers: dict[int, int] = {}
    switch = 0
    if state is None or remote is None:
        return peers, switch
    not_there = (nvml.NVMLError_NotSupported, getattr(nvml, "NVMLError_InvalidArgument", nvml.NVMLError_NotSupported))
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if state(handle, link) != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                continue
            bus = _bus_key(_text(remote(handle, link).busId))
        except not_there:
            # No NVLink at all (link 0), or past this GPU's last link.
            if link == 0:
                break
            continue
        except nvml.NVMLError as e:
            failures.setdefault("nvlink", str(e))
            break
        peer = by_bus.get(bus)
        if peer is None:
            switch += 1
        elif peer != index:
            peers[peer] = peers.get(peer, 0) + 1
    return peers, switch


def _pcie_level(
    nvml: Any, ancestor: Any, a: Any, b: Any, failures: tuple[dict[str, str], dict[str, str]]
) -> LinkLevel:
    """The PCIe path between two GPUs as a link level; UNKNOWN (noted for both) when NVML cannot tell."""
    if ancestor is None:
        return LinkLevel.UNKNOWN
    try:
        level = ancestor(a, b)
    except nvml.NVMLError as e:
        for failed in failures:
            failed.setdefault("common_ancestor", str(e))
        return LinkLevel.UNKNOWN
    if level <= nvml.NVML_TOPOLOGY_MULTIPLE:
        return LinkLevel.SAME_SWITCH
    if level < nvml.NVML_TOPOLOGY_SYSTEM:
        return LinkLevel.SAME_SOCKET
    return LinkLevel.CROSS_SOCKET


def _cpu_set_words() -> int:
    """64-bit words that hold every CPU id of this host (at most :data:`MAX_CPUS`)."""
    return max(1, min(MAX_CPUS, os.cpu_count() or 1) + 63) // 64


def _bits(words: Any, limit: int) -> tuple[int, ...]:
    """The set bits of an NVML bitmask (array of 64-bit words), below ``limit``."""
    out = []
    for w, word in enumerate(words):
        word = int(word)
        while word:
            low = word & -word
            bit = w * 64 + low.bit_length() - 1
            if bit < limit:
                out.append(bit)
            word ^= low
    return tuple(out)


def _read_cpus(nvml: Any, handle: Any, failures: dict[str, str]) -> tuple[int, ...]:
    """The CPUs close to the GPU; ``()`` unknown."""
    try:
        return _bits(nvml.nvmlDeviceGetCpuAffinity(handle, _cpu_set_words()), MAX_CPUS)
    except nvml.NVMLError as e:
        failures.setdefault("cpu_affinity", str(e))
    except AttributeError:
        pass
    return ()


def _read_numa(nvml: Any, handle: Any, bus_id: str, sysfs: Path, failures: dict[str, str]) -> int:
    """The GPU's NUMA node from NVML's memory affinity, else from sysfs; -1 unknown."""
    affinity = getattr(nvml, "nvmlDeviceGetMemoryAffinity", None)
    if affinity is not None:
        try:
            nodes = _bits(affinity(handle, (MAX_NUMA_NODE + 64) // 64, getattr(nvml, "NVML_AFFINITY_SCOPE_NODE", 0)),
                          MAX_NUMA_NODE + 1)
            if len(nodes) == 1:
                return nodes[0]
        except nvml.NVMLError:
            pass
    if bus_id:
        try:
            node = int((sysfs / "bus" / "pci" / "devices" / _bus_key(bus_id) / "numa_node").read_text().strip())
        except (OSError, ValueError) as e:
            failures.setdefault("numa_node", str(e))
            return -1
        return node if 0 <= node <= MAX_NUMA_NODE else -1
    return -1


def _bus_key(bus_id: str) -> str:
    """A PCI bus id as sysfs names it: NVML's ``00000000:18:00.0`` → ``0000:18:00.0``."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{domain[-4:].rjust(4, '0')}:{rest}" if rest else bus_id.strip().lower()


def _text(value: str | bytes | None) -> str:
    """pynvml returns str for most strings but bytes inside structs (``busId``)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""


def _shutdown_quietly(nvml: Any) -> None:
    """nvmlShutdown on the way out; a failure there changes nothing for the caller."""
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        return
