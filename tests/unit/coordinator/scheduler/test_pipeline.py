"""The scheduling pipeline's pure plan functions (coordinator/scheduler/pipeline.py): plain data in, a plan out."""

from __future__ import annotations

from dataclasses import replace

from coordinator.domain import ClusterSnapshot, Placement, Rejection, Request, Resources
from coordinator.elastic.rules import ElasticJob, ElasticRange, ElasticSettings, SpeedupCurve, placement_gpus
from coordinator.queues import Queue, QueueConfig, UsageDecay
from coordinator.queues.planning import QueuedTask
from coordinator.scheduler.pipeline import (
    PendingTask,
    PlacementInputs,
    QueueState,
    ResizeInputs,
    plan_placements,
    plan_resizes,
)
from coordinator.scheduler.placement.engine import PlacementEngine
from tests.helpers.builders import make_node
from tests.helpers.sim import cluster, node

GIB = 1 << 30
NOW = 1_000_000.0


def request(task_id: str, gpus: int, *, submit_s: float = 1.0, deadline_s: float | None = None,
            expected_run_s: float | None = None, priority: int = 0) -> Request:
    return Request(task_id=task_id, demand=Resources(gpus=float(gpus), gpu_mem_total_bytes=gpus * GIB, cpu_cores=1.0,
                                                     mem_bytes=GIB),
                   gpu_mem_per_gpu_bytes=GIB, submit_s=submit_s, deadline_s=deadline_s,
                   expected_run_s=expected_run_s, priority=priority)


def inputs(snapshot: ClusterSnapshot, pending: list[PendingTask]) -> PlacementInputs:
    return PlacementInputs(NOW, pending, engine_for=lambda snap: PlacementEngine.from_name(
        snap if snap is not None else snapshot, "first-fit", threshold=1.0), snapshot=snapshot)


def linear() -> SpeedupCurve:
    curve = SpeedupCurve()
    for n in (1, 2, 4):
        curve = curve.observe(n, 100.0 * n)
    return curve


class TestPlacements:
    def test_least_slack_goes_first_and_the_rest_waits_with_a_reason(self) -> None:
        """Within a priority the task with the least slack (deadline − expected run time) is placed first, whatever
        its deadline or submit time; a task left waiting carries its rejection."""
        long_job = request("long", 1, submit_s=5.0, deadline_s=NOW + 2000, expected_run_s=1900)
        early = request("early", 1, submit_s=1.0, deadline_s=NOW + 1000, expected_run_s=10)
        plan = plan_placements(inputs(cluster(node("n1", gpus=1)), [PendingTask(early), PendingTask(long_job)]))
        assert [r.task_id for r in plan.requests] == ["long", "early"]
        assert [d.task_id for d in plan.placements()] == ["long"]
        assert [r.task_id for r in plan.waiting()] == ["early"]
        assert isinstance(plan.decisions[1], Rejection) and plan.reasons() == {"early": plan.decisions[1].reason}

    def test_elastic_tasks_take_the_idle_gpus_only_when_nothing_waits(self) -> None:
        """An elastic task is placed at its first size and sized up to its wish (its maximum, or a resize's target)
        into what is left over; with a whole-GPU task left waiting it stays at its first size."""
        elastic = PendingTask(request("e", 1), elastic=ElasticRange(1, 4, 8), curve=linear())
        plan = plan_placements(inputs(cluster(node("n1", gpus=8)), [elastic]))
        assert [placement_gpus(d) for d in plan.placements()] == [4]
        plan = plan_placements(inputs(cluster(node("n1", gpus=2)), [replace(elastic, target_gpus=3)]))
        assert [placement_gpus(d) for d in plan.placements()] == [2]   # refused at 3: placed smaller
        blocked = plan_placements(inputs(cluster(node("n1", gpus=4)), [elastic, PendingTask(request("r", 4))]))
        placed = {d.task_id: d for d in blocked.placements()}
        assert set(placed) == {"e"} and placement_gpus(placed["e"]) == 1

    def test_the_same_inputs_give_the_same_plan(self) -> None:
        """The plan is a function of its inputs: nothing read from a clock or kept between calls."""
        pending = [PendingTask(request(f"t{i}", 1 + i % 3, submit_s=float(i))) for i in range(8)]
        snapshot = cluster(node("n1", gpus=4), node("n2", gpus=4))
        first, second = plan_placements(inputs(snapshot, pending)), plan_placements(inputs(snapshot, pending))
        assert first.decisions == second.decisions and first.requests == second.requests

    def test_a_queue_that_reclaimed_places_its_tasks_ahead_of_the_batch(self) -> None:
        """Under max-utilization the batch goes by demand, so a borrower's 3-GPU task would take the node again
        before the 2-GPU task of the queue that reclaimed the GPUs for it (and be reclaimed again, cycle after
        cycle); with the queue's claim its task goes first."""
        config = QueueConfig(queues=(Queue("alpha", gpus={"*": 2}, members=("*",), default_for=("*",)),
                                     Queue("beta", gpus={"*": 2}, members=("*",))))
        # n2's GPUs are all taken (by work outside the queues): alpha may borrow, beta's task fits only on n1.
        snapshot = cluster(node("n1", gpus=4), make_node("n2", gpus=4, used_gpus=4, gpu_model="TEST-GPU"))
        pending = [PendingTask(request("big", 3, submit_s=1.0), QueuedTask("big", "alpha", 3)),
                   PendingTask(request("small", 2, submit_s=2.0), QueuedTask("small", "beta", 2))]

        def placed(claims: frozenset[str]) -> list[str]:
            plan = plan_placements(PlacementInputs(
                NOW, pending, engine_for=lambda snap: PlacementEngine.from_name(
                    snap if snap is not None else snapshot, "max-utilization", threshold=1.0), snapshot=snapshot,
                queues=QueueState(config, (), {"TEST-GPU": 8}, UsageDecay.for_config(config)), claims=claims))
            return [d.task_id for d in plan.placements()]

        assert placed(frozenset()) == ["big"]
        assert placed(frozenset({"beta"})) == ["small"]

    def test_a_task_placed_in_another_pool_waits_and_its_gpus_go_to_the_rest_of_the_batch(self) -> None:
        """Queue b's quota is in A100s (a pool of its own), queue a's in any model. a's any-model task goes first
        and first-fit puts it on the A100 node: it is not started there (its queue was admitted in the any-model
        pool) and those GPUs go back at once, so b's A100 task, later in the same batch, gets them."""
        a100, h100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
        config = QueueConfig(queues=(Queue("a", gpus={"*": 4}, members=("*",), default_for=("*",)),
                                     Queue("b", gpus={a100: 4}, members=("*",))))
        snapshot = cluster(make_node("n1", gpus=4, gpu_model=a100), make_node("n2", gpus=4, gpu_model=h100))
        pending = [PendingTask(request("any", 4, submit_s=1.0), QueuedTask("any", "a", 4)),
                   PendingTask(replace(request("mine", 4, submit_s=2.0), gpu_model=a100),
                               QueuedTask("mine", "b", 4, gpu_model=a100))]
        plan = plan_placements(PlacementInputs(
            NOW, pending, engine_for=lambda snap: PlacementEngine.from_name(
                snap if snap is not None else snapshot, "first-fit", threshold=1.0), snapshot=snapshot,
            queues=QueueState(config, (), {a100: 4, h100: 4}, UsageDecay.for_config(config))))
        assert [d.task_id for d in plan.placements()] == ["mine"] and plan.placements()[0].node_ids == ("n1",)
        assert "admitted in GPU pool '*'" in plan.reasons()["any"]


