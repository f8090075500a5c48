"""The collector interface and the plain readings collectors return.

Collectors never touch protobuf: they return the frozen dataclasses below, and the
sampler turns one tick's readings into a ``types_pb2.TelemetrySample`` with the
``to_proto()`` helpers here, at the edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agent.health.readings import GpuHealthReading, GpuSignals
from common.pb.gptrm.v1 import types_pb2
from common.pbenum import pb_enum

__all__ = [
    "Collector",
    "DiskReading",
    "GpuBackend",
    "GpuDevice",
    "GpuHealthReading",
    "GpuProcessReading",
    "GpuReading",
    "GpuSignals",
    "HostReading",
    "PowerReading",
    "Sample",
    "TaskQosReading",
    "TaskUsage",
    "telemetry_to_proto",
]


@dataclass(frozen=True, slots=True)
class GpuProcessReading:
    """One compute process on a GPU; ``used_mem_bytes`` is None where the driver hides it."""

    pid: int
    used_mem_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one instant; a field is None when the GPU does not support it."""

    index: int
    uuid: str
    util_gpu: float | None = None
    """0..1 of the time a kernel ran."""
    util_mem: float | None = None
    """0..1 of the time the memory controller was busy."""
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None
    """Energy since the driver loaded."""
    temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    ecc_corrected_total: int | None = None
    ecc_uncorrected_total: int | None = None
    mig_enabled: bool | None = None
    processes: tuple[GpuProcessReading, ...] = ()
    healthy: bool = True
    health_reason: str = ""
    simulated: bool = False
    xid_last: int | None = None
    """The last XID the GPU raised since the agent started, of any kind."""
    signals: GpuSignals | None = None
    """The health signals read this tick (not on the wire; the agent's ``/metrics`` shows them)."""
    health: GpuHealthReading | None = None

    def to_proto(self) -> types_pb2.GpuSample:
        """This reading as a ``GpuSample``; None fields stay absent (proto3 ``optional``)."""
        msg = types_pb2.GpuSample(
            index=self.index,
            uuid=self.uuid,
            healthy=self.healthy,
            health_reason=self.health_reason,
            simulated=self.simulated,
        )
        for name in _OPTIONAL_GPU_FIELDS:
            value = getattr(self, name)
            if value is not None:
                setattr(msg, name, value)
        for proc in self.processes:
            msg.processes.add(pid=proc.pid, used_mem_bytes=proc.used_mem_bytes or 0)
        if self.health is not None:
            msg.health.CopyFrom(self.health.to_proto())
        return msg


_OPTIONAL_GPU_FIELDS = (
    "util_gpu",
    "util_mem",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "power_limit_w",
    "energy_j",
    "temperature_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "ecc_corrected_total",
    "ecc_uncorrected_total",
    "mig_enabled",
    "xid_last",
)


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU of the node's inventory, read once when the backend opens."""

    index: int
    uuid: str
    model: str
    mem_total_bytes: int
    power_limit_w: float = 0.0
    """The enforced limit now."""
    power_min_w: float = 0.0
    power_max_w: float = 0.0
    power_default_w: float = 0.0
    pci_bus_id: str = ""
    topology_group: int = -1
    """GPUs sharing an NVLink domain or a PCIe switch have the same group; -1 unknown."""
    mig_enabled: bool = False
    simulated: bool = False
    """Not on the wire per GPU: ``NodeInventory.simulated`` carries it for the node."""
    numa_node: int = -1
    """The NUMA node (socket) the GPU hangs off; -1 unknown."""
    cpu_affinity: tuple[int, ...] = ()
    """The CPUs close to the GPU; ``()`` unknown."""
    links: tuple[tuple[int, int, int], ...] = ()
    """``(peer index, LinkLevel, active NVLinks)`` per other GPU whose link is known."""

    def to_proto(self) -> types_pb2.GpuInfo:
        """This device as a ``GpuInfo``."""
        return types_pb2.GpuInfo(
            index=self.index,
            uuid=self.uuid,
            model=self.model,
            mem_total_bytes=self.mem_total_bytes,
            power_limit_w=self.power_limit_w,
            power_min_w=self.power_min_w,
            power_max_w=self.power_max_w,
            power_default_w=self.power_default_w,
            pci_bus_id=self.pci_bus_id,
            topology_group=self.topology_group,
            mig_enabled=self.mig_enabled,
            numa_node_plus_one=self.numa_node + 1 if self.numa_node >= 0 else 0,
            cpu_affinity=self.cpu_affinity,
            links=[types_pb2.GpuLink(peer_index=p, level=pb_enum(types_pb2.GpuLinkLevel, level), nvlinks=n)
                   for p, level, n in self.links],
        )


@dataclass(frozen=True, slots=True)
class DiskReading:
    """Usage and I/O counters of one configured data path."""

    path: str
    total_bytes: int
    used_bytes: int
    read_bytes_total: int
    write_bytes_total: int

    def to_proto(self) -> types_pb2.DiskSample:
        """This reading as a ``DiskSample``."""
        return types_pb2.DiskSample(
            path=self.path,
            total_bytes=self.total_bytes,
            used_bytes=self.used_bytes,
            read_bytes_total=self.read_bytes_total,
            write_bytes_total=self.write_bytes_total,
        )


