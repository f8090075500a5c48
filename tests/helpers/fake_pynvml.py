"""A stand-in for the ``pynvml`` module (nvidia-ml-py) with configurable GPUs.

It has the functions the agent calls, the constants it passes, and the same exception
scheme as the real module: ``NVMLError(value)`` builds the subclass for that code, and
``NVMLError_NotSupported``, ``NVMLError_GpuIsLost``, ``NVMLError_LibraryNotFound`` ... carry
the real codes. Use it in place of the module::

    nvml = FakeNvml([FakeGpu(index=0), FakeGpu(index=1, lost=True)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)   # or open_nvml(log, nvml)

Topology: ``FakeGpu.switch`` (PCIe switch), ``numa_node`` (socket), ``cpus`` (CPU affinity),
``nvlink_peers`` (NVLink bridges: peer index → links) and ``nvswitch_links`` (links to NVSwitches)
answer ``nvmlDeviceGetTopologyCommonAncestor``, ``nvmlDeviceGetNvLinkState`` /
``nvmlDeviceGetNvLinkRemotePciInfo``, ``nvmlDeviceGetCpuAffinity`` and
``nvmlDeviceGetMemoryAffinity`` the way the real functions do (bitmasks of 64-bit words,
NotSupported on a GPU without NVLink, InvalidArgument past the last link).

``FakeGpu.unsupported`` names NVML functions that raise NotSupported on that GPU,
``FakeGpu.errors`` maps others to the error code they raise, ``FakeGpu.lost`` makes every
call raise GpuIsLost, and ``FakeNvml.calls`` counts calls per (function, GPU index).

Health signals: ``FakeNvml.raise_xid`` (and ``raise_event``) queue an event that
``nvmlEventSetWait_v2`` returns to an event set the GPU registered on (it blocks up to its timeout, then
raises NVMLError_Timeout, like the real one); ``FakeGpu.event_types`` is what
``nvmlDeviceGetSupportedEventTypes`` offers. ``remapped_rows`` (correctable, uncorrectable, pending,
failure), ``retired_pages_pending`` / ``retired_pages_dbe``, ``clocks_reasons`` (the bitmask),
``pcie_gen``/``pcie_width`` and their maxima, and ``nvlink_down`` (links forced down) answer the
functions of the same names. ``FakeNvml.module_errors`` makes a module-level function (``nvmlEventSetCreate``)
raise the given code.
"""

# The function names must be pynvml's own (camelCase), so pep8-naming's N802 does not apply here.

from __future__ import annotations

import queue
import string
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

# Same codes as pynvml.NVML_ERROR_*.
NVML_ERROR_CODES = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5,
    "NOT_FOUND": 6,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "UNKNOWN": 999,
}
_MESSAGES = {3: "Not Supported", 12: "NVML Shared Library Not Found", 15: "GPU is lost", 4: "Insufficient Permissions"}


class NVMLError(Exception):
    """Like ``pynvml.NVMLError``: ``NVMLError(code)`` is an instance of the code's subclass."""

    _value_class: dict[int, type[NVMLError]] = {}  # noqa: RUF012 - mirrors pynvml's class-level map
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._value_class.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


def _make_error_classes() -> dict[str, type[NVMLError]]:
    """``NVMLError_<CamelName>`` per code, named the way pynvml names them."""
    classes = {}
    for name, value in NVML_ERROR_CODES.items():
        class_name = "NVMLError_" + string.capwords(name, "_").replace("_", "")

        def new(cls: type[NVMLError], *args: Any, _value: int = value) -> NVMLError:
            return NVMLError.__new__(cls, _value)

        def init(self: NVMLError, *args: Any) -> None:
            Exception.__init__(self, self.value)

        cls = type(class_name, (NVMLError,), {"__new__": new, "__init__": init})
        NVMLError._value_class[value] = cls
        classes[class_name] = cls
    return classes


_ERRORS = _make_error_classes()
NVMLError_NotSupported = _ERRORS["NVMLError_NotSupported"]
NVMLError_GpuIsLost = _ERRORS["NVMLError_GpuIsLost"]
NVMLError_LibraryNotFound = _ERRORS["NVMLError_LibraryNotFound"]
NVMLError_FunctionNotFound = _ERRORS["NVMLError_FunctionNotFound"]
NVMLError_NoPermission = _ERRORS["NVMLError_NoPermission"]
NVMLError_ResetRequired = _ERRORS["NVMLError_ResetRequired"]
NVMLError_Unknown = _ERRORS["NVMLError_Unknown"]
NVMLError_InvalidArgument = _ERRORS["NVMLError_InvalidArgument"]
NVMLError_Timeout = _ERRORS["NVMLError_Timeout"]
NVMLError_Uninitialized = _ERRORS["NVMLError_Uninitialized"]

