"""Simulated GPUs for laptops, CI and experiments: a deterministic model, no hardware.

``--simulate-gpus 4xA100-40GB,2xL4-24GB`` builds six GPUs. What runs on them is told by
the agent (:meth:`SimulatedGpus.place` / :meth:`SimulatedGpus.remove`); utilization and
memory follow the placed tasks, and power follows utilization on a per-model line from
idle to maximum board power, capped by the power limit::

    power_w = min(limit_w, idle_w + (max_w - idle_w) * util)

A task's utilization follows its own load (docs/devcluster.md): a task placed with
``follows_load`` keeps each of its GPUs as busy as its processes keep CPU cores busy, one busy core
per GPU being a fully busy GPU (:meth:`SimulatedGpus.observe_load`, fed each tick by the sampler
with the tasks' CPU usage), so a task that sleeps leaves its GPUs idle and one that computes fills
them. A task can instead declare a fixed load with ``GPTRM_SIM_LOAD`` in its environment
(:data:`SIM_LOAD_ENV`, :func:`parse_sim_load`): ``0.7`` or ``70%``.

Every reading and device says ``simulated=True``; UUIDs are ``GPU-sim-<node>-<i>``.

Faults (``--simulate-faults FILE``, :mod:`agent.health.faults`): XID events, throttling, NVLinks down,
double-bit ECC, row remaps, a narrower PCIe link, a lost GPU and a GPU reset, read from a file the
agent follows. Each tick every GPU's faults are read as health signals and classified by the same
:class:`agent.health.HealthWatch` as real GPUs' signals, labelled simulated.

``--simulate-topology`` describes how the GPUs are linked (:func:`common.topology.simulated_topology`):
``hgx`` (all NVLinked through NVSwitch, two sockets), ``pcie-nvlink-pairs`` (a two-socket PCIe
server with NVLink bridges on 0-1, 2-3, ...), ``pcie`` or ``none``. ``auto`` picks ``hgx`` for a
node of one SXM-class model (H100, H200, A100, B200) with several GPUs, which is what such a
server is, ``pcie`` for other single-model nodes of several GPUs, and ``none`` otherwise. The
simulated CPU affinity splits the CPUs this agent may run on between the two sockets, so a
task bound to it runs on CPUs that exist.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from agent.collectors.base import GpuDevice, GpuProcessReading, GpuReading
from agent.health import FaultFile, HealthOptions, HealthWatch, SimFaults, parse_fault
from common.errors import ValidationError
from common.topology import SIMULATED_TOPOLOGIES, simulated_topology

__all__ = [
    "DEFAULT_SIMULATE_SPEC",
    "NAME",
    "SIM_LOAD_ENV",
    "SimGpuSpec",
    "SimModel",
    "SimulatedGpus",
    "model_for",
    "parse_sim_load",
    "parse_simulate_spec",
    "resolve_simulated_topology",
    "simulated_power_w",
]

NAME = "simulated"
SIM_LOAD_ENV = "GPTRM_SIM_LOAD"
"""A task's environment variable declaring the load it puts on its simulated GPUs (0..1, or 0%..100%)."""
DEFAULT_SIMULATE_SPEC = "8xH100-80GB"
GIB = 1 << 30
_IDLE_SM_CLOCK_MHZ = 210
_MAX_GPUS = 256

_ENTRY = re.compile(r"^(\d+)[xX]([A-Za-z0-9][A-Za-z0-9_.-]*?)-(\d+)(?:GB|GiB|gb|gib)$")


@dataclass(frozen=True, slots=True)
class SimModel:
    """Power and clock figures of one GPU model (datasheet-ish)."""

    idle_w: float
    max_w: float
    """Maximum board power; also the default and highest allowed power limit."""
    min_limit_w: float
    sm_clock_max_mhz: int = 1500
    mem_clock_mhz: int = 1500


