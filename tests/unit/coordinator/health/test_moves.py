"""Work moved off fenced GPUs (coordinator/health/moves.py): which tasks move, how (requeued with their
checkpoint signal, or an elastic shrink), what is counted and said, and that a second pass changes nothing.

The trigger is the real health watch's query over the real node table and leader state; the task table's
writes and the dispatcher are in-memory stand-ins (the real ones need etcd and agent streams; the end-to-end
path with real processes is tests/integration/test_gpu_health.py); the elastic allocator is the real one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from common.errors import IllegalTransition
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.elastic.allocator import ElasticAllocator
from coordinator.elastic.rules import ElasticSettings
from coordinator.events import EventBus
from coordinator.health.moves import FencedGpu, GpuMoves, move_reason
from coordinator.health.watch import GpuHealthWatch
from coordinator.monitor.nodes import NodeRegistry
from coordinator.monitor.resources import ResourceMonitor
from coordinator.qos.restart import RestartPolicy
from coordinator.state import LeaderState

NOW = 10_000.0


class _Tasks:
    """The task table's reads and its fenced transition, in memory, over the real leader state."""

    def __init__(self, state: LeaderState) -> None:
        self.state = state
        self.transitions: list[tuple[str, TaskState, str, dict[str, Any]]] = []

    @property
    def by_id(self) -> Mapping[str, types_pb2.Task]:
        return self.state.tasks

    def values(self) -> list[types_pb2.Task]:
        return list(self.state.tasks.values())

    def find(self, task_id: str) -> types_pb2.Task | None:
        return self.state.tasks.get(task_id)

    def live_elastic(self) -> list[types_pb2.Task]:
        return list(self.state.live_elastic.values())

    async def transition(self, task_id: str, state: TaskState, reason: str = "", **updates: Any) -> types_pb2.Task:
        self.transitions.append((task_id, state, reason, updates))
        stored = types_pb2.Task()
        stored.CopyFrom(self.state.tasks[task_id])
        stored.state = int(state)  # type: ignore[assignment]
        stored.reason = reason
        stored.revision += 1
        for name, value in updates.items():
            if isinstance(value, types_pb2.ElasticStatus):
                stored.elastic.CopyFrom(value)
            else:
                setattr(stored, name, value)
        self.state.apply_task(stored)
        return stored


class _Dispatcher:
    def __init__(self) -> None:
        self.stops: list[tuple[str, str, str, tuple[str, ...]]] = []

    def stop(self, task: types_pb2.Task, reason: str, *, checkpoint_signal: str = "") -> bool:
        self.stops.append((task.id, reason, checkpoint_signal, tuple(na.node_id for na in task.allocation.nodes)))
        return True


def _record(node_id: str, fences: dict[int, str]) -> types_pb2.NodeRecord:
    """An 8-GPU node's record with these GPUs fenced (index → reason)."""
    record = types_pb2.NodeRecord()
    record.inventory.node_id = node_id
    for i in range(8):
        record.inventory.gpus.add(index=i, uuid=f"GPU-{node_id}-{i}")
    for i, reason in fences.items():
        record.gpu_fences.add(gpu_index=i, reason=reason, action=types_pb2.GPU_HEALTH_ACTION_REPLACE)
    return record


def _task(task_id: str, *nodes: tuple[str, tuple[int, ...]], state: Any = types_pb2.TASK_STATE_RUNNING,
          signal: str = "", elastic: tuple[int, int] | None = None) -> types_pb2.Task:
    t = types_pb2.Task(id=task_id, state=state, submit_unix_s=NOW - 200, restarts=2, revision=1)
    t.spec.kind = types_pb2.TASK_KIND_TRAINING
    t.spec.checkpoint_signal = signal
    if elastic is not None:
        t.spec.elastic.min_gpus, t.spec.elastic.max_gpus = elastic
    for node_id, gpus in nodes:
        t.allocation.nodes.add(node_id=node_id, gpu_indices=list(gpus))
    t.history.add(state=types_pb2.TASK_STATE_RUNNING, time_unix_s=NOW - 100)
    return t


def _metrics() -> SimpleNamespace:
    r = CollectorRegistry()
    return SimpleNamespace(registry=r, resizes=Counter("r", "r", ["direction"], registry=r),
                           elastic_gpus=Gauge("g", "g", ["part"], registry=r),
                           elastic_tasks=Gauge("t", "t", registry=r))