# Same values as pynvml's nvmlEventType* and nvmlClocksEventReason*.
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8
CLOCKS_SW_POWER_CAP = 0x4
CLOCKS_HW_SLOWDOWN = 0x8
CLOCKS_SW_THERMAL = 0x20
CLOCKS_HW_THERMAL = 0x40
CLOCKS_HW_POWER_BRAKE = 0x80


@dataclass
class FakeGpu:
    """One fake GPU; raw NVML units (percent, mW, mJ, bytes)."""

    index: int
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    mem_total: int = 80 * (1 << 30)
    mem_used: int = 0
    util_gpu: int = 0
    util_mem: int = 0
    power_mw: int = 70_000
    limit_mw: int = 700_000
    min_limit_mw: int = 200_000
    max_limit_mw: int = 700_000
    default_limit_mw: int = 700_000
    energy_mj: int = 0
    temperature: int = 35
    sm_clock: int = 345
    mem_clock: int = 2619
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    mig_mode: int = 0
    switch: int = 0
    """GPUs with the same switch share a PCIe switch (NVML_TOPOLOGY_SINGLE)."""
    nvlink: bool = False
    """GPUs that both have nvlink=True are NVLink peers (P2P status only)."""
    numa_node: int = 0
    """The NUMA node the GPU hangs off (memory affinity); GPUs on other nodes are across sockets."""
    cpus: tuple[int, ...] = (0,)
    """Its CPU affinity."""
    nvlink_peers: dict[int, int] = field(default_factory=dict)
    """NVLink bridges: peer GPU index → active links to it."""
    nvswitch_links: int = 0
    """Active links to NVSwitches (after the bridge links)."""
    unsupported: set[str] = field(default_factory=set)
    """NVML function names that raise NotSupported on this GPU."""
    errors: dict[str, int] = field(default_factory=dict)
    """NVML function name → the NVML error code it raises on this GPU."""
    lost: bool = False
    """Every call on this GPU raises GpuIsLost."""
    event_types: int = EVENT_XID | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC
    """Event types the GPU offers (``nvmlDeviceGetSupportedEventTypes``)."""
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    """(correctable, uncorrectable, pending, failure), as ``nvmlDeviceGetRemappedRows`` returns them."""
    retired_pages_pending: int = 0
    retired_pages_dbe: list[int] = field(default_factory=list)
    """Addresses of the pages retired for double-bit ECC errors."""
    clocks_reasons: int = 0
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    nvlink_down: set[int] = field(default_factory=set)
    """NVLinks (by link number) that read disabled."""

    def __post_init__(self) -> None:
        self.uuid = self.uuid or f"GPU-fake-{self.index:04d}"


@dataclass
class _Handle:
    index: int


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)   # GPU index → event types
    freed: bool = False


