"""The agent's sampling loop: every ``interval_s`` read all collectors into one TelemetrySample.

The GPU backend (NVML or simulated) is chosen once, at start-up, by
:func:`open_gpu_backend`; its handles stay open for the life of the process. Each tick
the sampler times every collector, logs ``collector``/``duration_s``/``ok``, keeps going
when one fails, attributes GPU usage to tasks and hands one ``types_pb2.TelemetrySample``
to a callback. The latest tick (its sample and how each collector did) stays readable from
other threads through :attr:`Sampler.latest`, for the agent's ``/metrics``.

Example::

    sampler = build_sampler(node_id="n1", gpu_backend="auto", simulate_spec="8xH100-80GB",
                            interval_s=1.0, data_paths=["/var/lib/gptrm"],
                            task_pids=runtime.task_pids, log=log)
    register(sampler.inventory(), sampler.backend, sampler.simulated)
    sampler.run(emit=outbox.append, stop=stop_event)   # returns once stop_event is set
    sampler.close()
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import structlog

from agent.collectors import (
    Collector,
    GpuBackend,
    GpuReading,
    HostReading,
    HostShape,
    PowerReading,
    Sample,
    TaskPids,
    TaskQosReading,
    TaskUsage,
    host_collectors,
    telemetry_to_proto,
)
from agent.collectors.nvml import open_nvml
from agent.collectors.power import DEFAULT_POWERCAP_ROOT
from agent.collectors.simulated import DEFAULT_SIMULATE_SPEC, SimulatedGpus
from agent.collectors.simulated_host import REAL_HOST, default_host_shape, parse_simulate_host
from agent.collectors.task_metrics import TaskMetricsCollector, TaskMetricsTargets
from agent.health import HealthOptions
from common.errors import CollectorError, ConfigError, NoData
from common.pb.gptrm.v1 import types_pb2
from common.topology import SIMULATED_TOPOLOGIES

__all__ = [
    "BACKENDS",
    "CollectorRun",
    "Sampler",
    "SamplerState",
    "attribute_gpu_usage",
    "build_sampler",
    "choose_host_shape",
    "open_gpu_backend",
    "sampler_for",
]

Log = structlog.typing.FilteringBoundLogger
Emit = Callable[[types_pb2.TelemetrySample], object]
"""Receives each tick's sample; must not block (append to a bounded queue)."""

BACKENDS = ("auto", "nvml", "simulated")


