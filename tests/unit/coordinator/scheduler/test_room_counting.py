"""Task uids and master ports as the scheduler counts them (coordinator/scheduler/snapshot.py, cycle.py,
coordinator/dispatch/launch.py): a node whose agent has no free task uid is not chosen; an older agent
reporting nothing sets no limit."""

from __future__ import annotations

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.dispatch.launch import PortBook
from coordinator.domain import Placement
from coordinator.monitor.nodes import NodeRegistry
from coordinator.monitor.power_model import PowerModel
from coordinator.scheduler.placement import PlacementEngine
from coordinator.scheduler.snapshot import SnapshotBuilder
from coordinator.state import LeaderState
from tests.helpers.builders import connected_registry, make_request


def _running(task_id: str, node_id: str, *, run_as_user: str = "") -> types_pb2.Task:
    task = types_pb2.Task(id=task_id, state=int(TaskState.RUNNING),
                          spec=types_pb2.TaskSpec(name=task_id, run_as_user=run_as_user))
    task.allocation.nodes.add(node_id=node_id, demand=types_pb2.ResourceVector(cpu_cores=0.1))
    return task


def _place(registry: NodeRegistry, tasks: list[types_pb2.Task]) -> tuple[SnapshotBuilder, str]:
    state = LeaderState(registry)
    for task in tasks:
        state.apply_placement(task)   # the leader's record of what each node holds
    builder = SnapshotBuilder(PowerModel())
    snapshot = builder.snapshot(tasks, registry)
    decision = PlacementEngine.from_name(snapshot, "first-fit", threshold=1.0).place(make_request("new", cpu=0.1))
    assert isinstance(decision, Placement), decision
    return builder, decision.node_ids[0]


class TestUidRoom:
    def test_a_node_without_a_free_task_uid_is_not_chosen(self) -> None:
        """n1 (first in order) reports room for 2 tasks with a uid of their own and holds 2: placement goes to n2."""
        registry = connected_registry("n1", "n2")
        registry.get("n1").task_uid_room = 2   # type: ignore[union-attr]
        builder, node = _place(registry, [_running("a", "n1"), _running("b", "n1")])
        assert node == "n2"
        assert builder.uid_room == {"n1": 0}

    def test_room_left_and_tasks_without_an_own_uid(self) -> None:
        """A task running as a named user takes no uid of the range; with room left, n1 is chosen."""
        registry = connected_registry("n1", "n2")
        registry.get("n1").task_uid_room = 2   # type: ignore[union-attr]
        builder, node = _place(registry, [_running("a", "n1"), _running("b", "n1", run_as_user="train")])
        assert node == "n1" and builder.uid_room == {"n1": 1}

    def test_an_agent_reporting_nothing_has_no_limit(self) -> None:
        """An older agent (no task_uid_room): unknown, no limit."""
        registry = connected_registry("n1", "n2")
        builder, node = _place(registry, [_running(f"t{i}", "n1") for i in range(40)])
        assert node == "n1" and builder.uid_room == {}


class TestPortBook:
    def test_refused_ports_are_not_handed_out(self) -> None:
        """A port a start found held by something else is skipped on that node only; taken_here counts what
        the book handed out on a node."""
        book = PortBook.of([], refused={"n1": {30000}})
        assert book.take("n1", 30000, 30002) == 30001
        assert book.take("n2", 30000, 30002) == 30000
        assert (book.taken_here("n1"), book.taken_here("n3")) == (1, 0)