def _moves(fences: dict[str, dict[int, str]], *tasks: types_pb2.Task,
           elastic: bool = True) -> tuple[GpuMoves, _Tasks, _Dispatcher, EventBus]:
    """The mover over a leader state holding these nodes (node → fenced GPUs) and placed tasks; the trigger is the
    health watch's own query."""
    state = LeaderState(NodeRegistry(heartbeat_interval_s=1.0, lost_grace_s=10.0))
    state.adopt({}, {node_id: _record(node_id, fenced) for node_id, fenced in fences.items()})
    for t in tasks:
        state.apply_placement(t)
    events = EventBus(now=lambda: NOW)
    watch = GpuHealthWatch(state._registry, state, None, None, None, events)  # type: ignore[arg-type]
    table, dispatcher = _Tasks(state), _Dispatcher()
    allocator = ElasticAllocator(table, dispatcher, ResourceMonitor(60, 1, now=lambda: NOW),  # type: ignore[arg-type]
                                 events, _metrics(), ElasticSettings(),  # type: ignore[arg-type]
                                 now=lambda: NOW) if elastic else None
    moves = GpuMoves(table, state._registry, watch.fenced_holders, dispatcher, events,  # type: ignore[arg-type]
                     allocator)
    return moves, table, dispatcher, events


def _step(moves: GpuMoves) -> list[str]:
    return asyncio.run(moves.step())


class TestTrigger:
    def test_the_reason_names_each_fenced_gpu_held(self) -> None:
        assert move_reason([FencedGpu("n1", 3, "xid 79")]) == "moved off n1 GPU 3: xid 79"
        assert move_reason([FencedGpu("n1", 3, "xid 79"), FencedGpu("n2", 0, "gpu lost")]) == \
            "moved off n1 GPU 3: xid 79; n2 GPU 0: gpu lost"

    def test_nothing_moves_without_a_fence_on_a_gpu_it_holds(self) -> None:
        """A fence on another GPU of the node, or none at all: the task keeps running."""
        moves, table, dispatcher, events = _moves({"n1": {7: "xid 79"}, "n2": {}},
                                                  _task("a", ("n1", (0, 1, 2, 3))), _task("b", ("n2", (0,))))
        assert _step(moves) == []
        assert table.transitions == [] and dispatcher.stops == [] and events.recent(10) == []

    def test_several_fenced_gpus_of_one_task_are_one_move(self) -> None:
        moves, table, dispatcher, _e = _moves({"n1": {1: "xid 79", 3: "xid 48"}}, _task("a", ("n1", (0, 1, 2, 3))))
        assert _step(moves) == ["a"]
        assert [t[2] for t in table.transitions] == ["moved off n1 GPU 1: xid 79; n1 GPU 3: xid 48"]
        assert len(dispatcher.stops) == 1


class TestRequeue:
    def test_stopped_with_its_checkpoint_signal_and_not_counted_as_a_restart(self) -> None:
        moves, table, dispatcher, events = _moves({"n1": {3: "xid 79"}},
                                                  _task("a", ("n1", (0, 1, 2, 3)), signal="SIGTERM"))
        assert _step(moves) == ["a"]
        [(task_id, state, reason, updates)] = table.transitions
        assert (task_id, state, reason) == ("a", TaskState.PREEMPTED, "moved off n1 GPU 3: xid 79")
        assert updates == {"gpu_fault_moves": 1}       # neither restarts nor preemptions
        stored = table.by_id["a"]
        assert stored.restarts == 2 and stored.preemptions == 0 and stored.gpu_fault_moves == 1
        assert dispatcher.stops == [("a", "moved off n1 GPU 3: xid 79", "SIGTERM", ("n1",))]
        [event] = events.recent(10)
        assert event.kind == "health" and event.task_id == "a" and event.node_id == "n1"
        assert "moved off n1 GPU 3: xid 79" in event.message and event.fields["action"] == "requeue"

    def test_default_checkpoint_signal(self) -> None:
        moves, _table, dispatcher, _events = _moves({"n1": {0: "xid 79"}}, _task("a", ("n1", (0,))))
        _step(moves)
        assert dispatcher.stops[0][2] == "SIGUSR1"

    def test_a_task_being_moved_is_not_signalled_twice(self) -> None:
        """The second pass (or a new leader's first) finds the task PREEMPTED: nothing more is sent."""
        moves, table, dispatcher, _events = _moves({"n1": {3: "xid 79"}}, _task("a", ("n1", (3,))))
        assert _step(moves) == ["a"]
        assert _step(moves) == []
        assert len(table.transitions) == 1 and len(dispatcher.stops) == 1

    def test_placed_but_not_running_tasks_wait_until_they_run(self) -> None:
        moves, table, _d, _e = _moves({"n1": {2: "xid 79", 3: "xid 79"}},
                                      _task("a", ("n1", (3,)), state=types_pb2.TASK_STATE_STARTING),
                                      _task("b", ("n1", (2,)), state=types_pb2.TASK_STATE_PREEMPTED))
        assert _step(moves) == [] and table.transitions == []

    def test_a_paused_task_moves_too(self) -> None:
        moves, _t, _d, _e = _moves({"n1": {3: "xid 79"}},
                                   _task("a", ("n1", (3,)), state=types_pb2.TASK_STATE_PAUSED))
        assert _step(moves) == ["a"]

    def test_a_gang_is_stopped_whole(self) -> None:
        """One part's GPU fails: the whole task is requeued and every node of it told to stop."""
        moves, table, dispatcher, _e = _moves({"n1": {}, "n2": {1: "xid 79"}},
                                              _task("g", ("n1", (0, 1)), ("n2", (0, 1))))
        assert _step(moves) == ["g"]
        assert [t[1] for t in table.transitions] == [TaskState.PREEMPTED]
        assert dispatcher.stops == [("g", "moved off n2 GPU 1: xid 79", "SIGUSR1", ("n1", "n2"))]

    def test_a_lost_compare_is_left_for_the_next_pass(self) -> None:
        moves, table, dispatcher, _e = _moves({"n1": {3: "xid 79"}}, _task("a", ("n1", (3,))))

        async def conflict(*_args: Any, **_kw: Any) -> types_pb2.Task:
            raise IllegalTransition("task a changed")

        table.transition = conflict  # type: ignore[method-assign]
        assert _step(moves) == [] and dispatcher.stops == []