def open_gpu_backend(
    backend: str,
    simulate_spec: str,
    log: Log,
    *,
    node_id: str = "local",
    nvml_module: ModuleType | None = None,
    clock: Callable[[], float] = time.monotonic,
    simulate_topology: str = "auto",
    health: HealthOptions | None = None,
) -> GpuBackend:
    """Choose and open the GPU backend, once, as ``--gpu-backend`` says.

    ``auto`` uses NVML when ``nvmlInit`` works and otherwise simulated GPUs, with a warning;
    ``nvml`` fails fast; ``simulated`` never touches NVML.

    :param backend: ``auto``, ``nvml`` or ``simulated``.
    :param simulate_spec: GPUs to simulate (``8xH100-80GB``); empty means the default.
    :param node_id: goes into simulated GPU UUIDs.
    :param nvml_module: a ``pynvml`` replacement (tests); the real one when None.
    :param simulate_topology: how simulated GPUs are linked (``--simulate-topology``).
    :param health: GPU health watching (XID lists, slow-signal interval, ``--simulate-faults``); defaults when None.
    :raises ConfigError: unknown backend, ``nvml`` without NVML, a malformed spec, or faults to simulate on
        real GPUs, in one line.
    """
    health = health or HealthOptions()
    if backend not in BACKENDS:
        raise ConfigError(f"--gpu-backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if simulate_topology not in SIMULATED_TOPOLOGIES:
        choices = ", ".join(SIMULATED_TOPOLOGIES)
        raise ConfigError(f"--simulate-topology {simulate_topology!r}: expected one of {choices}")
    if backend != "simulated":
        try:
            gpus = open_nvml(log, nvml_module, health=health)
        except CollectorError as e:
            if backend == "nvml":
                raise ConfigError(f"--gpu-backend nvml: {e}") from e
            log.warning(
                "gpu_backend_fell_back",
                backend="simulated",
                reason=f"{e}; GPUs are SIMULATED ({simulate_spec or DEFAULT_SIMULATE_SPEC}), not real hardware",
            )
        else:
            if health.simulate_faults:
                gpus.close()
                raise ConfigError(f"--simulate-faults {health.simulate_faults}: faults are simulated on simulated "
                                  "GPUs only, and this node's GPUs are real (--gpu-backend simulated)")
            log.info("gpu_backend_chosen", backend=gpus.backend, gpu_count=len(gpus.devices()))
            return gpus
    spec = simulate_spec or DEFAULT_SIMULATE_SPEC
    try:
        sim = SimulatedGpus(spec, node_id, clock=clock, topology=simulate_topology, health=health, log=log)
    except ValueError as e:
        raise ConfigError(f"--simulate-gpus {spec!r}: {e}") from e
    log.info("gpu_backend_chosen", backend=sim.backend, gpu_count=len(sim.devices()), simulated=True,
             topology=sim.topology, simulate_faults=health.simulate_faults)
    return sim


def build_sampler(
    *, node_id: str, gpu_backend: str, simulate_spec: str, log: Log, simulate_topology: str = "auto",
    health: HealthOptions | None = None, **options: Any
) -> Sampler:
    """Open the GPU backend, then build the collectors and the :class:`Sampler` around it.

    :param options: the keyword arguments of :func:`sampler_for` (``interval_s``, ``data_paths``, …).
    :raises ConfigError: see :func:`open_gpu_backend` and :func:`choose_host_shape`.
    """
    log = log.bind(node_id=node_id)
    gpus = open_gpu_backend(gpu_backend, simulate_spec, log, node_id=node_id, simulate_topology=simulate_topology,
                            health=health)
    try:
        return sampler_for(gpus, log=log, **options)
    except ConfigError:
        gpus.close()
        raise


def sampler_for(
    gpus: GpuBackend,
    *,
    interval_s: float,
    log: Log,
    data_paths: Sequence[str] = (),
    task_pids: TaskPids | None = None,
    powercap_root: str | Path = DEFAULT_POWERCAP_ROOT,
    simulate_host: str = "",
    real_cores: int | None = None,
    task_metrics: TaskMetricsTargets | None = None,
    qos_window_s: float = 30.0,
) -> Sampler:
    """The host collectors and the :class:`Sampler` around a GPU backend that is already open
    (the agent opens it first, because its task runtime applies power limits through it).

    :param simulate_host: ``--simulate-host`` (see :func:`choose_host_shape`).
    :param real_cores: this machine's logical cores; psutil's count when None.
    :param task_metrics: the running tasks' metrics endpoints; none are scraped when None.
    :param qos_window_s: window of the tasks' latency percentiles and token rates.

    :raises ConfigError: see :func:`choose_host_shape`.
    """
    shape = choose_host_shape(gpus, simulate_host, log)
    cores = real_cores if real_cores is not None else (psutil.cpu_count() or 1)
    others = host_collectors(data_paths=data_paths, task_pids=task_pids, powercap_root=powercap_root,
                             host_shape=shape, real_cores=cores)
    if task_metrics is not None:
        # The scrape timeout stays under the interval so a hanging endpoint is reported on the next tick.
        others.append(TaskMetricsCollector(task_metrics, window_s=qos_window_s,
                                           timeout_s=min(2.0, max(0.2, interval_s))))
    return Sampler(gpus, others, interval_s=interval_s, log=log, host_shape=shape)


def choose_host_shape(gpus: GpuBackend, simulate_host: str, log: Log) -> HostShape | None:
    """The simulated host to report, or None to report this machine.

    Simulated GPUs come with a simulated host: ``CORES:MEM_GIB`` when given, otherwise the
    DGX-like default for their count; ``real`` keeps this machine's figures. Real GPUs always
    come with the real host (a ``--simulate-host`` value is then ignored, with a warning).

    :raises ConfigError: a malformed ``CORES:MEM_GIB``.
    """
    if not gpus.simulated:
        if simulate_host not in ("", REAL_HOST):
            log.warning("host_simulation_ignored", reason="the GPUs are real, so the host is reported as it is")
        return None
    if simulate_host == REAL_HOST:
        return None
    if simulate_host:
        try:
            shape = parse_simulate_host(simulate_host)
        except ValueError as e:
            raise ConfigError(f"--simulate-host: {e}") from e
    else:
        shape = default_host_shape(len(gpus.devices()))
    log.info("host_simulated", cpu_cores=shape.cores, mem_total_bytes=shape.mem_bytes)
    return shape


@dataclass(frozen=True, slots=True)
class CollectorRun:
    """How one collector did on a tick."""

    name: str
    ok: bool
    """False when it raised (anything but NoData, which is a tick with nothing to report)."""
    duration_s: float


@dataclass(frozen=True, slots=True)
class SamplerState:
    """The latest tick as a whole, replaced (never changed) once per tick so another thread reads
    one consistent tick."""

    sample: types_pb2.TelemetrySample
    """The tick's sample, as emitted; readers must not change it."""
    collectors: tuple[CollectorRun, ...]
    """Every collector of the tick, in the order they ran (the GPU backend first)."""
    samples_total: int
    """Ticks sampled since the sampler was built."""
    failures_total: Mapping[str, int]
    """Ticks each collector failed since the sampler was built (collectors that never failed: absent)."""
    gpus: tuple[GpuReading, ...] = ()
    """The tick's GPU readings, with the health signals that are not on the wire (for ``/metrics``)."""


class Sampler:
    """Reads the GPU backend and the other collectors once per tick.

    :param gpus: the backend from :func:`open_gpu_backend`; the sampler closes it.
    :param collectors: the other collectors (host, power), read after the GPUs.
    :param interval_s: seconds between ticks.
    :param now: wall clock for sample timestamps. :param clock: monotonic clock for timing.
    :param sleep: waits between ticks; by default the ``stop`` event given to :meth:`run`.
    :param host_shape: the simulated host the collectors report, for the inventory; None for a real host.
    """

    def __init__(
        self,
        gpus: GpuBackend,
        collectors: Sequence[Collector] = (),
        *,
        interval_s: float = 1.0,
        log: Log,
        now: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
        host_shape: HostShape | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ConfigError(f"--interval {interval_s!r}: must be a positive number of seconds")
        self._gpus = gpus
        self._host_shape = host_shape
        self._collectors: list[Collector] = [gpus, *collectors]
        self._interval_s = interval_s
        self._log = log
        self._now = now
        self._clock = clock
        self._sleep = sleep
        self._failing: dict[str, str] = {}
        self._task_energy_j: dict[str, float] = {}
        self._last_tick: float | None = None
        self._failures_total: dict[str, int] = {}
        self._samples_total = 0
        self._latest: SamplerState | None = None

    @property
    def backend(self) -> str:
        """``nvml`` or ``simulated``, for ``NodeInventory.gpu_backend``."""
        return self._gpus.backend

    @property
    def simulated(self) -> bool:
        """True when the GPUs are simulated, for ``NodeInventory.simulated``."""
        return self._gpus.simulated

    @property
    def host_shape(self) -> HostShape | None:
        """The simulated host's cores and memory, None when the host is reported as it is."""
        return self._host_shape

    @property
    def gpus(self) -> GpuBackend:
        """The backend, for power limits and (when simulated) task placement."""
        return self._gpus

    @property
    def latest(self) -> SamplerState | None:
        """The latest tick, None before the first; safe to read from any thread."""
        return self._latest

    def inventory(self) -> list[types_pb2.GpuInfo]:
        """The GPUs for ``NodeInventory.gpus``, with current power limits."""
        return [d.to_proto() for d in self._gpus.devices()]

    def sample_once(self) -> types_pb2.TelemetrySample:
        """Read every collector now and build this tick's sample."""
        gpus: list[GpuReading] = []
        host: HostReading | None = None
        cpu_power_w: float | None = None
        task_qos: list[TaskQosReading] = []
        runs: list[CollectorRun] = []
        for collector in self._collectors:
            for reading in self._run(collector, runs):
                if isinstance(reading, GpuReading):
                    gpus.append(reading)
                elif isinstance(reading, HostReading):
                    host = reading
                elif isinstance(reading, PowerReading):
                    cpu_power_w = reading.cpu_power_w
                elif isinstance(reading, TaskQosReading):
                    task_qos.append(reading)
        tick = self._clock()
        elapsed = 0.0 if self._last_tick is None else tick - self._last_tick
        self._last_tick = tick
        if host is not None:
            observe_load = getattr(self._gpus, "observe_load", None)
            if observe_load is not None:   # simulated GPUs follow the tasks' CPU usage (from the next tick)
                observe_load({t.task_id: t.cpu_util for t in host.tasks})
            host = dataclasses.replace(host, tasks=self._with_energy(attribute_gpu_usage(host.tasks, gpus), elapsed))
        sample = telemetry_to_proto(self._now(), gpus, host, cpu_power_w, simulated=self._gpus.simulated,
                                    task_qos=task_qos)
        self._samples_total += 1
        self._latest = SamplerState(sample, tuple(runs), self._samples_total, dict(self._failures_total), tuple(gpus))
        return sample

    def run(self, emit: Emit, stop: threading.Event) -> None:
        """Sample every ``interval_s`` until ``stop`` is set, passing each sample to ``emit``.

        Ticks stay on a fixed schedule; when a tick overruns, the missed ones are skipped
        rather than sampled in a burst.
        """
        wait = self._sleep or stop.wait
        next_tick = self._clock()
        while not stop.is_set():
            emit(self.sample_once())
            next_tick += self._interval_s
            late = self._clock() - next_tick
            if late > 0:
                skipped = math.ceil(late / self._interval_s)
                next_tick += skipped * self._interval_s
                self._log.debug("ticks_skipped", count=skipped, duration_s=late)
            wait(max(0.0, next_tick - self._clock()))

    def close(self) -> None:
        """Close the GPU backend (``nvmlShutdown``) and any collector that has a ``close``."""
        for collector in self._collectors[1:]:
            close = getattr(collector, "close", None)
            if close is not None:
                close()
        self._gpus.close()

    def _run(self, collector: Collector, runs: list[CollectorRun]) -> Sequence[Sample]:
        """One collector's readings; an empty list when it had nothing or failed. Appends how it did to ``runs``."""
        start = self._clock()
        try:
            readings = collector.collect()
        except NoData as e:
            duration_s = self._clock() - start
            runs.append(CollectorRun(collector.name, True, duration_s))
            self._log.debug(
                "collector_had_no_data", collector=collector.name, duration_s=duration_s, ok=True, reason=str(e)
            )
            return []
        except Exception as e:  # the loop must outlive any collector bug
            duration_s = self._clock() - start
            runs.append(CollectorRun(collector.name, False, duration_s))
            self._failures_total[collector.name] = self._failures_total.get(collector.name, 0) + 1
            self._report_failure(collector.name, e, duration_s)
            return []
        duration_s = self._clock() - start
        runs.append(CollectorRun(collector.name, True, duration_s))
        if self._failing.pop(collector.name, None) is not None:
            self._log.info("collector_recovered", collector=collector.name, duration_s=duration_s, ok=True)
        else:
            self._log.debug("collector_ran", collector=collector.name, duration_s=duration_s, ok=True)
        return readings

    def _report_failure(self, name: str, error: Exception, duration_s: float) -> None:
        """Warn when a collector starts failing or fails differently; repeats go to debug.

        A collector that fails every tick would otherwise write a warning every second.
        """
        reason = str(error) if isinstance(error, CollectorError) else f"{type(error).__name__}: {error}"
        level = self._log.debug if self._failing.get(name) == reason else self._log.warning
        self._failing[name] = reason
        level("collector_failed", collector=name, duration_s=duration_s, ok=False, reason=reason)

    def _with_energy(self, tasks: Sequence[TaskUsage], elapsed_s: float) -> tuple[TaskUsage, ...]:
        """Add each task's power share over the last tick to its running energy total."""
        energy = {t.task_id: self._task_energy_j.get(t.task_id, 0.0) + t.power_share_w * elapsed_s for t in tasks}
        self._task_energy_j = energy  # tasks that ended drop out here
        return tuple(dataclasses.replace(t, energy_share_j=energy[t.task_id]) for t in tasks)


def attribute_gpu_usage(tasks: Sequence[TaskUsage], gpus: Sequence[GpuReading]) -> tuple[TaskUsage, ...]:
    """Give each task its share of the GPUs its processes run on.

    On each GPU a task's share is its processes' part of the memory that all processes
    there hold (an equal split by process count when no memory is known). The task gets
    that share of the GPU's utilization and power, and all of its processes' memory.

    :param tasks: per-task usage from the host collector, with every pid (children too).
    :param gpus: this tick's GPU readings, with their compute processes.
    :returns: the tasks with ``gpu_mem_bytes``, ``gpu_util_share`` and ``power_share_w`` set.
    """
    owner = {pid: t.task_id for t in tasks for pid in t.pids}
    mem: dict[str, int] = {}
    util: dict[str, float] = {}
    power: dict[str, float] = {}
    for gpu in gpus:
        if not gpu.processes:
            continue
        total_mem = sum(p.used_mem_bytes or 0 for p in gpu.processes)
        for proc in gpu.processes:
            task_id = owner.get(proc.pid)
            if task_id is None:
                continue
            used = proc.used_mem_bytes or 0
            share = used / total_mem if total_mem > 0 else 1.0 / len(gpu.processes)
            mem[task_id] = mem.get(task_id, 0) + used
            util[task_id] = util.get(task_id, 0.0) + (gpu.util_gpu or 0.0) * share
            power[task_id] = power.get(task_id, 0.0) + (gpu.power_w or 0.0) * share
    return tuple(
        dataclasses.replace(
            t,
            gpu_mem_bytes=mem.get(t.task_id, 0),
            gpu_util_share=util.get(t.task_id, 0.0),
            power_share_w=power.get(t.task_id, 0.0),
        )
        for t in tasks
    )
