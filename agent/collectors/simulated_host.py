"""A simulated host beside simulated GPUs: CPU cores and memory of a GPU server, not this machine.

Simulated GPUs on a laptop or CI runner would otherwise sit beside the machine's real two
cores and few GiB of memory, and every task's default one-core demand would make the local
node run one task at a time. With simulated GPUs the agent therefore also reports a
simulated host: by default a DGX-like 14 cores and 256 GiB of memory per GPU (8×H100 →
112 cores, 2 TiB), or what ``--simulate-host CORES:MEM_GIB`` says.

Telemetry stays real where it can: the real host is read every tick and its busy cores and
used memory are reported against the simulated totals::

    cpu_util = min(1, real_cpu_util × real_cores / simulated_cores)
    mem_used_bytes = min(simulated_mem_bytes, real_mem_used_bytes)

Every such reading and the node's inventory say ``simulated`` (``host_simulated`` in the
inventory), as the simulated GPUs do.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from agent.collectors.base import Collector, HostReading, Sample

__all__ = [
    "CORES_PER_GPU",
    "MEM_GIB_PER_GPU",
    "REAL_HOST",
    "HostShape",
    "SimulatedHost",
    "check_simulate_host",
    "default_host_shape",
    "parse_simulate_host",
    "scale_host_reading",
]

GIB = 1 << 30
CORES_PER_GPU = 14
"""A DGX H100 has 112 cores for 8 GPUs."""
MEM_GIB_PER_GPU = 256
"""A DGX H100 has 2 TiB of memory for 8 GPUs."""
REAL_HOST = "real"
"""``--simulate-host real``: report this machine's cores and memory even with simulated GPUs."""
_MAX_CORES = 1 << 16
_MAX_MEM_GIB = 1 << 20  # 1 PiB
_SPEC = re.compile(r"^(\d+):(\d+(?:\.\d+)?)$")


@dataclass(frozen=True, slots=True)
class HostShape:
    """The CPU cores and memory a simulated host reports."""

    cores: int
    mem_bytes: int


def parse_simulate_host(spec: str) -> HostShape:
    """Parse ``CORES:MEM_GIB`` (``112:2048``).

    :raises ValueError: naming the value and the expected form.
    """
    match = _SPEC.match(spec.strip())
    if match is None:
        raise ValueError(f"{spec!r} is not CORES:MEM_GIB (e.g. 112:2048), nor {REAL_HOST!r}")
    cores, mem_gib = int(match[1]), float(match[2])
    if not 1 <= cores <= _MAX_CORES:
        raise ValueError(f"{spec!r}: cores must be 1..{_MAX_CORES}, got {cores}")
    if not 0 < mem_gib <= _MAX_MEM_GIB:
        raise ValueError(f"{spec!r}: memory must be above 0 and at most {_MAX_MEM_GIB} GiB, got {mem_gib:g}")
    return HostShape(cores, round(mem_gib * GIB))


def check_simulate_host(spec: str) -> str | None:
    """Config check: empty (the default), ``real`` or a valid ``CORES:MEM_GIB``."""
    if spec in ("", REAL_HOST):
        return None
    try:
        parse_simulate_host(spec)
    except ValueError as e:
        return str(e)
    return None


def default_host_shape(gpu_count: int) -> HostShape:
    """The DGX-like host for ``gpu_count`` simulated GPUs (at least one GPU's worth)."""
    n = max(1, gpu_count)
    return HostShape(CORES_PER_GPU * n, MEM_GIB_PER_GPU * n * GIB)


class SimulatedHost:
    """Reads the real host through ``inner`` and reports it against a simulated shape.

    Example::

        host = SimulatedHost(HostCollector(["/"]), HostShape(112, 2048 << 30), real_cores=2)
        [reading] = host.collect()   # reading.mem_total_bytes == 2 TiB, reading.simulated

    :param inner: the real host collector (disks, network, load and per-task usage pass through).
    :param shape: the simulated cores and memory.
    :param real_cores: this machine's logical cores, to turn its utilization into busy cores.
    """

    def __init__(self, inner: Collector, shape: HostShape, real_cores: int) -> None:
        self.name = inner.name
        self.shape = shape
        self._inner = inner
        self._real_cores = max(1, real_cores)

    def collect(self) -> list[Sample]:
        """The real reading, rescaled to the simulated cores and memory and marked simulated."""
        out: list[Sample] = []
        for reading in self._inner.collect():
            if isinstance(reading, HostReading):
                reading = scale_host_reading(reading, self.shape, self._real_cores)
            out.append(reading)
        return out


def scale_host_reading(reading: HostReading, shape: HostShape, real_cores: int) -> HostReading:
    """``reading`` (of a machine with ``real_cores``) as seen against ``shape``; see the module docstring."""
    busy_cores = reading.cpu_util * max(1, real_cores)
    return dataclasses.replace(
        reading,
        cpu_util=min(1.0, busy_cores / shape.cores),
        mem_used_bytes=min(shape.mem_bytes, reading.mem_used_bytes),
        mem_total_bytes=shape.mem_bytes,
        simulated=True,
    )