# Keyed by "<MODEL>-<MEM>GB" or by model alone where every memory size draws the same power.
_MODELS: dict[str, SimModel] = {
    "H100-80GB": SimModel(70, 700, 200, 1980, 2619),
    "A100-80GB": SimModel(50, 400, 100, 1410, 1593),
    "A100-40GB": SimModel(50, 400, 100, 1410, 1215),
    "L4-24GB": SimModel(16, 72, 40, 2040, 6251),
    "V100": SimModel(35, 300, 150, 1530, 877),
    "T4": SimModel(10, 70, 60, 1590, 5001),
    "P100": SimModel(30, 250, 125, 1480, 715),
}

# Unknown models: (largest memory in GiB, model); bigger memory usually means a bigger board.
_BY_MEMORY: tuple[tuple[int, SimModel], ...] = (
    (16, SimModel(10, 70, 60)),
    (24, SimModel(16, 72, 40)),
    (48, SimModel(30, 300, 100)),
    (80, SimModel(50, 400, 100)),
)
_LARGEST = SimModel(70, 700, 200)


@dataclass(frozen=True, slots=True)
class SimGpuSpec:
    """One simulated GPU as the spec describes it."""

    model: str
    mem_gib: int
    group: int
    """Which spec entry it came from; used as its topology group."""

    @property
    def label(self) -> str:
        """The model name shown in the inventory (``H100-80GB``)."""
        return f"{self.model}-{self.mem_gib}GB"


def parse_simulate_spec(spec: str) -> list[SimGpuSpec]:
    """Parse ``COUNTxMODEL-MEMGB[,COUNTxMODEL-MEMGB...]`` into one entry per GPU.

    Example: ``parse_simulate_spec("2xL4-24GB")`` → two ``SimGpuSpec("L4", 24, 0)``.

    :raises ValueError: naming the bad entry and what is wrong with it.
    """
    entries = [e.replace(" ", "") for e in spec.split(",")]
    if not any(entries):
        raise ValueError("empty GPU spec: expected COUNTxMODEL-MEMGB[,...], e.g. 8xH100-80GB")
    gpus: list[SimGpuSpec] = []
    for group, entry in enumerate(entries):
        match = _ENTRY.match(entry)
        if match is None:
            raise ValueError(f"bad GPU spec entry {entry!r} in {spec!r}: expected COUNTxMODEL-MEMGB, e.g. 8xH100-80GB")
        count, model, mem = int(match[1]), match[2].upper(), int(match[3])
        if count < 1 or mem < 1:
            raise ValueError(f"bad GPU spec entry {entry!r}: GPU count and memory must be at least 1")
        gpus.extend(SimGpuSpec(model, mem, group) for _ in range(count))
    if len(gpus) > _MAX_GPUS:
        raise ValueError(f"GPU spec {spec!r} asks for {len(gpus)} GPUs; at most {_MAX_GPUS} per node")
    return gpus


_SXM_MODELS = ("H100", "H200", "A100", "B200")


def resolve_simulated_topology(name: str, specs: Sequence[SimGpuSpec]) -> str:
    """The topology ``auto`` stands for on these GPUs (other names are returned as they are).

    :raises ValueError: on a name that is not one of :data:`common.topology.SIMULATED_TOPOLOGIES`.
    """
    if name not in SIMULATED_TOPOLOGIES:
        raise ValueError(f"unknown simulated topology {name!r}: expected one of {', '.join(SIMULATED_TOPOLOGIES)}")
    if name != "auto":
        return name
    if len(specs) < 2 or len({s.group for s in specs}) > 1:
        return "none"
    return "hgx" if specs[0].model in _SXM_MODELS else "pcie"


