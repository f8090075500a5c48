"""Reservations, the pure parts: validation naming the field, which GPUs each keeps, the snapshots placement sees,
and the CLI's request and documents."""

from __future__ import annotations

import argparse

import pytest

from common.errors import UsageError, ValidationError
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from common.types import TaskState
from coordinator.ctl.main import build_parser
from coordinator.ctl.reservations import reservation_dict, reservation_from_args, reservations_dict, reservations_table
from coordinator.domain import ClusterSnapshot, Placement
from coordinator.reservations import blocked, choose_kept, is_member, keep_only, state_of, validate_reservation
from coordinator.scheduler.placement import PlacementEngine
from tests.helpers.builders import make_node, make_request
from tests.helpers.ctl_schema import validate

NOW = 1_000_000.0


def _r(name: str = "demo", gpus: int = 1, start: float = NOW + 60, end: float = NOW + 3600, **kw: object
       ) -> types_pb2.Reservation:
    kw.setdefault("queue", "team-a")
    return types_pb2.Reservation(name=name, gpus=gpus, start_unix_s=start, end_unix_s=end, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("change", "field"), [
    (dict(name="Bad Name"), "name"), (dict(gpus=0), "gpus"), (dict(end=NOW + 10, start=NOW + 20), "end_unix_s"),
    (dict(queue="", users=[]), "queue"), (dict(users=["bob"]), "queue"), (dict(queue="Team A"), "queue"),
    (dict(end=NOW - 1, start=NOW - 10), "end_unix_s"), (dict(nodes=[""]), "nodes[0]"),
])
def test_validation_names_the_field(change: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        validate_reservation(_r(**change), NOW)
    assert e.value.field == field


def test_state_and_membership() -> None:
    r = _r()
    assert [state_of(r, t) for t in (NOW, NOW + 60, NOW + 3600)] == ["upcoming", "active", "ended"]
    assert is_member(types_pb2.Task(queue="team-a"), r) and not is_member(types_pb2.Task(queue="team-b"), r)
    users = _r(queue="", users=["alice"])
    assert is_member(types_pb2.Task(queue="x", submitted_by="alice"), users)
    assert not is_member(types_pb2.Task(queue="x"), users)


def _holder(queue: str) -> types_pb2.Task:
    return types_pb2.Task(id=f"t-{queue}", queue=queue, state=int(TaskState.RUNNING))  # type: ignore[arg-type]


GPUS = [("n1", 0, "H100", True), ("n1", 1, "H100", True), ("n2", 0, "A100", True), ("n3", 0, "H100", False)]


def test_kept_gpus_prefer_own_work_then_free_on_nodes_then_off_nodes_then_others() -> None:
    holders = {("n1", 0): _holder("team-b"), ("n1", 1): _holder("team-a")}
    [k] = choose_kept([_r(gpus=1, gpu_model="h100")], GPUS, holders, NOW)
    assert k.gpus == (("n1", 1),) and k.used == 1               # its own work's GPU
    [k] = choose_kept([_r(gpus=2, gpu_model="h100")], GPUS, holders, NOW)
    assert k.gpus == (("n1", 1), ("n3", 0))                     # then a free one on a node that is off
    [k] = choose_kept([_r(gpus=3, gpu_model="h100")], GPUS, holders, NOW)
    assert k.gpus == (("n1", 0), ("n1", 1), ("n3", 0))          # then what others hold
    [k] = choose_kept([_r(gpus=2, nodes=["n2", "n3"])], GPUS, {}, NOW)
    assert k.gpus == (("n2", 0), ("n3", 0))
    # One GPU is kept by one reservation: the earlier start chooses first; an ended one keeps nothing.
    early, late = choose_kept([_r("late", gpus=1, start=NOW + 100), _r("early", gpus=1)], GPUS[:1], {}, NOW)
    assert (early.reservation.name, early.gpus, late.gpus) == ("early", (("n1", 0),), ())
    assert choose_kept([_r(start=NOW - 20, end=NOW - 10)], GPUS, {}, NOW) == []


def test_others_are_blocked_and_own_work_sees_only_its_gpus() -> None:
    nodes = (make_node("n1", gpus=2), make_node("n2", gpus=2))
    snap = ClusterSnapshot(nodes=nodes)
    kept = {"n1": frozenset({1}), "n2": frozenset({0, 1})}
    two = make_request("t", gpus=2)
    one = make_request("t", gpus=1)
    others = PlacementEngine.from_name(blocked(snap, kept), "max-utilization", threshold=1.0)
    assert not isinstance(others.place(two), Placement)        # no node has two GPUs left for others
    placed = others.place(one)
    assert isinstance(placed, Placement) and placed.assignments[0].gpu_indices == (0,)
    own = keep_only(nodes, {n.node_id: n for n in nodes}, {"n1": frozenset({1})}, 0.0)
    assert [n.node_id for n in own.nodes] == ["n1"]
    placed = PlacementEngine.from_name(own, "max-utilization", threshold=1.0).place(one)
    assert isinstance(placed, Placement) and placed.assignments[0].gpu_indices == (1,)
    assert blocked(snap, {}) is snap


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["reservations", "create", "demo", *argv])