@dataclass(frozen=True, slots=True)
class TaskUsage:
    """What one task's processes (children included) use right now."""

    task_id: str
    cpu_util: float
    """Cores in use (1.0 = one core busy)."""
    rss_bytes: int
    pids: tuple[int, ...] = ()
    """Every pid counted, children included; not on the wire."""
    gpu_mem_bytes: int = 0
    gpu_util_share: float = 0.0
    """0..n GPUs worth of compute."""
    power_share_w: float = 0.0
    energy_share_j: float = 0.0

    def to_proto(self) -> types_pb2.TaskUsage:
        """This usage as a ``TaskUsage`` message."""
        return types_pb2.TaskUsage(
            task_id=self.task_id,
            cpu_util=self.cpu_util,
            rss_bytes=self.rss_bytes,
            gpu_mem_bytes=self.gpu_mem_bytes,
            gpu_util_share=self.gpu_util_share,
            power_share_w=self.power_share_w,
            energy_share_j=self.energy_share_j,
        )


@dataclass(frozen=True, slots=True)
class HostReading:
    """The host's CPU, memory, disks, network and per-task usage at one instant."""

    cpu_util: float
    """0..1 over all cores."""
    load1: float
    load5: float
    load15: float
    mem_used_bytes: int
    mem_total_bytes: int
    disks: tuple[DiskReading, ...] = ()
    net_rx_bytes_total: int = 0
    net_tx_bytes_total: int = 0
    tasks: tuple[TaskUsage, ...] = ()
    simulated: bool = False
    """CPU and memory are relative to a simulated host (``--simulate-host``), not this machine."""

    def to_proto(self, cpu_power_w: float | None = None) -> types_pb2.HostSample:
        """This reading as a ``HostSample``; ``cpu_power_w`` comes from the power collector."""
        msg = types_pb2.HostSample(
            cpu_util=self.cpu_util,
            load1=self.load1,
            load5=self.load5,
            load15=self.load15,
            mem_used_bytes=self.mem_used_bytes,
            mem_total_bytes=self.mem_total_bytes,
            disks=[d.to_proto() for d in self.disks],
            net_rx_bytes_total=self.net_rx_bytes_total,
            net_tx_bytes_total=self.net_tx_bytes_total,
            tasks=[t.to_proto() for t in self.tasks],
            simulated=self.simulated,
        )
        if cpu_power_w is not None:
            msg.cpu_power_w = cpu_power_w
        return msg


@dataclass(frozen=True, slots=True)
class PowerReading:
    """CPU package power summed over all sockets (RAPL)."""

    cpu_power_w: float


@dataclass(frozen=True, slots=True)
class TaskQosReading:
    """What one task's own metrics endpoint says, derived over a sliding window.

    A value is None when it could not be derived (no request finished in the window, the
    server does not publish that metric, or the endpoint could not be read).
    """

    task_id: str
    latency_p95_s: float | None = None
    """End-to-end request latency, 95th percentile over the window."""
    ttft_p95_s: float | None = None
    """Time to first token, 95th percentile over the window."""
    tokens_per_s: float | None = None
    """Generated tokens per second over the window."""
    requests_running: float | None = None
    requests_waiting: float | None = None
    window_s: float = 0.0
    """Time the percentiles and the rate cover; 0 after a single scrape."""
    metrics_unavailable: str = ""
    """Why the endpoint could not be read this time; "" when it was."""
    scraped_unix_s: float = 0.0

    def to_proto(self) -> types_pb2.TaskQos:
        """This reading as a ``TaskQos`` message; None values stay absent."""
        msg = types_pb2.TaskQos(task_id=self.task_id, window_s=self.window_s,
                                metrics_unavailable=self.metrics_unavailable, scraped_unix_s=self.scraped_unix_s)
        for name in ("latency_p95_s", "ttft_p95_s", "tokens_per_s", "requests_running", "requests_waiting"):
            value = getattr(self, name)
            if value is not None:
                setattr(msg, name, value)
        return msg


Sample = GpuReading | HostReading | PowerReading | TaskQosReading
"""Anything a collector returns; the sampler files each kind into its place in the tick."""


@runtime_checkable
class Collector(Protocol):
    """One source of telemetry, read once per tick by the sampler.

    ``collect()`` raises :class:`~common.errors.NoData` when it has nothing this round and
    :class:`~common.errors.CollectorError` when it failed.
    """

    name: str

    def collect(self) -> Sequence[Sample]:
        """Read the source now and return its readings."""


@runtime_checkable
class GpuBackend(Collector, Protocol):
    """The node's GPUs: NVML or simulated, chosen once at start-up."""

    backend: str
    """``nvml`` or ``simulated``; goes to ``NodeInventory.gpu_backend``."""
    simulated: bool

    def devices(self) -> list[GpuDevice]:
        """The GPU inventory, in index order."""

    def set_power_limit(self, index: int, watts: float) -> None:
        """Cap GPU ``index`` at ``watts``; ValueError when outside its allowed range."""

    def close(self) -> None:
        """Release the backend (``nvmlShutdown``)."""


def telemetry_to_proto(
    time_unix_s: float,
    gpus: Sequence[GpuReading],
    host: HostReading | None,
    cpu_power_w: float | None,
    *,
    simulated: bool,
    task_qos: Sequence[TaskQosReading] = (),
) -> types_pb2.TelemetrySample:
    """One tick's readings as a ``TelemetrySample``.

    :param time_unix_s: wall-clock time of the tick.
    :param gpus: GPU readings in index order.
    :param host: the host reading, or None when the host collector failed this round.
    :param cpu_power_w: RAPL package power, None when unknown.
    :param simulated: True when the GPUs are simulated.
    :param task_qos: readings of the tasks that declared a metrics endpoint.
    :returns: the message, ready for a ``TelemetryBatch``.
    """
    msg = types_pb2.TelemetrySample(
        time_unix_s=time_unix_s,
        gpus=[g.to_proto() for g in gpus],
        simulated=simulated,
        task_qos=[q.to_proto() for q in task_qos],
    )
    if host is not None:
        msg.host.CopyFrom(host.to_proto(cpu_power_w))
    elif cpu_power_w is not None:
        msg.host.cpu_power_w = cpu_power_w
    return msg
