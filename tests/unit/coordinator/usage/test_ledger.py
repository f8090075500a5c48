"""The usage ledger's arithmetic (coordinator/usage/ledger.py) and reports (report.py), on fixed times."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.usage.duty import UsageMetrics
from coordinator.usage.ledger import (
    HOUR_S,
    OTHER,
    RowKey,
    Rows,
    Usage,
    account,
    add_rows,
    held_intervals,
    hour_of,
    split_hours,
)
from coordinator.usage.report import Prices, summarize

H = 1_800_000_000 // HOUR_S * HOUR_S   # the start of some hour


def task(task_id: str, changes: list[tuple[TaskState, float]], *, gpus: int = 2, cores: float = 4.0,
         queue: str = "q", user: str = "ann", energy_j: float = 0.0, nodes: int = 1,
         share: float = 1.0) -> types_pb2.Task:
    t = types_pb2.Task(id=task_id, queue=queue, submitted_by=user, energy_j=energy_j,
                       state=int(changes[-1][0]), demand=types_pb2.ResourceVector(gpus=gpus, cpu_cores=cores))
    for state, when in changes:
        t.history.add(state=int(state), time_unix_s=when)
    for n in range(nodes):
        t.allocation.nodes.add(node_id=f"n{n}", gpu_indices=list(range(gpus)), gpu_share=share,
                               demand=types_pb2.ResourceVector(gpus=gpus, cpu_cores=cores))
    return t


def model(node_id: str, indices: list[int]) -> str:
    return "H100" if node_id == "n0" else "A100"


def no_energy(t: types_pb2.Task) -> float:
    return 0.0


def total(hours: dict[int, Rows], field: str) -> float:
    return sum(getattr(u, field) for rows in hours.values() for u in rows.values())


S = TaskState


class TestHours:
    def test_split_at_hour_boundaries_exactly(self) -> None:
        assert split_hours(H + 3000, H + 2 * HOUR_S + 60) == [(H, 600.0), (H + HOUR_S, 3600.0),
                                                               (H + 2 * HOUR_S, 60.0)]
        assert split_hours(H, H) == [] and hour_of(H + HOUR_S - 0.001) == H and hour_of(H + HOUR_S) == H + HOUR_S

    def test_held_intervals_follow_the_holding_states(self) -> None:
        """Scheduled, starting, running and paused hold the allocation; pending and preempted do not."""
        t = task("t-1", [(S.PENDING, H), (S.SCHEDULED, H + 10), (S.RUNNING, H + 20), (S.PREEMPTED, H + 100),
                         (S.PENDING, H + 110), (S.SCHEDULED, H + 200), (S.RUNNING, H + 210)])
        assert held_intervals(t, H, H + 300) == [(H + 10, H + 20), (H + 20, H + 100), (H + 200, H + 210),
                                                 (H + 210, H + 300)]
        assert held_intervals(t, H + 50, H + 205) == [(H + 50, H + 100), (H + 200, H + 205)]


class TestAccount:
    def test_gpu_and_core_seconds_split_across_hours(self) -> None:
        """2 GPUs × 1 h 20 min from 10 minutes before an hour's end: 600 s, 3600 s, then 600 s."""
        t = task("t-1", [(S.PENDING, H), (S.SCHEDULED, H + 3000), (S.RUNNING, H + 3001),
                         (S.SUCCEEDED, H + 3000 + 4800)])
        acc = account([t], H, H + 3 * HOUR_S, {}, model, no_energy)
        key = RowKey("q", "ann", "H100")
        assert acc.hours[H][key].gpu_s == pytest.approx(2 * 600)
        assert acc.hours[H + HOUR_S][key].gpu_s == pytest.approx(2 * 3600)
        assert acc.hours[H + 2 * HOUR_S][key].gpu_s == pytest.approx(2 * 600)
        assert acc.hours[H + 2 * HOUR_S][key].cpu_core_s == pytest.approx(4 * 600)
        assert acc.hours[H + 2 * HOUR_S][key].tasks == 1 and total(acc.hours, "tasks") == 1
        assert acc.marks == {}   # ended inside the window: nothing to follow

    def test_adjoining_windows_add_up_to_one(self) -> None:
        """Passes over [a, b) and [b, c) count what one pass over [a, c) counts: nothing twice, nothing lost;
        a gang counts each node's GPUs under its own model; a shared GPU counts its share."""
        tasks = [task("t-1", [(S.SCHEDULED, H + 5), (S.RUNNING, H + 7), (S.FAILED, H + 5000)], nodes=2),
                 task("t-2", [(S.SCHEDULED, H + 100), (S.RUNNING, H + 101)], gpus=1, share=0.25, user="bob"),
                 task("t-3", [(S.PENDING, H + 50), (S.CANCELLED, H + 60)])]
        one = account(tasks, H, H + 9000, {}, model, no_energy).hours
        first = account(tasks, H, H + 4000, {}, model, no_energy)
        second = account(tasks, H + 4000, H + 9000, first.marks, model, no_energy)
        for field in ("gpu_s", "cpu_core_s", "tasks"):
            assert total(first.hours, field) + total(second.hours, field) == pytest.approx(total(one, field))
        assert total(one, "gpu_s") == pytest.approx(2 * 2 * 4995 + 0.25 * 8900)
        assert one[H][RowKey("q", "ann", "A100")].gpu_s == pytest.approx(2 * 3595)
        assert total(one, "tasks") == 2   # t-1 and t-3 ended; t-2 runs on

    def test_energy_is_counted_once_across_passes(self) -> None:
        """Cumulative energy readings turn into deltas against the marks; a finished task's last delta
        comes from its stored energy_j, and the mark goes once its end is behind the window."""
        t = task("t-1", [(S.SCHEDULED, H), (S.RUNNING, H + 1)])
        readings = {"t-1": 100.0}

        def energy(x: types_pb2.Task) -> float:
            return x.energy_j if x.state == S.SUCCEEDED else readings[x.id]

        a = account([t], H, H + 60, {}, model, energy)
        assert total(a.hours, "energy_j") == 100 and a.marks == {"t-1": 100.0}
        readings["t-1"] = 250.0
        b = account([t], H + 60, H + 120, a.marks, model, energy)
        assert total(b.hours, "energy_j") == 150 and b.marks == {"t-1": 250.0}
        readings["t-1"] = 0.0   # a new leader has no reports yet: nothing is taken back, the mark stays
        c = account([t], H + 120, H + 180, b.marks, model, energy)
        assert total(c.hours, "energy_j") == 0 and c.marks == {"t-1": 250.0}
        t.history.add(state=int(S.SUCCEEDED), time_unix_s=H + 200)
        t.state, t.energy_j = int(S.SUCCEEDED), 300.0
        d = account([t], H + 180, H + 240, c.marks, model, energy)
        assert total(d.hours, "energy_j") == 50 and d.marks == {}
        e = account([t], H + 240, H + 300, d.marks, model, energy)
        assert total(e.hours, "energy_j") == 0 and total(e.hours, "tasks") == 0

    def test_a_task_ending_after_the_window_keeps_its_mark(self) -> None:
        """A task whose end (stamped later than the window's end) is already in the table is counted once:
        its energy now, its end (task count) in the next window."""
        t = task("t-1", [(S.SCHEDULED, H), (S.RUNNING, H + 1), (S.SUCCEEDED, H + 70)], energy_j=40.0)
        a = account([t], H, H + 60, {}, model, lambda x: x.energy_j)
        assert total(a.hours, "energy_j") == 40 and total(a.hours, "tasks") == 0 and a.marks == {"t-1": 40.0}
        b = account([t], H + 60, H + 120, a.marks, model, lambda x: x.energy_j)
        assert total(b.hours, "energy_j") == 0 and total(b.hours, "tasks") == 1 and b.marks == {}
        assert total(a.hours, "gpu_s") + total(b.hours, "gpu_s") == pytest.approx(2 * 70)

    def test_an_end_that_lands_late_is_counted_once(self) -> None:
        """A task seen running by a pass, whose end was stamped inside that pass's window but reached the table
        only after it, is counted (its end and its final energy) by the next pass, once."""
        t = task("t-1", [(S.SCHEDULED, H), (S.RUNNING, H + 1)])
        a = account([t], H, H + 60, {}, model, lambda x: x.energy_j)
        assert a.marks == {"t-1": 0.0}
        end_in_past = H + 50
        t.history.add(state=int(S.FAILED), time_unix_s=end_in_past)
        t.state, t.energy_j = int(S.FAILED), 25.0
        b = account([t], H + 60, H + 120, a.marks, model, lambda x: x.energy_j)
        assert total(b.hours, "tasks") == 1 and total(b.hours, "energy_j") == 25.0 and b.marks == {}
        c = account([t], H + 120, H + 180, b.marks, model, lambda x: x.energy_j)
        assert c.hours == {} and c.marks == {}

    def test_energy_spreads_over_the_hours_held(self) -> None:
        t = task("t-1", [(S.SCHEDULED, H + HOUR_S - 30), (S.RUNNING, H + HOUR_S - 29)])
        acc = account([t], H + HOUR_S - 60, H + HOUR_S + 90, {}, model, lambda x: 120.0)
        key = RowKey("q", "ann", "H100")
        assert acc.hours[H][key].energy_j == pytest.approx(30.0)
        assert acc.hours[H + HOUR_S][key].energy_j == pytest.approx(90.0)

    def test_an_old_finished_task_is_left_alone(self) -> None:
        t = task("t-1", [(S.SCHEDULED, H), (S.SUCCEEDED, H + 10)], energy_j=5.0)
        acc = account([t], H + 100, H + 200, {}, model, lambda x: x.energy_j)
        assert acc.hours == {} and acc.marks == {}