class TestElastic:
    def test_shrinks_off_the_gpu_when_it_can_run_smaller(self) -> None:
        moves, table, dispatcher, events = _moves({"n1": {2: "xid 79"}},
                                                  _task("e", ("n1", (0, 1, 2, 3)), elastic=(2, 4)))
        assert _step(moves) == ["e"]
        [(_id, state, reason, updates)] = table.transitions
        assert state == TaskState.PREEMPTED and reason == "resizing: moved off n1 GPU 2: xid 79"
        assert updates["gpu_fault_moves"] == 1 and updates["elastic"].target_gpus == 3
        assert dispatcher.stops[0][2] == "SIGUSR1"
        assert table.by_id["e"].restarts == 2
        assert [e.kind for e in events.recent(10)] == ["resize", "health"]
        assert events.recent(10)[-1].fields["action"] == "shrink"

    def test_at_its_minimum_it_is_requeued(self) -> None:
        moves, table, _d, events = _moves({"n1": {1: "xid 79"}},
                                          _task("e", ("n1", (0, 1)), elastic=(2, 4)))
        assert _step(moves) == ["e"]
        [(_id, state, reason, updates)] = table.transitions
        assert state == TaskState.PREEMPTED and reason == "moved off n1 GPU 1: xid 79"
        assert updates == {"gpu_fault_moves": 1}
        assert events.recent(10)[-1].fields["action"] == "requeue"

    def test_without_the_allocator_it_is_requeued(self) -> None:
        moves, table, _d, _e = _moves({"n1": {2: "xid 79"}},
                                      _task("e", ("n1", (0, 1, 2, 3)), elastic=(2, 4)), elastic=False)
        _step(moves)
        assert table.transitions[0][3] == {"gpu_fault_moves": 1}


class TestFailedOnAFencedGpu:
    """The program died of the fault before its move reached it: the restart policy asks the mover first."""

    def _ended(self, fences: dict[int, str], state: Any = types_pb2.TASK_STATE_FAILED,
               cancelled: bool = False) -> tuple[types_pb2.Task, _Tasks, EventBus]:
        moves, table, _d, events = _moves({"n1": fences}, _task("a", ("n1", (2, 3))))
        ended = asyncio.run(table.transition("a", TaskState(state), "exit 1", cancel_requested=cancelled))
        policy = RestartPolicy(table, now=lambda: NOW, fault_move=moves.after_failure)  # type: ignore[arg-type]
        return asyncio.run(policy.after_end(ended)), table, events

    def test_requeued_as_a_move_whatever_its_policy(self) -> None:
        task, _table, events = self._ended({3: "xid 79"})
        assert task.state == TaskState.PENDING and task.gpu_fault_moves == 1 and task.restarts == 2
        assert task.reason.startswith("moved off n1 GPU 3: xid 79; it failed there")
        assert events.recent(10)[-1].kind == "health" and events.recent(10)[-1].fields["action"] == "requeue"

    def test_without_a_fence_its_restart_policy_decides(self) -> None:
        task, _table, _events = self._ended({7: "xid 79"})
        assert task.state == TaskState.FAILED and task.gpu_fault_moves == 0    # restart policy never (the default)

    def test_an_ended_task_or_a_cancelled_one_stays_ended(self) -> None:
        for kwargs in ({"state": types_pb2.TASK_STATE_SUCCEEDED}, {"cancelled": True}):
            task, _table, _events = self._ended({3: "xid 79"}, **kwargs)
            assert task.state != TaskState.PENDING and task.gpu_fault_moves == 0