def test_cli_request() -> None:
    r = reservation_from_args("demo", _args("--gpus", "2", "--gpu-model", "H100", "--nodes", "n1,n2", "--start",
                                            "+1h", "--duration", "1:30:00", "--queue", "team-a"), now=NOW)
    assert (r.gpus, r.gpu_model, list(r.nodes), r.start_unix_s, r.end_unix_s, r.queue) == \
        (2, "H100", ["n1", "n2"], NOW + 3600, NOW + 3600 + 5400, "team-a")
    r = reservation_from_args("demo", _args("--gpus", "1", "--start", "now", "--end", "2h", "--users", "a, b"),
                              now=NOW)
    assert (r.start_unix_s, r.end_unix_s, list(r.users), r.queue) == (NOW, NOW + 7200, ["a", "b"], "")
    for bad, msg in ((("--gpus", "1", "--start", "now", "--queue", "q"), "--end"),
                     (("--gpus", "1", "--start", "soon", "--end", "1h", "--queue", "q"), "--start"),
                     (("--gpus", "1", "--start", "now", "--end", "1h"), "--queue"),
                     (("--start", "now", "--end", "1h", "--queue", "q"), "--gpus")):
        with pytest.raises(UsageError, match=msg):
            reservation_from_args("demo", _args(*bad), now=NOW)


def test_documents_follow_their_schema() -> None:
    view = admin_pb2.ReservationView(reservation=_r(), state="upcoming", used_gpus=0,
                                     held=[admin_pb2.ReservedGpus(node_id="n1", gpu_indices=[1])])
    doc = reservations_dict(admin_pb2.ListReservationsResponse(reservations=[view]))
    validate(doc, "reservations")
    validate({"reservations": []}, "reservations")
    assert reservation_dict(view)["held"] == [{"node_id": "n1", "gpu_indices": [1]}]
    assert "DEMO" not in reservations_table(doc) and "demo" in reservations_table(doc)
    assert "no reservations" in reservations_table({"reservations": []})


def test_elastic_jobs_give_back_kept_gpus_ahead_of_the_start() -> None:
    from dataclasses import replace

    from coordinator.elastic.rules import ElasticJob, ElasticRange
    from coordinator.reservations import Kept, shrinks_off

    job = ElasticJob("e", 0, ElasticRange(1, 4, 4), 4, (("n1", 4),))
    task = types_pb2.Task(id="e", queue="team-b")
    task.allocation.nodes.add(node_id="n1", gpu_indices=[0, 1, 2, 3])
    kept = [Kept(_r(gpus=2, start=NOW + 60), (("n1", 2), ("n1", 3)))]
    [resize] = shrinks_off([job], kept, {"e": task}, NOW, lead_s=120.0)
    assert (resize.task_id, resize.from_gpus, resize.to_gpus) == ("e", 4, 2) and "reservation demo" in resize.reason
    assert shrinks_off([job], kept, {"e": task}, NOW, lead_s=30.0) == []            # not yet
    assert shrinks_off([replace(job, protected_until_s=NOW + 1)], kept, {"e": task}, NOW, 120.0) == []
    assert shrinks_off([replace(job, size=1, range=ElasticRange(1, 1, 4))], kept, {"e": task}, NOW, 120.0) == []
    task.queue = "team-a"                                                           # its own work keeps them
    assert shrinks_off([job], kept, {"e": task}, NOW, 120.0) == []


class _Stored:
    """What the leader loaded from etcd at take-over (``ReservationStore.list``)."""

    def __init__(self, *reservations: types_pb2.Reservation) -> None:
        self._all = {r.name: r for r in reservations}

    def list(self) -> dict[str, types_pb2.Reservation]:
        return dict(self._all)


def test_own_work_on_kept_gpus_is_shielded_and_others_plan_without_those_gpus() -> None:
    import asyncio

    from coordinator.events import EventBus
    from coordinator.monitor.nodes import NodeRegistry
    from coordinator.reservations import Reservations

    registry = NodeRegistry(heartbeat_interval_s=5.0, lost_grace_s=float("inf"))
    inv = types_pb2.NodeInventory(node_id="n1", gpus=[types_pb2.GpuInfo(index=i, model="H100") for i in range(2)])
    registry.connect(inv, outbox=None)  # type: ignore[arg-type]
    own = types_pb2.Task(id="a", queue="team-a", state=types_pb2.TASK_STATE_RUNNING)
    own.allocation.nodes.add(node_id="n1", gpu_indices=[1])
    other = types_pb2.Task(id="b", queue="team-b", state=types_pb2.TASK_STATE_PENDING)
    tasks = {"a": own, "b": other}
    clock = [NOW]
    res = Reservations(_Stored(_r(gpus=1, start=NOW + 60)), None, lambda: tasks, registry,  # type: ignore[arg-type]
                       EventBus(), now=lambda: clock[0])
    asyncio.run(res.recover())
    [k] = res.kept()
    assert k.gpus == (("n1", 1),) and k.used == 1 and res.nodes_needed(30.0) == {} and res.nodes_needed(60.0)
    assert not res.shields(own, other)                       # not yet active
    clock[0] = NOW + 61
    assert res.shields(own, other) and res.shields(own) and not res.shields(other, own)
    assert not res.shields(own, types_pb2.Task(queue="team-a"))   # its own work may preempt its own work
    snap = ClusterSnapshot(nodes=(make_node("n1", gpus=2),))
    seen = res.view_for(other, snap).nodes[0].gpus
    assert [g.share_free for g in seen] == [1.0, 0.0]
    assert res.view_for(types_pb2.Task(queue="team-a"), snap) is snap
    view = res.views().reservations[0]
    assert (view.state, view.used_gpus, [(h.node_id, list(h.gpu_indices)) for h in view.held]) == \
        ("active", 1, [("n1", [1])])