class TestRowsAndReports:
    def test_rows_beyond_the_limit_fold_into_other(self) -> None:
        rows: Rows = {}
        add_rows(rows, {RowKey("q", f"u{i}", "H100"): Usage(gpu_s=1.0) for i in range(5)}, max_rows=3)
        assert len(rows) == 4 and rows[RowKey(OTHER, OTHER, "H100")].gpu_s == 2.0
        assert sum(u.gpu_s for u in rows.values()) == 5.0

    def test_summaries_and_costs(self) -> None:
        hours = [{RowKey("", "ann", "NVIDIA H100 80GB HBM3"): Usage(gpu_s=7200, cpu_core_s=3600, energy_j=3.6e6,
                                                                      tasks=1),
                  RowKey("research", "bob", "A100-40GB"): Usage(gpu_s=3600)},
                 {RowKey("", "bob", "NVIDIA H100 80GB HBM3"): Usage(gpu_s=3600, tasks=2)}]
        prices = Prices({"H100": 2.0, "A100-40GB": 1.0, "A100": 9.0}, per_kwh=0.5)
        by_queue = summarize(hours, by="queue", prices=prices)
        assert [r.key for r in by_queue] == ["default", "research"]
        d = by_queue[0]
        assert d.gpu_hours == 3 and d.cpu_core_hours == 1 and d.energy_kwh == 1 and d.tasks == 3
        assert d.cost == pytest.approx(3 * 2.0 + 1 * 0.5)
        assert by_queue[1].cost == pytest.approx(1.0)   # the exact name wins over a name found in it
        by_user = {r.key: r for r in summarize(hours, by="user", prices=prices)}
        assert by_user["bob"].gpu_hours_by_model == {"A100-40GB": 1.0, "NVIDIA H100 80GB HBM3": 1.0}
        assert [r.key for r in summarize(hours, by="model", prices=Prices())] == ["A100-40GB",
                                                                                   "NVIDIA H100 80GB HBM3"]
        with pytest.raises(ValidationError):
            summarize(hours, by="node", prices=prices)

    def test_gpu_hour_price_by_model_name(self) -> None:
        prices = Prices({"H100": 2.0, "NVIDIA H100 80GB HBM3": 3.0, "A100": 1.0, "A100-80GB": 1.5, "": 7.0})
        assert prices.gpu_hour("NVIDIA H100 80GB HBM3") == 3.0   # the exact name
        assert prices.gpu_hour("NVIDIA H100 PCIe") == 2.0        # a configured name found in the model
        assert prices.gpu_hour("nvidia a100-80gb pcie") == 1.5   # the longest one, case-insensitive
        assert prices.gpu_hour("NVIDIA A100-SXM4-40GB") == 1.0
        assert prices.gpu_hour("NVIDIA L4") == 0.0               # none: free ("" matches nothing)
        assert Prices().gpu_hour("H100") == 0.0

    def test_queue_labels_are_bounded(self) -> None:
        metrics = UsageMetrics(CollectorRegistry(), max_labels=4)
        metrics.add({H: {RowKey(f"q{i}", "u", "m"): Usage(gpu_s=1.0, energy_j=2.0) for i in range(5)}
                     | {RowKey("", "u", "m"): Usage(gpu_s=1.0)}})
        seen = {s.labels["queue"]: s.value for s in metrics.gpu_seconds.collect()[0].samples
                if s.name.endswith("_total")}
        assert seen == {"default": 1.0, "q0": 1.0, "q1": 1.0, "other": 3.0}
        assert math.isclose(sum(s.value for s in metrics.energy_joules.collect()[0].samples
                                if s.name.endswith("_total")), 10.0)


