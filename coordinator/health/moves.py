"""Work moves off a GPU that turns unhealthy.

The single trigger: a placed task holds a GPU that its node's record fences
(``NodeRecord.gpu_fences``, written by the leader from the agents' health reports and kept in etcd, so a
new leader sees the same fences; asked of :meth:`~coordinator.health.watch.GpuHealthWatch.fenced_holders`).
Each pass (:meth:`GpuMoves.step`, run at the start of every scheduling
cycle, so within a second of the fence) finds such tasks and moves them:

- a task (a gang as a whole: every part) goes ``RUNNING → PREEMPTED`` (the fenced transition preemption
  uses, which keeps its allocation until it stopped), with ``gpu_fault_moves`` + 1 and the reason
  ("moved off n1 GPU 3: xid 79"), and gets a StopTask carrying its checkpoint signal; its agents send the
  signal, wait its stop grace and stop it; when every part reported it ended it goes back to ``PENDING``
  with its reservations released (:mod:`coordinator.dispatch.reconcile`, the preemption path) and is placed
  anew by the next cycle, never on a fenced GPU. Neither ``restarts`` nor ``preemptions`` count it, so it
  never uses up its restart policy's ``max_restarts``;
- an elastic task that can still run without the fenced GPUs shrinks instead (a resize to the largest size
  of its range that leaves them out, :meth:`~coordinator.elastic.allocator.ElasticAllocator.resize`, also counted in
  ``gpu_fault_moves``); one already at its minimum is requeued as above.

A task whose program dies of the fault after the GPU was fenced but before its move reached it ends FAILED;
the restart policy hands it here first (:meth:`GpuMoves.after_failure`), and it is requeued as a move, not
a restart, whatever its policy.

Each move is a ``health`` event and a ``task_moved_off_gpu`` log line. A task already being moved is
PREEMPTED and is not looked at again, so the pass is idempotent, and a new leader's first cycle carries on
what the old one could not finish (its agents' re-registration re-sends the stop of a PREEMPTED task).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.errors import GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.dispatch.dispatcher import Dispatcher
from coordinator.elastic.rules import Resize
from coordinator.elastic.spec import elastic_gpus
from coordinator.events import EventBus
from coordinator.health.rules import fenced
from coordinator.monitor.nodes import NodeRegistry
from coordinator.ports import Elasticity
from coordinator.profiler.qos_spec import DEFAULT_CHECKPOINT_SIGNAL

if TYPE_CHECKING:
    from coordinator.tasks import TaskTable  # type only: the task table loads etcd

__all__ = ["MOVABLE_STATES", "FencedGpu", "GpuMoves", "Holders", "move_reason"]

MOVABLE_STATES = (TaskState.RUNNING, TaskState.PAUSED)
"""States in which a task on a fenced GPU is moved (a task placed but not yet running is moved once it runs;
a PREEMPTED one is already on its way out)."""

Holders = Callable[[], Iterable[tuple[str, str, types_pb2.GpuFence]]]
"""``(task id, node id, fence)`` for every unfinished task on a fenced GPU
(:meth:`coordinator.health.watch.GpuHealthWatch.fenced_holders`)."""


@dataclass(frozen=True, slots=True)
class FencedGpu:
    """A fenced GPU a task holds.

    :param node_id: its node.
    :param gpu_index: its index there.
    :param reason: the fence's reason ("xid 79").
    """

    node_id: str
    gpu_index: int
    reason: str


def move_reason(held: Iterable[FencedGpu]) -> str:
    """Why a task is moved, in words: ``moved off n1 GPU 3: xid 79`` (several GPUs separated by ``;``)."""
    return "moved off " + "; ".join(f"{g.node_id} GPU {g.gpu_index}: {g.reason}" for g in held)


class GpuMoves:
    """Moves tasks off fenced GPUs (see the module's docstring).

    Example::

        moved = await moves.step()     # ids of the tasks whose move started in this pass

    :param tasks: the task table (state changes go through it).
    :param registry: the node table (each node's record, with its fences).
    :param holders: every unfinished task on a fenced GPU, with the node and the fence (the trigger).
    :param dispatcher: stop decisions with the checkpoint signal.
    :param events: the cluster event log (``health`` events).
    :param elastic: the elastic allocator (None: elastic tasks are requeued like the others).
    """

    def __init__(self, tasks: TaskTable, registry: NodeRegistry, holders: Holders, dispatcher: Dispatcher,
                 events: EventBus, elastic: Elasticity | None = None) -> None:
        self._tasks, self._registry, self._holders = tasks, registry, holders
        self._dispatcher, self._events, self._elastic = dispatcher, events, elastic
        self._log = get_logger("health")

    def holding_fenced(self) -> list[tuple[types_pb2.Task, list[FencedGpu]]]:
        """The movable tasks that hold a fenced GPU, each with those GPUs (tasks in the order of ``holders``)."""
        held: dict[str, list[FencedGpu]] = {}
        for task_id, node_id, fence in self._holders():
            held.setdefault(task_id, []).append(FencedGpu(node_id, fence.gpu_index, fence.reason or "unhealthy"))
        out = []
        for task_id, gpus in held.items():
            task = self._tasks.find(task_id)
            if task is not None and task.state in MOVABLE_STATES:
                out.append((task, gpus))
        return out

    async def step(self) -> list[str]:
        """Start moving every movable task that holds a fenced GPU; the ids whose move started."""
        moved: list[str] = []
        for task, held in self.holding_fenced():
            if await self._move(task, held):
                moved.append(task.id)
        return moved

    def fenced_held(self, task: types_pb2.Task) -> list[FencedGpu]:
        """The fenced GPUs the task's allocation holds (whatever its state), node by node in rank order."""
        out: list[FencedGpu] = []
        for na in task.allocation.nodes:
            entry = self._registry.get(na.node_id)
            fences = fenced(entry.record) if entry is not None else {}
            out += [FencedGpu(na.node_id, i, fences[i].reason or "unhealthy") for i in na.gpu_indices if i in fences]
        return out

    def requeues(self, task: types_pb2.Task) -> bool:
        """Whether :meth:`after_failure` puts this task back in the queue: it ended FAILED, not cancelled, holding
        a fenced GPU."""
        return task.state == TaskState.FAILED and not task.cancel_requested and bool(self.fenced_held(task))

    async def after_failure(self, task: types_pb2.Task) -> types_pb2.Task | None:
        """A task that ended FAILED holding a fenced GPU (its program died of the fault before its move reached
        it): back in the queue as a move, whatever its restart policy, with ``gpu_fault_moves`` + 1 and
        ``restarts`` unchanged. None (the restart policy decides) when it held no fenced GPU, did not fail, or
        was cancelled."""
        if not self.requeues(task):
            return None
        held = self.fenced_held(task)
        reason = move_reason(held)
        stored = await self._tasks.transition(task.id, TaskState.PENDING,
                                              f"{reason}; it failed there and waits in its queue to run again",
                                              gpu_fault_moves=task.gpu_fault_moves + 1)
        self._moved(task, held, reason, "failed on a fenced GPU and is requeued", "requeue")
        return stored

    async def _move(self, task: types_pb2.Task, held: list[FencedGpu]) -> bool:
        reason = move_reason(held)
        shrink = self._shrink_to(task, held)
        if shrink is not None:
            size = elastic_gpus(task)
            assert self._elastic is not None
            curve = self._elastic.curve(task)
            now = curve.speedup(size)
            gain = curve.speedup(shrink) / now if now > 0 else 1.0
            done = await self._elastic.resize([Resize(task.id, size, shrink, reason, gain)], fault_move=True)
            if not done:
                return False
            self._moved(task, held, reason, f"shrinks {size} → {shrink} GPU(s)", "shrink")
            return True
        try:
            stored = await self._tasks.transition(task.id, TaskState.PREEMPTED, reason,
                                                  gpu_fault_moves=task.gpu_fault_moves + 1)
        except GptrmError as e:   # it changed meanwhile (ended, or a lost compare): the next pass looks again
            self._log.info("gpu_move_skipped", task_id=task.id, reason=str(e))
            return False
        self._dispatcher.stop(stored, reason, checkpoint_signal=stored.spec.checkpoint_signal or
                              DEFAULT_CHECKPOINT_SIGNAL)
        self._moved(task, held, reason, "is stopped and requeued", "requeue")
        return True

    def _shrink_to(self, task: types_pb2.Task, held: list[FencedGpu]) -> int | None:
        """The size an elastic task shrinks to, leaving the fenced GPUs out (None: not elastic, or it cannot run
        smaller: it is requeued)."""
        if self._elastic is None or not task.spec.HasField("elastic"):
            return None
        rng = self._elastic.range(task)
        if rng is None:
            return None
        size = elastic_gpus(task)
        left = size - len(held)
        if left < rng.minimum:
            return None
        to = rng.clamp(left)
        return to if to < size else None

    def _moved(self, task: types_pb2.Task, held: list[FencedGpu], reason: str, what: str, action: str) -> None:
        nodes = sorted({g.node_id for g in held})
        gpus = ",".join(f"{g.node_id}:{g.gpu_index}" for g in held)
        self._log.info("task_moved_off_gpu", task_id=task.id, gpus=gpus, action=action, reason=reason,
                       gpu_fault_moves=task.gpu_fault_moves + 1)
        self._events.publish("health", f"task {task.id} {what}: {reason}", node_id=nodes[0], task_id=task.id,
                             gpus=gpus, action=action, reason=reason)
