"""The leader's state: one owner, changed only by applying stored records, read through read-only views."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from common.errors import NotFound
from common.pb.gptrm.v1 import types_pb2
from common.pbenum import pb_enum
from common.types import TERMINAL_STATES, TaskState
from coordinator.monitor.nodes import NodeRegistry
from coordinator.state import LeaderState
from coordinator.tasks import TaskTable

COORDINATOR = Path(__file__).resolve().parents[3] / "coordinator"


def _node(node_id: str, gpus: int = 4) -> types_pb2.NodeRecord:
    rec = types_pb2.NodeRecord()
    rec.inventory.node_id = node_id
    for i in range(gpus):
        rec.inventory.gpus.add(index=i, uuid=f"GPU-{node_id}-{i}")
    return rec


def _placed(task_id: str, node_id: str, gpus: list[int], state: TaskState = TaskState.RUNNING) -> types_pb2.Task:
    task = types_pb2.Task(id=task_id, state=pb_enum(types_pb2.TaskState, state))
    task.allocation.nodes.add(node_id=node_id, gpu_indices=gpus, gpu_share=1.0,
                              demand=types_pb2.ResourceVector(gpus=len(gpus), cpu_cores=2.0))
    return task


@pytest.fixture
def state() -> LeaderState:
    registry = NodeRegistry(heartbeat_interval_s=1.0, lost_grace_s=10.0)
    state = LeaderState(registry)
    state.adopt({}, {"n1": _node("n1"), "n2": _node("n2")})
    return state


def _entry(state: LeaderState, node_id: str):  # type: ignore[no-untyped-def]
    entry = state._registry.get(node_id)
    assert entry is not None
    return entry


class TestHoldings:
    def test_a_committed_placement_reserves_its_gpus_and_a_release_frees_them(self, state: LeaderState) -> None:
        task = _placed("t1", "n1", [0, 1])
        state.apply_placement(task)
        n1 = _entry(state, "n1")
        assert n1.task_ids == {"t1"} and n1.holds_tasks
        assert n1.reservation.gpu_indices == (0, 1) and n1.reserved.gpus == 2 and n1.reserved.cpu_cores == 2.0
        assert not n1.record.reserved_gpu_indices   # the node's record is never changed to follow a placement
        state.apply_release(task)
        assert not n1.task_ids and not n1.reservation.gpu_indices and n1.reserved.gpus == 0

    def test_applying_the_same_placement_twice_reserves_once(self, state: LeaderState) -> None:
        task = _placed("t1", "n1", [2])
        state.apply_placement(task)
        state.apply_placement(task)
        assert _entry(state, "n1").reservation.gpu_indices == (2,)

    def test_adopt_derives_holdings_from_the_stored_allocations(self, state: LeaderState) -> None:
        state.apply_placement(_placed("old", "n2", [0]))
        running, done = _placed("r", "n1", [0]), _placed("d", "n1", [1], TaskState.SUCCEEDED)
        nodes = {"n1": _node("n1"), "n2": _node("n2")}
        state.adopt({"r": running, "d": done}, nodes, {"r": running.allocation})
        assert _entry(state, "n1").task_ids == {"r"} and not _entry(state, "n2").task_ids
        assert _entry(state, "n1").reservation.gpu_indices == (0,)
        assert set(state.tasks) == {"r", "d"}

    def test_adopt_ignores_an_older_layouts_reservations_on_node_records(self, state: LeaderState) -> None:
        """A node record written before reservations were derived carries totals of its own (here: GPUs 0-3 of n2
        and GPU 2 of n1, whose allocations are gone): they are not read; the allocations alone say what is held."""
        running = _placed("r", "n1", [0])
        nodes = {"n1": _node("n1"), "n2": _node("n2")}
        nodes["n1"].reserved_gpu_indices.extend([0, 2])
        nodes["n1"].reserved.gpus = 2
        nodes["n2"].reserved_gpu_indices.extend([0, 1, 2, 3])
        nodes["n2"].reserved.gpus = 4
        state.adopt({"r": running}, nodes, {"r": running.allocation})
        assert _entry(state, "n1").reservation.gpu_indices == (0,) and _entry(state, "n1").reserved.gpus == 1
        assert _entry(state, "n2").reservation.gpu_indices == () and not _entry(state, "n2").holds_tasks
        view = _entry(state, "n1").stored_view()   # what the API shows: the derived holding
        assert list(view.reserved_gpu_indices) == [0] and view.reserved.gpus == 1

    def test_a_partial_let_go_keeps_the_other_nodes(self, state: LeaderState) -> None:
        task = _placed("g", "n1", [0])
        task.allocation.nodes.add(node_id="n2", gpu_indices=[1], gpu_share=1.0, demand=types_pb2.ResourceVector(gpus=1))
        state.hold("g", task.allocation.nodes)
        state.let_go("g", ["n1"])
        assert not _entry(state, "n1").holds_tasks and _entry(state, "n2").task_ids == {"g"}
        state.let_go("g")
        assert not _entry(state, "n2").holds_tasks and _entry(state, "n2").reservation.gpu_indices == ()

    def test_task_ids_cannot_be_changed_by_a_reader(self, state: LeaderState) -> None:
        state.apply_placement(_placed("t1", "n1", [0]))
        with pytest.raises(AttributeError):
            _entry(state, "n1").task_ids.add("x")  # type: ignore[attr-defined]


class TestRecords:
    def test_views_are_read_only_and_live(self, state: LeaderState) -> None:
        with pytest.raises(TypeError):
            state.tasks["x"] = types_pb2.Task(id="x")  # type: ignore[index]
        with pytest.raises(TypeError):
            state.services["s"] = types_pb2.Service(id="s")  # type: ignore[index]
        view = state.tasks
        state.apply_task(types_pb2.Task(id="x"))
        state.apply_service(types_pb2.Service(id="s"))
        assert "x" in view and "s" in state.services

    def test_a_noted_reason_replaces_the_record_and_never_changes_the_one_handed_out(self, state: LeaderState) -> None:
        state.apply_task(types_pb2.Task(id="p", reason="waiting for the scheduler"))
        before = state.tasks["p"]
        state.note_reason("p", "no node has 8 free GPUs")
        assert before.reason == "waiting for the scheduler"
        assert state.tasks["p"].reason == "no node has 8 free GPUs" and state.tasks["p"] is not before

    def test_forget_tells_the_per_task_readings(self) -> None:
        forgotten: list[str] = []
        state = LeaderState(NodeRegistry(1.0, 10.0), on_forget=forgotten.append)
        state.apply_task(types_pb2.Task(id="a"))
        state.forget("a")
        state.forget("never-known")
        assert forgotten == ["a"] and "a" not in state.tasks

    def test_a_stored_node_record_keeps_the_live_inventory_and_the_holdings(self, state: LeaderState) -> None:
        state.apply_placement(_placed("t1", "n1", [3]))
        stored = _node("n1", gpus=1)          # a stale inventory, no reservations: as a writer stored it
        stored.cordoned, stored.power_reason = True, "maintenance"
        state.apply_node(stored)
        n1 = _entry(state, "n1")
        assert n1.record.cordoned and n1.record.power_reason == "maintenance"
        assert len(n1.inventory.gpus) == 4 and n1.reservation.gpu_indices == (3,) and n1.task_ids == {"t1"}
        assert n1.state.label == "not-ready"   # derived again at once (no stream in this test)


class TestTaskTableReads:
    def test_find_get_and_values(self, state: LeaderState) -> None:
        table = TaskTable(None, None, state, *[None] * 7)  # type: ignore[arg-type]
        state.apply_task(types_pb2.Task(id="a"))
        values = table.values()
        assert table.find("a") is state.tasks["a"] and table.find("zz") is None
        with pytest.raises(NotFound):
            table.get("zz")
        state.forget("a")
        assert [t.id for t in values] == ["a"] and table.values() == []

    def test_since_reads_the_unfinished_the_recently_ended_and_the_named(self, state: LeaderState) -> None:
        table = TaskTable(None, None, state, *[None] * 7)  # type: ignore[arg-type]
        state.adopt({"old": _ended("old", 10.0), "marked": _ended("marked", 20.0), "recent": _ended("recent", 100.0),
                     "live": _task("live", 5.0)}, {})
        assert sorted(t.id for t in table.since(50.0)) == ["live", "recent"]
        assert sorted(t.id for t in table.since(50.0, ["marked", "gone"])) == ["live", "marked", "recent"]
        assert table.finished_count() == 3
        assert [t.id for t in table.ended_in_order()] == ["old", "marked", "recent"]


def _ended(task_id: str, at: float, state: TaskState = TaskState.SUCCEEDED) -> types_pb2.Task:
    task = _task(task_id, 1.0, state)
    task.history.add(state=pb_enum(types_pb2.TaskState, state), time_unix_s=at)
    return task


def test_counts_by_state_follow_every_change(state: LeaderState) -> None:
    """The counts by state are kept as records change, and equal a count over every task at each step."""
    def counted() -> dict[str, int]:
        out: dict[str, int] = {}
        for t in state.tasks.values():
            label = TaskState(t.state).label
            out[label] = out.get(label, 0) + 1
        return out

    state.adopt({"a": _task("a", 1.0), "b": _ended("b", 5.0)}, {})
    assert state.counts() == counted() == {"pending": 1, "succeeded": 1}
    state.apply_placement(_placed("a", "n1", [0]))
    state.note_reason("a", "placed")
    state.apply_task(_task("c", 2.0))
    assert state.counts() == counted() == {"running": 1, "succeeded": 1, "pending": 1}
    state.apply_task(_ended("a", 9.0, TaskState.FAILED))
    state.forget("b")
    assert state.counts() == counted() == {"failed": 1, "pending": 1}
    assert (state.count_in(TaskState.FAILED), state.count_in(TaskState.PENDING), state.count_in(TaskState.RUNNING),
            state.count_in(TaskState.SUCCEEDED)) == (1, 1, 0, 0)


class TestEndedIndex:
    def test_the_end_order_follows_every_change(self, state: LeaderState) -> None:
        """Adopted, ended, ended again (a re-read with a later end), forgotten: the index holds exactly the finished
        tasks, by end time, and ``ended_since`` reads from a time on."""
        state.adopt({"a": _ended("a", 30.0), "b": _ended("b", 10.0), "p": _task("p", 1.0)}, {})
        assert [t.id for t in state.ended_in_order()] == ["b", "a"] and state.finished_count == 2
        state.apply_task(_ended("p", 20.0, TaskState.FAILED))
        assert [t.id for t in state.ended_in_order()] == ["b", "p", "a"]
        state.apply_task(_ended("b", 40.0))
        assert [t.id for t in state.ended_in_order()] == ["p", "a", "b"]
        assert [t.id for t in state.ended_since(30.0)] == ["a", "b"]
        state.forget("a")
        assert [t.id for t in state.ended_in_order()] == ["p", "b"] and state.finished_count == 2
        finished = sorted((t.history[-1].time_unix_s, t.id) for t in state.tasks.values()
                          if t.state in TERMINAL_STATES)
        assert [t.id for t in state.ended_in_order()] == [tid for _at, tid in finished]


def test_only_the_leader_state_changes_what_nodes_hold() -> None:
    """No module but ``coordinator/state.py`` changes what nodes hold (its ``NodeHoldings``), and no module reaches
    into another object's holdings: the node table only reads them through ``HoldingsView``."""
    offenders = []
    for path in sorted(COORDINATOR.rglob("*.py")):
        rel = path.relative_to(COORDINATOR.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("_held", "_holdings", "_source") \
                    and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                offenders.append(f"{rel}:{node.lineno} .{node.attr}")   # another object's private holdings
            if isinstance(node, ast.Attribute) and node.attr == "view" and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "holdings_source":
                offenders.append(f"{rel}:{node.lineno} .view set")   # only the node table points its entries
            if rel != "coordinator/state.py" and isinstance(node, ast.Call) \
                    and isinstance(node.func, ast.Attribute) and node.func.attr in ("hold", "let_go", "clear") \
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "holdings":
                offenders.append(f"{rel}:{node.lineno} holdings.{node.func.attr}")
            if isinstance(node, ast.Attribute) and node.attr in ("reserved", "reserved_gpu_indices") \
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "record" \
                    and not rel.startswith("coordinator/ctl/"):
                offenders.append(f"{rel}:{node.lineno} record.{node.attr}")   # derived, never on the record
    assert offenders == []


def test_a_task_back_in_the_queue_keeps_the_allocation_it_gave_up(state: LeaderState) -> None:
    """The usage ledger accounts the time a requeued task held its GPUs to them: the state keeps the allocation a
    stored record dropped, until the task is placed and requeued again or forgotten."""
    state.apply_placement(_placed("t1", "n1", [0, 1]))
    assert state.released("t1") == ()
    state.apply_task(types_pb2.Task(id="t1", state=pb_enum(types_pb2.TaskState, TaskState.PENDING)))
    assert [(na.node_id, list(na.gpu_indices)) for na in state.released("t1")] == [("n1", [0, 1])]
    state.apply_placement(_placed("t1", "n2", [3]))
    state.apply_task(types_pb2.Task(id="t1", state=pb_enum(types_pb2.TaskState, TaskState.PENDING)))
    assert [(na.node_id, list(na.gpu_indices)) for na in state.released("t1")] == [("n2", [3])]
    state.forget("t1")
    assert state.released("t1") == ()


def _task(task_id: str, submit: float, state: TaskState = TaskState.PENDING) -> types_pb2.Task:
    return types_pb2.Task(id=task_id, submit_unix_s=submit, state=pb_enum(types_pb2.TaskState, state))


class TestIndexes:
    def test_live_holds_exactly_the_unfinished_tasks(self, state: LeaderState) -> None:
        """The unfinished-task index follows every way a record changes: adopt, apply, placement, reason, forget."""
        state.adopt({"a": _task("a", 1.0), "b": _task("b", 2.0, TaskState.SUCCEEDED)}, {})
        assert set(state.live) == {"a"}
        state.apply_task(_task("c", 3.0))
        state.apply_placement(_placed("d", "n1", [0]))
        state.note_reason("c", "waiting")
        assert set(state.live) == {"a", "c", "d"} and state.live["c"].reason == "waiting"
        state.apply_task(_task("a", 1.0, TaskState.CANCELLED))
        state.forget("d")
        assert set(state.live) == {"c"}
        assert set(state.live) == {t.id for t in state.tasks.values() if t.state not in TERMINAL_STATES}

    def test_live_elastic_holds_exactly_the_unfinished_elastic_tasks(self, state: LeaderState) -> None:
        """The elastic index follows the same changes as the unfinished one, and only elastic tasks are in it."""
        def elastic(task: types_pb2.Task) -> types_pb2.Task:
            task.spec.elastic.min_gpus = 1
            return task
        state.adopt({"a": elastic(_task("a", 1.0)), "b": elastic(_task("b", 2.0, TaskState.SUCCEEDED)),
                     "r": _task("r", 2.5)}, {})
        assert set(state.live_elastic) == {"a"}
        state.apply_task(elastic(_task("c", 3.0)))
        state.apply_placement(elastic(_placed("d", "n1", [0])))
        state.apply_task(_task("e", 4.0))
        state.note_reason("c", "waiting")
        assert set(state.live_elastic) == {"a", "c", "d"} and state.live_elastic["c"].reason == "waiting"
        state.apply_task(elastic(_task("a", 1.0, TaskState.CANCELLED)))
        state.forget("d")
        assert set(state.live_elastic) == {"c"}
        assert set(state.live_elastic) == {t.id for t in state.live.values() if t.spec.HasField("elastic")}

    def test_pending_holds_exactly_the_pending_tasks(self, state: LeaderState) -> None:
        """The pending index follows every way a record changes: adopt, apply, placement, requeue, reason, forget."""
        state.adopt({"a": _task("a", 1.0), "b": _task("b", 2.0, TaskState.RUNNING),
                     "c": _task("c", 2.5, TaskState.SUCCEEDED)}, {})
        assert set(state.pending) == {"a"}
        state.apply_task(_task("d", 3.0))
        state.apply_task(_task("e", 3.5))
        state.apply_placement(_placed("d", "n1", [0]))
        state.note_reason("e", "waiting")
        assert set(state.pending) == {"a", "e"} and state.pending["e"].reason == "waiting"
        state.apply_task(_task("b", 2.0, TaskState.PENDING))   # requeued
        state.apply_task(_task("a", 1.0, TaskState.CANCELLED))
        state.forget("e")
        assert set(state.pending) == {"b"}
        assert set(state.pending) == {t.id for t in state.tasks.values() if t.state == TaskState.PENDING}

    def test_changes_count_stored_changes_and_not_noted_reasons(self, state: LeaderState) -> None:
        """The scheduler skips a cycle whose inputs match an idle one's; a reason it noted itself must not count as
        a change (else it would never skip), while every stored change must."""
        seen = [state.changes]
        state.apply_task(_task("a", 1.0))
        seen.append(state.changes)
        state.note_reason("a", "waiting")
        assert state.changes == seen[-1]
        state.apply_placement(_placed("a", "n1", [0]))
        seen.append(state.changes)
        state.apply_release(_placed("a", "n1", [0]))
        seen.append(state.changes)
        state.forget("a")
        seen.append(state.changes)
        state.adopt({}, {})
        seen.append(state.changes)
        assert seen == sorted(set(seen))   # each one rose

    def test_submit_order_walks_from_a_key(self, state: LeaderState) -> None:
        """Tasks are walked in (submit time, id) order from just after a key, whatever order they came in; a
        forgotten task leaves the walk."""
        for tid, t in (("t3", 3.0), ("t1", 1.0), ("t2b", 2.0), ("t2a", 2.0), ("t4", 4.0)):
            state.apply_task(_task(tid, t))
        assert [t.id for t in state.in_submit_order()] == ["t1", "t2a", "t2b", "t3", "t4"]
        assert [t.id for t in state.in_submit_order((2.0, "t2a"))] == ["t2b", "t3", "t4"]
        state.forget("t3")
        state.apply_task(_task("t2b", 2.0, TaskState.RUNNING))   # a change keeps its place
        assert [t.id for t in state.in_submit_order((2.0, "t2a"))] == ["t2b", "t4"]
