"""GPU power capping (Resource Adaptor): lower a GPU's power limit where its work gains little from power.

Every period, while this replica leads and ``--power-capping on``, :class:`PowerCapper` looks at each
GPU of every connected, ready, powered-on node in the node's latest telemetry sample and decides:

- **restore** to the GPU's maximum when a task on it is under QoS pressure (an active violation, or
  :meth:`QosWatch.pressure` is ``MORE``), asks for full power (``TaskSpec.full_power``), or the GPU
  is compute-bound again (SM utilization at or above ``_BUSY_UTIL``). A restore under pressure or for
  full power is immediate; the others wait for the rate limit;
- **step down** by a tenth of the GPU's range (never below its minimum) when the GPU gains little
  from its power — idle (nothing placed on it and SM utilization under ``_IDLE_UTIL``), under-utilized
  (SM under ``_LOW_UTIL``) or memory-bound (memory-controller busy at or above ``_MEM_BOUND_MEM`` with
  SM under ``_MEM_BOUND_SM``) — and no task on it has QoS pressure other than ``LESS`` or none;
- else leave it.

The range is the GPU's NVML ``[power_min_w, power_max_w]`` from the node's inventory; a GPU that
reports no range is never touched. Lowering a GPU waits at least ``interval_s`` after its previous
change (the rate limit). A change goes to the agent as a ``SetPowerLimit`` decision (the agent applies
it through NVML, or the simulated backend, whose power draw follows the limit), is published as a
``power`` event with the watts before and after, logged (``gpu_power_limit_changed``) and counted in
``gptrm_adaptor_power_cap_changes_total{direction}``. Until telemetry reflects it, the limit this
replica sent stands for the GPU's current limit.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import NodeState, TaskState
from coordinator.dispatch.dispatcher import Dispatcher
from coordinator.events import EventBus
from coordinator.monitor.nodes import NodeRegistry
from coordinator.power_states import power_label
from coordinator.qos.watch import Pressure
from coordinator.supervisor import Beat, no_beat

__all__ = ["CapDecision", "PowerCapper", "QosSignal"]

_IDLE_UTIL = 0.05
_LOW_UTIL = 0.30
_MEM_BOUND_MEM = 0.50
_MEM_BOUND_SM = 0.60
_BUSY_UTIL = 0.60
_STEP_FRACTION = 0.10


class QosSignal(Protocol):
    """What the capper reads from the QoS Manager (``QosWatch``)."""

    def pressure(self, task_id: str) -> Pressure | None: ...

    def violations(self, task_id: str) -> dict[str, str]: ...


class Counter(Protocol):
    def labels(self, *values: str, **kw: str) -> Counter: ...

    def inc(self, amount: float = 1.0) -> None: ...


@dataclass(frozen=True, slots=True)
class CapDecision:
    """One power-limit change.

    :param node_id: the node. :param gpu_index: the GPU on it.
    :param before_w: the limit it had. :param after_w: the limit it gets.
    :param reason: why.
    """

    node_id: str
    gpu_index: int
    before_w: float
    after_w: float
    reason: str


class PowerCapper:
    """Lowers GPU power limits stepwise where it costs no QoS, and restores them when it would.

    Example::

        capper.step()            # one pass; returns the changes it sent

    :param registry: the node table (inventories, connection state).
    :param latest: node id → its latest telemetry sample (``ResourceMonitor.latest.get``).
    :param tasks: task id → task (the task table's ``tasks``), read only.
    :param qos: each task's pressure and active violations.
    :param dispatcher: sends ``SetPowerLimit`` decisions.
    :param events: the cluster event log.
    :param changes: ``gptrm_adaptor_power_cap_changes_total`` (label ``direction``: down | up).
    :param interval_s: least seconds between a GPU's change and its next lowering (the rate limit).
    :param period_s: seconds between two passes of :meth:`run`.
    :param now: monotonic clock (injected in tests).
    """

    def __init__(self, registry: NodeRegistry, latest: Callable[[str], types_pb2.TelemetrySample | None],
                 tasks: Callable[[], Mapping[str, types_pb2.Task]], qos: QosSignal, dispatcher: Dispatcher,
                 events: EventBus, changes: Counter, *, interval_s: float = 30.0, period_s: float = 2.0,
                 now: Callable[[], float] = time.monotonic) -> None:
        self._registry, self._latest, self._tasks, self._qos = registry, latest, tasks, qos
        self._dispatcher, self._events, self._changes = dispatcher, events, changes
        self._interval_s, self._period_s, self._now = interval_s, period_s, now
        self._sent: dict[tuple[str, int], tuple[float, float]] = {}   # (node, gpu) → (watts, when)
        self._log = get_logger("adaptor")

    async def run(self, beat: Beat = no_beat) -> None:
        """A pass every period while leading (cancelled when leadership ends)."""
        self._sent.clear()
        while True:
            try:
                self.step()
            except Exception as e:   # one bad reading must not end capping for the whole leadership
                self._log.error("power_cap_step_failed", reason=f"{type(e).__name__}: {e}", exc_info=True)
            beat()
            await asyncio.sleep(self._period_s)

    def step(self) -> list[CapDecision]:
        """One pass over every GPU; returns the changes sent."""
        now = self._now()
        on_gpu = self._tasks_by_gpu()
        out: list[CapDecision] = []
        for entry in self._registry:
            if not entry.connected or entry.state != NodeState.READY \
                    or power_label(entry.record.power_state) != "ready":
                continue
            sample = self._latest(entry.node_id)
            if sample is None:
                continue
            readings = {g.index: g for g in sample.gpus}
            for gpu in entry.inventory.gpus:
                reading = readings.get(gpu.index)
                if reading is None or not reading.healthy:
                    continue
                decision = self._decide(entry.node_id, gpu, reading, on_gpu.get((entry.node_id, gpu.index), []),
                                        now)
                if decision is not None and self._apply(decision, now):
                    out.append(decision)
        return out

    # ---- deciding -------------------------------------------------------------------------------

    def _tasks_by_gpu(self) -> dict[tuple[str, int], list[types_pb2.Task]]:
        out: dict[tuple[str, int], list[types_pb2.Task]] = {}
        for task in self._tasks().values():
            if task.state not in (TaskState.SCHEDULED, TaskState.STARTING, TaskState.RUNNING,
                                  TaskState.PAUSED):
                continue
            for na in task.allocation.nodes:
                for index in na.gpu_indices:
                    out.setdefault((na.node_id, index), []).append(task)
        return out

    def _current_w(self, node_id: str, gpu: types_pb2.GpuInfo, reading: types_pb2.GpuSample, now: float) -> float:
        sent = self._sent.get((node_id, gpu.index))
        if sent is not None and now - sent[1] < self._interval_s:
            return sent[0]   # telemetry may not show it yet
        if reading.HasField("power_limit_w") and reading.power_limit_w > 0:
            return reading.power_limit_w
        return gpu.power_limit_w or gpu.power_max_w

    def _pressure(self, task: types_pb2.Task) -> Pressure | None:
        if self._qos.violations(task.id):
            return Pressure.MORE
        return self._qos.pressure(task.id)

    def _decide(self, node_id: str, gpu: types_pb2.GpuInfo, reading: types_pb2.GpuSample,
                tasks: list[types_pb2.Task], now: float) -> CapDecision | None:
        lo, hi = gpu.power_min_w, gpu.power_max_w
        if not (0 < lo <= hi):
            return None   # no range reported: not ours to change
        current = self._current_w(node_id, gpu, reading, now)
        sent = self._sent.get((node_id, gpu.index))
        rate_limited = sent is not None and now - sent[1] < self._interval_s

        def change(target: float, reason: str) -> CapDecision | None:
            target = min(hi, max(lo, target))
            if abs(target - current) < 0.5:
                return None
            return CapDecision(node_id, gpu.index, current, target, reason)

        full = [t.id for t in tasks if t.spec.full_power]
        if full:
            return change(hi, f"task {full[0]} asks for full power")
        pressed = [t.id for t in tasks if self._pressure(t) == Pressure.MORE]
        if pressed:
            return change(hi, f"task {pressed[0]} is under QoS pressure")
        util = reading.util_gpu if reading.HasField("util_gpu") else None
        mem = reading.util_mem if reading.HasField("util_mem") else None
        if util is None:
            return None   # nothing to judge by
        if rate_limited:
            return None
        if util >= _BUSY_UTIL and not (mem is not None and mem >= _MEM_BOUND_MEM and util < _MEM_BOUND_SM):
            return change(hi, f"compute-bound (SM {util:.0%})")
        if any(self._pressure(t) not in (None, Pressure.LESS) for t in tasks):
            return None   # within its targets, but not comfortably: leave it
        if not tasks and util < _IDLE_UTIL:
            why = "idle"
        elif mem is not None and mem >= _MEM_BOUND_MEM and util < _MEM_BOUND_SM:
            why = f"memory-bound (SM {util:.0%}, memory {mem:.0%})"
        elif util < _LOW_UTIL:
            why = f"under-utilized (SM {util:.0%})"
        else:
            return None
        return change(current - max(1.0, _STEP_FRACTION * (hi - lo)), why)

    # ---- applying -------------------------------------------------------------------------------

    def _apply(self, d: CapDecision, now: float) -> bool:
        sent = self._dispatcher.send(d.node_id, agent_pb2.Decision(
            decision_id=f"power-limit-{d.node_id}-{d.gpu_index}-{uuid.uuid4().hex[:6]}",
            set_power_limit=agent_pb2.SetPowerLimit(gpu_index=d.gpu_index, power_limit_w=d.after_w)))
        if not sent:
            return False
        self._sent[(d.node_id, d.gpu_index)] = (d.after_w, now)
        direction = "down" if d.after_w < d.before_w else "up"
        self._changes.labels(direction=direction).inc()
        self._log.info("gpu_power_limit_changed", node_id=d.node_id, gpu_index=d.gpu_index, before_w=d.before_w,
                       after_w=d.after_w, reason=d.reason)
        self._events.publish("power", f"node {d.node_id} GPU {d.gpu_index} power limit {d.before_w:.0f} W → "
                             f"{d.after_w:.0f} W: {d.reason}", node_id=d.node_id, gpu_index=str(d.gpu_index),
                             before_w=f"{d.before_w:.1f}", after_w=f"{d.after_w:.1f}", reason=d.reason)
        return True
