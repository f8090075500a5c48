"""Telemetry collectors, one per module, all behind :class:`Collector`.

The collectors, listed explicitly (nothing registers itself on import):

- GPU backends, exactly one per agent, chosen at start-up by ``agent.sampler.open_gpu_backend``:
  :mod:`agent.collectors.nvml` (real GPUs) or :mod:`agent.collectors.simulated`; with simulated GPUs
  :mod:`agent.collectors.simulated_host` also reports a simulated host's cores and memory.
- :mod:`agent.collectors.host`: CPU, load, memory, disks, network, per-task CPU and RSS.
- :mod:`agent.collectors.power`: CPU package power from RAPL.
- :mod:`agent.collectors.task_metrics`: inference tasks' own Prometheus metrics (latency p95,
  time to first token, tokens/s, queue depth), scraped off the sampler's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agent.collectors.base import (
    Collector,
    DiskReading,
    GpuBackend,
    GpuDevice,
    GpuProcessReading,
    GpuReading,
    HostReading,
    PowerReading,
    Sample,
    TaskQosReading,
    TaskUsage,
    telemetry_to_proto,
)
from agent.collectors.host import HostCollector, TaskPids
from agent.collectors.nvml import NvmlCollector, open_nvml
from agent.collectors.power import DEFAULT_POWERCAP_ROOT, RaplPowerCollector
from agent.collectors.simulated import SimulatedGpus, parse_simulate_spec
from agent.collectors.simulated_host import HostShape, SimulatedHost, default_host_shape, parse_simulate_host
from agent.collectors.task_metrics import MetricsTarget, TaskMetricsCollector, TaskMetricsTargets

__all__ = [
    "Collector",
    "DiskReading",
    "GpuBackend",
    "GpuDevice",
    "GpuProcessReading",
    "GpuReading",
    "HostCollector",
    "HostReading",
    "HostShape",
    "MetricsTarget",
    "NvmlCollector",
    "PowerReading",
    "RaplPowerCollector",
    "Sample",
    "SimulatedGpus",
    "SimulatedHost",
    "TaskMetricsCollector",
    "TaskMetricsTargets",
    "TaskPids",
    "TaskQosReading",
    "TaskUsage",
    "default_host_shape",
    "host_collectors",
    "open_nvml",
    "parse_simulate_host",
    "parse_simulate_spec",
    "telemetry_to_proto",
]


def host_collectors(
    *,
    data_paths: Sequence[str] = (),
    task_pids: TaskPids | None = None,
    powercap_root: str | Path = DEFAULT_POWERCAP_ROOT,
    host_shape: HostShape | None = None,
    real_cores: int = 1,
) -> list[Collector]:
    """The collectors every agent runs besides its GPU backend, in the order they are read.

    :param data_paths: directories whose disk usage and I/O are reported.
    :param task_pids: returns ``{task_id: [root pids]}``; no per-task usage when None.
    :param powercap_root: where RAPL lives (tests pass a temporary tree).
    :param host_shape: report the host as this simulated shape (see :mod:`agent.collectors.simulated_host`).
    :param real_cores: this machine's logical cores (used with ``host_shape``).
    """
    host: Collector = HostCollector(data_paths, task_pids) if task_pids is not None else HostCollector(data_paths)
    if host_shape is not None:
        host = SimulatedHost(host, host_shape, real_cores)
    return [host, RaplPowerCollector(powercap_root)]