def _usable_cpus() -> list[int]:
    """The CPUs this process may run on (all online CPUs where affinity is not available)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def model_for(gpu: SimGpuSpec) -> SimModel:
    """The power figures for ``gpu``: by model and memory, by model, else by memory size."""
    found = _MODELS.get(gpu.label) or _MODELS.get(gpu.model)
    if found is None:
        found = next((m for key, m in _MODELS.items() if key.startswith(gpu.model + "-")), None)
    if found is None:
        found = next((m for limit, m in _BY_MEMORY if gpu.mem_gib <= limit), _LARGEST)
    return found


def simulated_power_w(model: SimModel, util: float, limit_w: float) -> float:
    """Board power at ``util`` (0..1): linear from idle to max, capped by the power limit."""
    return min(limit_w, model.idle_w + (model.max_w - model.idle_w) * util)


def parse_sim_load(text: str) -> float:
    """A declared load, ``GPTRM_SIM_LOAD``'s value: a fraction ``0.7`` or a percentage ``70%``, within 0..1.

    :raises ValueError: naming the variable and what is wrong.
    """
    value = text.strip()
    try:
        load = float(value[:-1]) / 100.0 if value.endswith("%") else float(value)
    except ValueError:
        raise ValueError(f"{SIM_LOAD_ENV}={text[:32]!r}: expected a fraction (0.7) or a percentage (70%)") from None
    if not 0.0 <= load <= 1.0:
        raise ValueError(f"{SIM_LOAD_ENV}={text[:32]!r}: outside 0..1 (0%..100%)")
    return load


@dataclass(slots=True)
class _Placement:
    indices: tuple[int, ...]
    util: float
    """Fixed utilization per GPU; with ``follows``, the most it can reach (its share of each GPU)."""
    mem_bytes: int
    pid: int | None
    follows: bool = False
    """Its utilization is ``util × load``, ``load`` following its CPU usage."""
    load: float = 0.0

    @property
    def util_now(self) -> float:
        return self.util * self.load if self.follows else self.util


class SimulatedGpus:
    """The simulated GPUs of one node.

    Example::

        gpus = SimulatedGpus("8xH100-80GB", node_id="n1", clock=fake_clock)
        gpus.place("t1", [0, 1], util_per_gpu=0.9, mem_bytes_per_gpu=40 << 30)
        readings = gpus.collect()   # GPUs 0 and 1 at ~90 % and ~637 W
        gpus.place("t2", [2], util_per_gpu=1.0, mem_bytes_per_gpu=0, follows_load=True)
        gpus.observe_load({"t2": 0.5})   # its processes keep half a core busy
        readings = gpus.collect()   # GPU 2 at ~50 %
        gpus.remove("t1")

    :param spec: see :func:`parse_simulate_spec`. :param node_id: goes into the UUIDs.
    :param clock: monotonic seconds; the energy counters integrate power over it.
    :param seed: RNG seed for the small variation; derived from ``node_id`` when None.
    :param jitter: amplitude of the variation added to the utilization of busy GPUs.
    :param topology: a :data:`common.topology.SIMULATED_TOPOLOGIES` name (see the module docstring).
    :param cpus: the host CPUs the simulated affinity is drawn from; those this process may use when None.
    :param health: the XID lists and the fault file (``--simulate-faults``); defaults when None.
    :param log: where health changes and fault lines are logged. :param now: wall clock (health's ``since``).
    :raises ValueError: when ``spec`` or ``topology`` is malformed.
    """

    name = NAME
    backend = NAME
    simulated = True

    def __init__(
        self,
        spec: str,
        node_id: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
        jitter: float = 0.02,
        topology: str = "auto",
        cpus: Sequence[int] | None = None,
        health: HealthOptions | None = None,
        log: structlog.typing.FilteringBoundLogger | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._specs = parse_simulate_spec(spec)
        self._models = [model_for(s) for s in self._specs]
        self.topology = resolve_simulated_topology(topology, self._specs)
        facts = simulated_topology(self.topology, len(self._specs), _usable_cpus() if cpus is None else cpus)
        pairs = enumerate(zip(self._specs, self._models, strict=True))
        self._devices = [
            dataclasses.replace(
                self._device(i, s, m, node_id),
                numa_node=facts[i].numa_node, cpu_affinity=facts[i].cpu_affinity, links=facts[i].links,
            )
            for i, (s, m) in pairs
        ]
        self._clock = clock
        self._rng = random.Random(zlib.crc32(node_id.encode()) if seed is None else seed)
        self._jitter = jitter
        self._lock = threading.Lock()
        self._placements: dict[str, _Placement] = {}
        self._energy_j = [0.0] * len(self._devices)
        self._last_time: float | None = None
        health = health or HealthOptions()
        log = log or structlog.get_logger().bind(component="agent")
        source = FaultFile(health.simulate_faults, log) if health.simulate_faults else None
        self._faults = SimFaults(len(self._devices), source)
        self._watch = HealthWatch(len(self._devices), health.policy, log, simulated=True, now=now)
        self._now = now

    def devices(self) -> list[GpuDevice]:
        """The inventory, with the current power limits."""
        with self._lock:
            return list(self._devices)

    def place(
        self,
        task_id: str,
        gpu_indices: Sequence[int],
        util_per_gpu: float,
        mem_bytes_per_gpu: int,
        pids: Sequence[int] = (),
        *,
        follows_load: bool = False,
    ) -> None:
        """Run ``task_id`` on ``gpu_indices`` from now on (placing it again replaces it).

        :param util_per_gpu: compute it keeps busy on each GPU, 0..1 (sums over tasks, capped at 1); with
            ``follows_load``, the most it can keep busy (its share of each GPU).
        :param follows_load: its utilization follows its load (:meth:`observe_load`), idle until observed.
        :param mem_bytes_per_gpu: GPU memory it holds on each GPU.
        :param pids: its processes; the first is listed as the GPU process so usage can be attributed.
        :raises ValidationError: unknown or repeated GPU index, util outside 0..1, negative memory.
        """
        indices = tuple(gpu_indices)
        bad = [i for i in indices if not 0 <= i < len(self._devices)]
        if bad or len(set(indices)) != len(indices):
            raise ValidationError(
                "gpu_indices", f"{list(indices)} for task {task_id!r}: GPUs are 0..{len(self._devices) - 1}, each once"
            )
        if not 0.0 <= util_per_gpu <= 1.0:
            raise ValidationError("util_per_gpu", f"{util_per_gpu} for task {task_id!r} is outside 0..1")
        if mem_bytes_per_gpu < 0:
            raise ValidationError("mem_bytes_per_gpu", f"{mem_bytes_per_gpu} for task {task_id!r} is negative")
        with self._lock:
            self._placements[task_id] = _Placement(indices, util_per_gpu, mem_bytes_per_gpu, pids[0] if pids else None,
                                                   follows_load)

    def observe_load(self, cpu_cores: Mapping[str, float]) -> None:
        """The CPU cores each task keeps busy now (the host collector's per-task usage): a task placed with
        ``follows_load`` keeps each of its GPUs as busy as that, one core per GPU being a full GPU. Tasks
        not named keep their last load."""
        with self._lock:
            for task_id, cores in cpu_cores.items():
                p = self._placements.get(task_id)
                if p is not None and p.follows and math.isfinite(cores):
                    p.load = min(1.0, max(0.0, cores / max(1, len(p.indices))))

    def remove(self, task_id: str) -> None:
        """Stop simulating ``task_id``; unknown ids are ignored (removal is idempotent)."""
        with self._lock:
            self._placements.pop(task_id, None)

    def set_power_limit(self, index: int, watts: float) -> None:
        """Cap GPU ``index`` at ``watts``.

        Example: ``gpus.set_power_limit(3, 450.0)``.

        :raises ValidationError: unknown index, or ``watts`` outside [power_min_w, power_max_w].
        """
        if not 0 <= index < len(self._devices):
            raise ValidationError("gpu_index", f"GPU {index} does not exist (this node has {len(self._devices)})")
        device = self._devices[index]
        if not device.power_min_w <= watts <= device.power_max_w:
            raise ValidationError(
                "power_limit_w",
                f"{watts} W is outside GPU {index}'s range [{device.power_min_w}, {device.power_max_w}] W",
            )
        with self._lock:
            self._devices[index] = dataclasses.replace(device, power_limit_w=float(watts))

    def set_healthy(self, index: int, healthy: bool, reason: str = "gpu is lost") -> None:
        """Make GPU ``index`` lost (``reason`` is the evidence) or, with ``healthy``, answer again with its
        health started over (as after the agent restarts), to rehearse failures."""
        with self._lock:
            self._faults.set_lost(index, "" if healthy else reason)
            if healthy:
                self._watch.forget(index)

    def inject(self, fault: Mapping[str, object]) -> None:
        """Apply one fault as a line of ``--simulate-faults`` would (``{"gpu": 3, "xid": 79}``).

        :raises ValidationError: naming the bad field.
        """
        parsed = parse_fault(json.dumps(dict(fault)), len(self._devices))
        with self._lock:
            self._faults.apply(parsed)

    def collect(self) -> list[GpuReading]:
        """Every GPU's state now; energy counters advance by power × elapsed time. The fault file's new
        lines are applied first, and every GPU's signals are classified."""
        with self._lock:
            self._faults.poll()
            now = self._clock()
            elapsed = 0.0 if self._last_time is None else max(0.0, now - self._last_time)
            self._last_time = now
            wall = self._now()
            readings = []
            for i in range(len(self._devices)):
                reading = self._reading(i, elapsed)
                signals = self._faults.signals(i, wall, busy=(reading.util_gpu or 0.0) > 0.0)
                if reading.ecc_uncorrected_total is not None:
                    reading = dataclasses.replace(reading, ecc_uncorrected_total=signals.ecc_uncorrected_volatile)
                readings.append(self._watch.classify(reading, signals))
            return readings

    def close(self) -> None:
        """Nothing to release; present so every backend closes the same way."""

    def _reading(self, index: int, elapsed: float) -> GpuReading:
        device, model = self._devices[index], self._models[index]
        if self._faults.lost(index):
            return GpuReading(index=index, uuid=device.uuid, simulated=True)
        placed = [p for p in self._placements.values() if index in p.indices]
        util = min(1.0, sum(p.util_now for p in placed))
        if util > 0 and self._jitter > 0:
            util = min(1.0, max(0.0, util + self._rng.uniform(-self._jitter, self._jitter)))
        power = simulated_power_w(model, util, device.power_limit_w)
        self._energy_j[index] += power * elapsed
        # Under a power cap the clocks drop with the share of the wanted power that is allowed.
        wanted = simulated_power_w(model, util, model.max_w)
        throttle = 1.0
        if wanted > power and wanted > model.idle_w:
            throttle = max(0.0, (power - model.idle_w) / (wanted - model.idle_w))
        if self._faults.throttled(index):   # a simulated slowdown holds the clocks at half
            throttle *= 0.5
        return GpuReading(
            index=index,
            uuid=device.uuid,
            util_gpu=util,
            util_mem=util * 0.5,
            mem_used_bytes=min(device.mem_total_bytes, sum(p.mem_bytes for p in placed)),
            mem_total_bytes=device.mem_total_bytes,
            power_w=power,
            power_limit_w=device.power_limit_w,
            energy_j=self._energy_j[index],
            temperature_c=30.0 + 50.0 * power / model.max_w,
            sm_clock_mhz=round(_IDLE_SM_CLOCK_MHZ + (model.sm_clock_max_mhz - _IDLE_SM_CLOCK_MHZ) * util * throttle),
            mem_clock_mhz=model.mem_clock_mhz,
            ecc_corrected_total=0,
            ecc_uncorrected_total=0,
            mig_enabled=False,
            processes=tuple(GpuProcessReading(p.pid, p.mem_bytes) for p in placed if p.pid is not None),
            simulated=True,
        )

    @staticmethod
    def _device(index: int, spec: SimGpuSpec, model: SimModel, node_id: str) -> GpuDevice:
        return GpuDevice(
            index=index,
            uuid=f"GPU-sim-{node_id}-{index}",
            model=spec.label,
            mem_total_bytes=spec.mem_gib * GIB,
            power_limit_w=model.max_w,
            power_min_w=model.min_limit_w,
            power_max_w=model.max_w,
            power_default_w=model.max_w,
            pci_bus_id=f"00000000:{index + 1:02X}:00.0",
            topology_group=spec.group,
            simulated=True,
        )
