"""What one component needs from another that sits above it in the import order.

The components import downwards only: tasks, then dispatch, then scheduler, then qos, then
adaptor (see docs/internals.md, Architecture). Where a lower one calls into a higher one,
it does so through one of these protocols, which the higher component's class satisfies
structurally; ``coordinator.app`` wires the concrete objects in. This module imports no
component.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from common.pb.gptrm.v1 import types_pb2
from coordinator.elastic.rules import ElasticJob, ElasticRange, ElasticSettings, Resize, SpeedupCurve

__all__ = ["AgentSignals", "Elasticity", "Preemption", "RequeuePreempted", "Restarts", "ScaleOut", "WakeupSignal"]


class WakeupSignal(Protocol):
    """Asks the scheduler for a cycle (``coordinator.scheduler.wakeup.Wakeup``)."""

    def set(self) -> None: ...


class AgentSignals(Protocol):
    """Stop, pause and resume a task on its agents (``coordinator.dispatch.dispatcher.Dispatcher``)."""

    def stop(self, task: types_pb2.Task, reason: str) -> bool: ...

    def pause(self, task: types_pb2.Task) -> list[str]: ...

    def resume(self, task: types_pb2.Task) -> list[str]: ...


class ScaleOut(Protocol):
    """The Resource Adaptor's scale-out requests (``coordinator.adaptor.scale_out.ScaleOutRequests``)."""

    def request(self, task_id: str, reason: str, *, policy: str) -> bool: ...

    def forget(self, task_id: str) -> None: ...


class Restarts(Protocol):
    """The QoS Manager's restart policy for ended tasks (``coordinator.qos.restart.RestartPolicy``)."""

    async def after_end(self, task: types_pb2.Task) -> types_pb2.Task: ...

    async def fail(self, task: types_pb2.Task, reason: str) -> types_pb2.Task: ...

    async def place_again(self, task: types_pb2.Task, reason: str) -> types_pb2.Task: ...

    async def again(self, task: types_pb2.Task) -> types_pb2.Task: ...


class RequeuePreempted(Protocol):
    """Puts a preempted task whose parts all ended back in the queue (``coordinator.qos.preemption.Preemptor``)."""

    async def victim_stopped(self, task: types_pb2.Task) -> types_pb2.Task: ...


class Preemption(Protocol):
    """The QoS Manager's preemption as a scheduling cycle uses it (``coordinator.qos.preemption.Preemptor``)."""

    def schedulable(self, pending: Sequence[types_pb2.Task]) -> list[types_pb2.Task]: ...

    async def after_rejections(self, rejected: Sequence[types_pb2.Task], policy: str, threshold: float,
                               mode: str = ...) -> bool: ...

    async def reclaim(self, victims: Sequence[types_pb2.Task], queue: str) -> list[str]: ...


class Elasticity(Protocol):
    """The elastic allocator as a scheduling cycle uses it (``coordinator.elastic.allocator.ElasticAllocator``)."""

    @property
    def settings(self) -> ElasticSettings: ...

    def range(self, task: types_pb2.Task) -> ElasticRange | None: ...

    def curve(self, task: types_pb2.Task) -> SpeedupCurve: ...

    def wish(self, task: types_pb2.Task, rng: ElasticRange) -> int: ...

    def jobs(self) -> list[ElasticJob]: ...

    def observe(self) -> None: ...

    async def resize(self, decisions: Sequence[Resize], *, fault_move: bool = False) -> list[str]: ...

    def note_blocked(self, reasons: Mapping[str, str]) -> None: ...