def test_time_held_goes_to_the_gpus_that_held_it_across_a_requeue() -> None:
    """A task ran 100 s on n0 (H100), was preempted back to the queue and ran 50 s on n1 (A100): each model gets
    its own time. While it waits again with no allocation, the time it held goes to the allocation it gave up,
    never to ``unknown``."""
    first = task("t", [(S.PENDING, H), (S.SCHEDULED, H + 10), (S.RUNNING, H + 11), (S.PREEMPTED, H + 110),
                       (S.PENDING, H + 111)])
    gave_up = tuple(first.allocation.nodes)
    moved = task("t", [(S.PENDING, H), (S.SCHEDULED, H + 10), (S.RUNNING, H + 11), (S.PREEMPTED, H + 110),
                       (S.PENDING, H + 111), (S.SCHEDULED, H + 200), (S.RUNNING, H + 201)])
    moved.allocation.nodes[0].node_id = "n1"
    rows = account([moved], H, H + 250, {}, model, no_energy, lambda _id: gave_up).hours[H]
    assert {k.gpu_model: u.gpu_s for k, u in rows.items()} == {"H100": 2 * 100, "A100": 2 * 50}
    first.ClearField("allocation")   # back in the queue: no allocation now
    rows = account([first], H, H + 150, {}, model, no_energy, lambda _id: gave_up).hours[H]
    assert {k.gpu_model: u.gpu_s for k, u in rows.items()} == {"H100": 2 * 100}
