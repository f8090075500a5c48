"""The production Resource Adaptor (:class:`coordinator.adaptor.power.PowerManager`) in virtual time.

The replay hands the leader's power manager what a cluster would: a node registry whose entries
are the simulated nodes (their agents "register" when a power-on completes and "disconnect" when a
node is powered off), the pending tasks, the ``simulated`` node provider, and the simulator's clock.
What stands in for etcd is in memory and single-writer: a replay has one leader, its writes
cannot be fenced out, and no other replica takes node locks. A step is run to completion at
once (nothing in it waits on I/O), and the draining confirmation waits zero virtual seconds: a
replay's scheduling passes are atomic, so no cycle can have chosen a node while it drains.

The energy model stays the simulator's (:class:`coordinator.simulator.metrics.MetricsRecorder`:
idle and max watts per powered node); a node draws power while the provider says it is powered
(on, booting, or shutting down).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any

from common.pb.gptrm.v1 import types_pb2
from common.pbenum import pb_enum
from common.types import TaskState
from coordinator.adaptor.power import PowerManager
from coordinator.adaptor.providers import SimulatedProvider
from coordinator.domain import NodeSnapshot, Request, Resources
from coordinator.events import EventBus
from coordinator.monitor.nodes import NodeEntry, NodeRegistry
from coordinator.power_states import power_label
from coordinator.scheduler.policies.base import DEFAULT_THRESHOLD_MODE
from coordinator.scheduler.snapshot import NodeFit
from coordinator.state import LeaderState

__all__ = ["SimAdaptor"]


class _MemoryStore:
    """Node records kept in memory (the replay's stand-in for ``nodes/<id>`` in etcd)."""

    def put_node(self, record: types_pb2.NodeRecord) -> types_pb2.NodeRecord:
        return record


class _SoleLeader:
    """The replay's only replica: every write is its own."""

    async def write(self, fn: Callable[..., Any], *args: object, **kwargs: object) -> Any:
        return fn(*args, **kwargs)


class _NoContention:
    """Node locks nobody else takes."""

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        yield


async def _no_wait(seconds: float) -> None:
    return None


def _run(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never suspends to completion."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise RuntimeError("a simulated power step waited on something: nothing in a replay may")


class SimAdaptor:
    """Drives a :class:`PowerManager` with the ``simulated`` provider over a replay's nodes.

    :param nodes: the cluster's nodes, in snapshot order.
    :param now: the simulator's virtual clock.
    :param current: node ``i`` as the placement engine holds it now (what it holds), in the same order.
    :param threshold: the policy's threshold (the placement filter's, for :class:`NodeFit`).
    :param threshold_mode: the policy's threshold mode.
    :param power_down_after_s: ``--power-down-after`` (> 0).
    :param spare_nodes: ``--spare-nodes``.
    :param boot_s: virtual seconds from power-on until a node's agent registers.
    :param wake_timeout_s: ``--wake-timeout``.
    """

    def __init__(self, nodes: Sequence[NodeSnapshot], now: Callable[[], float],
                 current: Callable[[int], NodeSnapshot], threshold: float, *,
                 threshold_mode: str = DEFAULT_THRESHOLD_MODE, power_down_after_s: float,
                 spare_nodes: int = 1, boot_s: float = 0.0, wake_timeout_s: float = 600.0) -> None:
        self._now = now
        self.registry = NodeRegistry(heartbeat_interval_s=float("inf"), lost_grace_s=float("inf"), now=now)
        self.entries: list[NodeEntry] = []
        idle_w: dict[str, float] = {}
        for node in nodes:
            record = types_pb2.NodeRecord()
            record.inventory.node_id = node.node_id
            for g in range(len(node.gpus) or round(node.capacity.gpus)):
                record.inventory.gpus.add(index=g)
            record.power_state = types_pb2.NODE_POWER_STATE_READY
            entry = self.registry.load(record)
            self.registry.mark_connected(entry)
            self.entries.append(entry)
            idle_w[node.node_id] = node.power.idle_w
        # The leader's state as the replay keeps it: pending jobs, and what each node holds.
        self.state = LeaderState(self.registry)
        self._requests: dict[str, Request] = {}
        self._index = {node.node_id: i for i, node in enumerate(nodes)}
        self.provider = SimulatedProvider(now, boot_s=boot_s)
        self.events = EventBus(backlog=100, now=now)
        self.changed = False
        self.manager = PowerManager(
            self.registry, self.state, _MemoryStore(), _SoleLeader(), _NoContention(),
            self.provider, self.events, power_down_after_s=power_down_after_s, spare_nodes=spare_nodes,
            wake_timeout_s=wake_timeout_s, idle_power_w=lambda e: idle_w[e.node_id], fit=lambda: self._fit,
            on_change=self._changed, period_s=0.0, now=now, wall=now, sleep=_no_wait)
        # The placement filter over the engine's nodes, each as if schedulable (an off node holds
        # nothing: its jobs ended before it was powered off); kept across steps, a node forgotten
        # whenever a job is placed on it or leaves it.
        self._fit = NodeFit(lambda e: replace(current(self._index[e.node_id]), schedulable=True),
                            lambda task: self._requests[task.id], threshold, threshold_mode)

    def _changed(self) -> None:
        self.changed = True

    # ---- what the scheduler tells it ------------------------------------------------------------

    def arrived(self, req: Request) -> None:
        """A job is pending."""
        task = types_pb2.Task(id=req.task_id, state=pb_enum(types_pb2.TaskState, TaskState.PENDING))
        task.demand.gpus = req.demand.gpus
        task.spec.nodes = req.nodes
        self.state.apply_task(task)
        self._requests[req.task_id] = req

    def unplaced(self, req: Request) -> None:
        """The scheduling pass could not place this pending job (a wake candidate)."""
        task = self.state.tasks.get(req.task_id)
        if task is not None:
            self.manager.unplaced(task)

    def shrunk_for(self, task_id: str, gpus: int) -> None:
        """Elastic jobs gave up ``gpus`` GPUs for a waiting job (a wake candidate, as on the leader)."""
        waiting = self._requests.get(task_id)
        per_gpu = waiting.gpu_mem_per_gpu_bytes if waiting is not None else 0
        self._requests[f"{task_id}/shrunk"] = Request(f"{task_id}/shrunk", Resources(
            gpus=float(gpus), gpu_mem_total_bytes=per_gpu * gpus), gpu_mem_per_gpu_bytes=per_gpu)
        self.manager.shrunk_for(task_id, gpus)

    def placed(self, req: Request, node_indices: Sequence[int]) -> None:
        """A job was placed on these nodes: they are busy and reserved."""
        self.state.forget(req.task_id)
        self._requests.pop(req.task_id, None)
        for i in node_indices:
            self._fit.forget(self.entries[i].node_id)
        self.state.hold(req.task_id, self._holdings(req, node_indices))

    def finished(self, req: Request, node_indices: Sequence[int]) -> None:
        """A job ended: its nodes' reservations are released."""
        for i in node_indices:
            self._fit.forget(self.entries[i].node_id)
        self.state.let_go(req.task_id, [self.entries[i].node_id for i in node_indices])

    def _holdings(self, req: Request, node_indices: Sequence[int]) -> list[types_pb2.NodeAllocation]:
        """A job's share of each of its nodes, as the leader state reserves it (GPUs only: the power
        manager asks whether a node holds anything; the placement engine keeps the exact room)."""
        return [types_pb2.NodeAllocation(node_id=self.entries[i].node_id,
                                         demand=types_pb2.ResourceVector(gpus=req.demand.gpus))
                for i in node_indices]

    # ---- time -------------------------------------------------------------------------------------

    def step(self) -> None:
        """Let finished power changes take effect (agents register or disappear), then step the manager."""
        for action, node_id in self.provider.completed(self._now()):
            entry = self.registry.get(node_id)
            if entry is not None and action == "power_on":
                self.registry.mark_connected(entry)
        _run(self.manager.step())
        for entry in self.entries:
            if entry.connected and power_label(entry.record.power_state) == "off":
                self.registry.disconnect(entry.node_id, entry.stream_id)   # its agent stops with the node

    def next_due(self) -> float | None:
        """When a step would next act on its own (a power-down deadline, a boot completing, a wake timeout)."""
        due = [t for t in (self.manager.next_due(), self.provider.next_due()) if t is not None]
        return min(due, default=None)

    def ready(self, i: int) -> bool:
        """Whether node ``i`` takes work (powered and ready)."""
        return power_label(self.entries[i].record.power_state) == "ready"

    def powered(self, i: int) -> bool:
        """Whether node ``i`` draws power."""
        return self.provider.powered(self.entries[i].node_id)