class FakeNvml:
    """The module: constants, error classes and ``nvml*`` functions over ``gpus``.

    :param gpus: the GPUs, index order. :param init_error: NVML code that nvmlInit raises.
    """

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_ResetRequired = NVMLError_ResetRequired
    NVMLError_Unknown = NVMLError_Unknown
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_Uninitialized = NVMLError_Uninitialized

    nvmlEventTypeSingleBitEccError = EVENT_SINGLE_BIT_ECC  # noqa: N815 - pynvml's own name
    nvmlEventTypeDoubleBitEccError = EVENT_DOUBLE_BIT_ECC  # noqa: N815 - pynvml's own name
    nvmlEventTypeXidCriticalError = EVENT_XID  # noqa: N815 - pynvml's own name
    nvmlEventTypeNone = 0  # noqa: N815 - pynvml's own name
    nvmlClocksEventReasonGpuIdle = 0x1  # noqa: N815 - pynvml's own name
    nvmlClocksEventReasonSwPowerCap = CLOCKS_SW_POWER_CAP  # noqa: N815 - pynvml's own name
    nvmlClocksEventReasonHwSlowdown = CLOCKS_HW_SLOWDOWN  # noqa: N815 - pynvml's own name
    nvmlClocksEventReasonSwThermalSlowdown = CLOCKS_SW_THERMAL  # noqa: N815 - pynvml's own name
    nvmlClocksEventReasonHwThermalSlowdown = CLOCKS_HW_THERMAL  # noqa: N815 - pynvml's own name
    nvmlClocksEventReasonHwPowerBrakeSlowdown = CLOCKS_HW_POWER_BRAKE  # noqa: N815 - pynvml's own name
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_TOPOLOGY_INTERNAL = 0
    NVML_TOPOLOGY_SINGLE = 10
    NVML_TOPOLOGY_MULTIPLE = 20
    NVML_TOPOLOGY_HOSTBRIDGE = 30
    NVML_TOPOLOGY_NODE = 40
    NVML_TOPOLOGY_SYSTEM = 50
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_NOT_SUPPORTED = 5
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    NVML_AFFINITY_SCOPE_NODE = 0
    NVML_AFFINITY_SCOPE_SOCKET = 1
    NVSWITCH_BUS_ID = b"00000000:C5:00.0"

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = False
        self.shutdowns = 0
        self.calls: Counter[tuple[str, int]] = Counter()
        self.module_errors: dict[str, int] = {}
        self.event_sets: list[_EventSet] = []
        self.waits = 0
        self._events: queue.Queue[tuple[int | None, int, int]] = queue.Queue()

    # -- library ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_CODES["INVALID_ARGUMENT"])
        return _Handle(index)

    def _module(self, function: str) -> None:
        if not self.initialised:
            raise NVMLError(NVML_ERROR_CODES["UNINITIALIZED"])
        if function in self.module_errors:
            raise NVMLError(self.module_errors[function])

    # -- events ----------------------------------------------------------------------------

    def raise_xid(self, index: int | None, xid: int) -> None:
        """GPU ``index`` raises XID ``xid`` (None: an event NVML ties to no one GPU)."""
        self.raise_event(index, EVENT_XID, xid)

    def raise_event(self, index: int | None, event_type: int, data: int = 0) -> None:
        """An event of ``event_type`` with ``data`` on GPU ``index`` (None: no one GPU)."""
        self._events.put((index, event_type, data))

    def nvmlEventSetCreate(self) -> _EventSet:
        self._module("nvmlEventSetCreate")
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._module("nvmlEventSetFree")
        event_set.freed = True

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetSupportedEventTypes", handle).event_types

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: _EventSet) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if event_types & ~gpu.event_types:
            raise NVMLError_NotSupported()
        event_set.registered[handle.index] = event_set.registered.get(handle.index, 0) | event_types

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        """The next event a GPU of the set registered for, waiting up to ``timeout_ms``; Timeout after."""
        self._module("nvmlEventSetWait_v2")
        self.waits += 1
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            left = deadline - time.monotonic()
            try:
                index, event_type, data = self._events.get(timeout=max(0.0, left))
            except queue.Empty:
                raise NVMLError_Timeout() from None
            if index is None or event_set.registered.get(index, 0) & event_type:
                device = _Handle(index) if index is not None else None
                return SimpleNamespace(device=device, eventType=event_type, eventData=data, gpuInstanceId=0xFFFFFFFF,
                                       computeInstanceId=0xFFFFFFFF)

    def nvmlDeviceGetIndex(self, handle: _Handle | None) -> int:
        if handle is None:
            raise NVMLError_InvalidArgument()
        self._gpu("nvmlDeviceGetIndex", handle)
        return handle.index

    def _gpu(self, function: str, handle: _Handle) -> FakeGpu:
        """Count the call and raise what the GPU is configured to raise."""
        if not self.initialised:
            raise NVMLError(NVML_ERROR_CODES["UNINITIALIZED"])
        self.calls[(function, handle.index)] += 1
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        if function in gpu.unsupported:
            raise NVMLError_NotSupported()
        if function in gpu.errors:
            raise NVMLError(gpu.errors[function])
        return gpu

    # -- per device ------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=self._bus_id(gpu.index), bus=0x18 + gpu.index)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(total=gpu.mem_total, used=gpu.mem_used, free=gpu.mem_total - gpu.mem_used)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=gpu.util_gpu, memory=gpu.util_mem)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: _Handle) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return [gpu.min_limit_mw, gpu.max_limit_mw]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementDefaultLimit", handle).default_limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, handle: _Handle, limit: int) -> None:
        gpu = self._gpu("nvmlDeviceSetPowerManagementLimit", handle)
        if not gpu.min_limit_mw <= limit <= gpu.max_limit_mw:
            raise NVMLError(NVML_ERROR_CODES["INVALID_ARGUMENT"])
        gpu.limit_mw = limit

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_CODES["INVALID_ARGUMENT"])
        return gpu.temperature

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock_type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        clocks = {self.NVML_CLOCK_SM: gpu.sm_clock, self.NVML_CLOCK_MEM: gpu.mem_clock}
        if clock_type not in clocks:
            raise NVMLError(NVML_ERROR_CODES["INVALID_ARGUMENT"])
        return clocks[clock_type]

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        if counter_type != self.NVML_VOLATILE_ECC:
            return 0
        return gpu.ecc_uncorrected if error_type == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else gpu.ecc_corrected

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[SimpleNamespace]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in gpu.processes]

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        return [gpu.mig_mode, gpu.mig_mode]

    def nvmlDeviceGetTopologyCommonAncestor(self, first: _Handle, second: _Handle) -> int:
        a = self._gpu("nvmlDeviceGetTopologyCommonAncestor", first)
        b = self._gpu("nvmlDeviceGetTopologyCommonAncestor", second)
        if a.switch == b.switch:
            return self.NVML_TOPOLOGY_SINGLE
        return self.NVML_TOPOLOGY_NODE if a.numa_node == b.numa_node else self.NVML_TOPOLOGY_SYSTEM

    def _remotes(self, gpu: FakeGpu) -> list[bytes]:
        """The remote end of each active NVLink of ``gpu``: a peer GPU's bus id or an NVSwitch."""
        remotes = [self._bus_id(peer) for peer, n in sorted(gpu.nvlink_peers.items()) for _ in range(n)]
        return remotes + [self.NVSWITCH_BUS_ID] * gpu.nvswitch_links

    @staticmethod
    def _bus_id(index: int) -> bytes:
        return f"00000000:{0x18 + index:02X}:00.0".encode()

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkState", handle)
        if not 0 <= link < self.NVML_NVLINK_MAX_LINKS:
            raise NVMLError_InvalidArgument()
        remotes = self._remotes(gpu)
        if not remotes:
            raise NVMLError_NotSupported()
        up = link < len(remotes) and link not in gpu.nvlink_down
        return self.NVML_FEATURE_ENABLED if up else self.NVML_FEATURE_DISABLED

    # -- health signals --------------------------------------------------------------------

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        return self._gpu("nvmlDeviceGetRemappedRows", handle).remapped_rows

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", handle).retired_pages_pending

    def nvmlDeviceGetRetiredPages(self, handle: _Handle, source: int) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetRetiredPages", handle)
        return list(gpu.retired_pages_dbe) if source == self.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR else []

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clocks_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clocks_reasons

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", handle).pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", handle).pcie_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkWidth", handle).pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkWidth", handle).pcie_width_max

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetNvLinkRemotePciInfo", handle)
        remotes = self._remotes(gpu)
        if not 0 <= link < len(remotes):
            raise NVMLError_InvalidArgument()
        return SimpleNamespace(busId=remotes[link])

    @staticmethod
    def _mask(bits: tuple[int, ...], words: int) -> list[int]:
        """A bitmask as NVML returns it: ``words`` 64-bit words, bits past them dropped."""
        out = [0] * words
        for b in bits:
            if 0 <= b < 64 * words:
                out[b // 64] |= 1 << (b % 64)
        return out

    def nvmlDeviceGetCpuAffinity(self, handle: _Handle, cpu_set_size: int) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetCpuAffinity", handle)
        return self._mask(gpu.cpus, cpu_set_size)

    def nvmlDeviceGetMemoryAffinity(self, handle: _Handle, node_set_size: int, scope: int) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMemoryAffinity", handle)
        if scope != self.NVML_AFFINITY_SCOPE_NODE:
            raise NVMLError_InvalidArgument()
        return self._mask((gpu.numa_node,), node_set_size)

    def nvmlDeviceGetP2PStatus(self, first: _Handle, second: _Handle, caps_index: int) -> int:
        a = self._gpu("nvmlDeviceGetP2PStatus", first)
        b = self._gpu("nvmlDeviceGetP2PStatus", second)
        linked = caps_index == self.NVML_P2P_CAPS_INDEX_NVLINK and a.nvlink and b.nvlink
        return self.NVML_P2P_STATUS_OK if linked else self.NVML_P2P_STATUS_NOT_SUPPORTED


def make_gpus(count: int, **values: Any) -> list[FakeGpu]:
    """``count`` identical GPUs with ``values`` overriding the defaults."""
    return [FakeGpu(index=i, **values) for i in range(count)]
