"""The scheduling cycle's snapshot reads what nodes hold from the leader's stored holdings
(coordinator/scheduler/snapshot.py, ``stored=True``): the same nodes as from the tasks' allocations, and a
node whose holdings did not change is the last snapshot's object."""

from __future__ import annotations

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.monitor.power_model import PowerModel
from coordinator.scheduler.snapshot import SnapshotBuilder
from coordinator.state import LeaderState
from tests.helpers.builders import connected_registry


def _placed(task_id: str, node_id: str, gpus: list[int], share: float = 1.0, mem: int = 0) -> types_pb2.Task:
    task = types_pb2.Task(id=task_id, state=int(TaskState.RUNNING))
    task.allocation.nodes.add(node_id=node_id, gpu_indices=gpus, gpu_share=share,
                              demand=types_pb2.ResourceVector(gpus=len(gpus) * share, gpu_mem_bytes=mem, cpu_cores=1))
    return task


def _gpus(snapshot: object) -> dict[str, tuple[tuple[int, int, float], ...]]:
    return {n.node_id: tuple((g.index, g.mem_free_bytes, g.share_free) for g in n.gpus)
            for n in snapshot.nodes}  # type: ignore[attr-defined]


def test_stored_holdings_show_what_the_allocations_show() -> None:
    registry = connected_registry("n1", "n2", "n3")
    state = LeaderState(registry)
    tasks = [_placed("a", "n1", [0, 1]), _placed("b", "n1", [2], 0.5, 10 * 1024**3), _placed("c", "n2", [3])]
    for task in tasks:
        state.apply_placement(task)
    from_tasks = SnapshotBuilder(PowerModel()).snapshot(tasks, registry)
    from_stored = SnapshotBuilder(PowerModel()).snapshot(tasks, registry, stored=True)
    assert _gpus(from_stored) == _gpus(from_tasks)
    assert _gpus(from_stored)["n1"][0][2] == 0.0 and _gpus(from_stored)["n3"][0][2] == 1.0


def test_a_node_whose_holdings_did_not_change_is_the_same_object() -> None:
    registry = connected_registry("n1", "n2")
    state = LeaderState(registry)
    builder = SnapshotBuilder(PowerModel())
    state.apply_placement(_placed("a", "n1", [0]))
    first = {n.node_id: n for n in builder.snapshot([], registry, stored=True).nodes}
    state.apply_placement(_placed("b", "n2", [1]))
    second = {n.node_id: n for n in builder.snapshot([], registry, stored=True).nodes}
    assert second["n1"] is first["n1"]
    assert second["n2"] is not first["n2"] and second["n2"].gpus[1].share_free == 0.0
    state.apply_release(_placed("a", "n1", [0]))
    third = {n.node_id: n for n in builder.snapshot([], registry, stored=True).nodes}
    assert third["n1"] is not second["n1"] and third["n1"].gpus[0].share_free == 1.0


def test_a_holdings_version_changes_with_every_change_and_only_then() -> None:
    state = LeaderState(connected_registry("n1", "n2"))
    holdings = state.holdings
    assert holdings.version_on("n1") == 0
    state.apply_placement(_placed("a", "n1", [0]))
    v1 = holdings.version_on("n1")
    state.apply_placement(_placed("a", "n1", [0]))   # the same placement followed twice: nothing changes
    assert holdings.version_on("n1") == v1 and holdings.version_on("n2") == 0
    assert holdings.held_on("n1") == [([0], 0, 1.0)]
    state.apply_release(_placed("a", "n1", [0]))
    v2 = holdings.version_on("n1")
    assert v2 != v1 and holdings.held_on("n1") == []
    holdings.clear()
    state.apply_placement(_placed("b", "n1", [0]))
    assert holdings.version_on("n1") not in (0, v1, v2)   # never reused, also across a clear