class TestResizes:
    def job(self, size: int, *, last_resize_s: float | None = None) -> ElasticJob:
        return ElasticJob("e", 0, ElasticRange(1, 8, 8), size, (("n1", size),), linear(), 10.0, last_resize_s)

    def nodes(self, used: int) -> list:
        engine = PlacementEngine.from_name(cluster(node("n1", gpus=8)), "first-fit", threshold=1.0)
        engine.place(request("held", used))
        return [engine.node_snapshot(0)]

    def test_grows_into_idle_gpus_when_nothing_waits(self) -> None:
        plan = plan_resizes(ResizeInputs(NOW, ElasticSettings(), [self.job(2)], self.nodes(2)))
        assert [(r.task_id, r.from_gpus, r.to_gpus > 2) for r in plan.resizes] == [("e", 2, True)]
        assert plan.blocked == {"e": ""}

    def test_shrinks_for_what_waits_and_says_why_it_does_not_grow(self) -> None:
        waiting = [request("w", 7)]
        plan = plan_resizes(ResizeInputs(NOW, ElasticSettings(), [self.job(8)], self.nodes(8), waiting=waiting))
        assert [(r.task_id, r.to_gpus, r.for_task) for r in plan.resizes] == [("e", 1, "w")]
        held = replace(self.job(2), last_resize_s=NOW - 1)
        plan = plan_resizes(ResizeInputs(NOW, ElasticSettings(), [held], self.nodes(2)))
        assert plan.resizes == [] and "at most one resize per" in plan.blocked["e"]

    def test_placements_are_not_reserved_outside_the_engine(self) -> None:
        """What a plan decides lives in the engine it was given: a fresh engine still has every GPU."""
        snapshot = cluster(node("n1", gpus=2))
        plan = plan_placements(inputs(snapshot, [PendingTask(request("a", 2))]))
        assert isinstance(plan.decisions[0], Placement)
        fresh = PlacementEngine.from_name(snapshot, "first-fit", threshold=1.0)
        assert isinstance(fresh.place(request("b", 2)), Placement)
