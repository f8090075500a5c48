"""The elastic allocator's rules (coordinator/elastic/rules.py): sizes, learned curves, sizing, shrink and grow."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain import ClusterSnapshot, Placement, Request, Resources
from coordinator.elastic.rules import (
    PRIOR_EXPONENT,
    ElasticJob,
    ElasticRange,
    ElasticSettings,
    SpeedupCurve,
    first_size,
    idle_gpus,
    node_accepts,
    place_down,
    plan_give_back,
    plan_grows,
    plan_shrinks,
    request_at,
    size_placements,
)
from coordinator.scheduler.placement import PlacementEngine
from tests.helpers.builders import GIB, make_node

NOW = 10_000.0
SETTINGS = ElasticSettings(interval_s=300.0, restart_cost_s=30.0)


def _job(task_id: str, size: int, node: str = "n1", *, lo: int = 1, hi: int = 8, prio: int = 0,
         curve: SpeedupCurve | None = None, last: float | None = None) -> ElasticJob:
    return ElasticJob(task_id, prio, ElasticRange(lo, hi, 8), size, ((node, size),), curve or SpeedupCurve(),
                      last_resize_s=last)


def _req(task_id: str, gpus: int, prio: int = 0, nodes: int = 1) -> Request:
    return Request(task_id, Resources(gpus=float(gpus), gpu_mem_total_bytes=gpus * GIB), nodes=nodes,
                   gpu_mem_per_gpu_bytes=GIB, priority=prio)


def _linear(alpha: float) -> SpeedupCurve:
    """A curve measured at 1, 2, 4 and 8 GPUs following T ∝ n^alpha."""
    curve = SpeedupCurve()
    for n in (1, 2, 4, 8):
        curve = curve.observe(n, 100.0 * n ** alpha)
    return curve


class TestRange:
    def test_sizes_within_a_node_then_whole_nodes(self) -> None:
        assert ElasticRange(1, 64, 8).sizes == (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 40, 48, 56, 64)
        assert ElasticRange(16, 32, 8).sizes == (16, 24, 32)
        assert ElasticRange(2, 4, 4).sizes == (2, 3, 4)

    def test_up_down_clamp_shape(self) -> None:
        r = ElasticRange(1, 24, 8)
        assert (r.up(8), r.up(24), r.down(16), r.down(1)) == (16, None, 8, None)
        assert (r.clamp(12), r.clamp(0), r.clamp(99)) == (8, 1, 24)
        assert (r.shape(3), r.shape(16)) == ((1, 3), (2, 8))

    @pytest.mark.parametrize("args", [(0, 4, 4), (4, 2, 4), (1, 4, 0), (9, 15, 8)])
    def test_empty_ranges_are_refused(self, args: tuple[int, int, int]) -> None:
        with pytest.raises(ValueError):
            ElasticRange(*args)

    def test_request_at_keeps_per_gpu_memory(self) -> None:
        base = _req("e", 1)
        two_nodes = request_at(base, ElasticRange(1, 16, 8), 16)
        assert (two_nodes.nodes, two_nodes.demand.gpus, two_nodes.demand.gpu_mem_total_bytes) == (2, 8.0, 8 * GIB)
        assert request_at(base, ElasticRange(1, 16, 8), 3).demand.gpus == 3.0


class TestSpeedupCurve:
    def test_prior_when_nothing_was_measured(self) -> None:
        assert SpeedupCurve().speedup(4) == pytest.approx(4 ** PRIOR_EXPONENT)

    def test_measured_sizes_are_exact_and_the_fit_recovers_the_exponent(self) -> None:
        curve = _linear(0.6)
        assert curve.throughput(4) == pytest.approx(100 * 4 ** 0.6)
        assert curve.exponent == pytest.approx(0.6)
        assert curve.throughput(16) == pytest.approx(100 * 16 ** 0.6)   # extrapolated with the fit
        assert curve.throughput(3) == pytest.approx(100 * 3 ** 0.6)     # log-log interpolation

    def test_a_new_reading_moves_the_average(self) -> None:
        curve = SpeedupCurve().observe(2, 100.0).observe(2, 200.0)
        assert 100.0 < curve.throughput(2) < 200.0

    def test_bad_readings_are_ignored(self) -> None:
        curve = SpeedupCurve().observe(2, 100.0)
        for bad in (0.0, -5.0, math.nan, math.inf):
            assert curve.observe(2, bad) == curve
        assert curve.observe(0, 10.0) == curve

    @given(st.lists(st.tuples(st.integers(1, 64), st.floats(1e-3, 1e6)), min_size=1, max_size=40))
    @settings(max_examples=100, deadline=None)
    def test_curve_stays_bounded_and_positive(self, readings: list[tuple[int, float]]) -> None:
        curve = SpeedupCurve()
        for n, t in readings:
            curve = curve.observe(n, t)
        assert len(curve.points) <= 16
        assert 0.0 <= curve.exponent <= 1.0
        assert all(curve.throughput(n) > 0 for n in range(1, 65))


class TestShrink:
    def test_frees_what_the_waiting_task_needs_and_no_more(self) -> None:
        out = plan_shrinks([_req("w", 2)], [_job("e", 4, hi=4)], {"n1": 0}, NOW, SETTINGS)
        assert [(r.task_id, r.from_gpus, r.to_gpus, r.for_task) for r in out] == [("e", 4, 2, "w")]
        assert out[0].expected_speedup < 1

    def test_never_below_the_minimum(self) -> None:
        assert plan_shrinks([_req("w", 4)], [_job("e", 4, lo=2, hi=4)], {"n1": 0}, NOW, SETTINGS) == []

    def test_idle_gpus_first(self) -> None:
        out = plan_shrinks([_req("w", 3)], [_job("e", 6)], {"n1": 2}, NOW, SETTINGS)
        assert [(r.from_gpus, r.to_gpus) for r in out] == [(6, 5)]

    def test_only_for_work_of_no_lower_priority(self) -> None:
        assert plan_shrinks([_req("w", 2, prio=0)], [_job("e", 4, prio=5)], {"n1": 0}, NOW, SETTINGS) == []
        assert plan_shrinks([_req("w", 2, prio=9)], [_job("e", 4, prio=5)], {"n1": 0}, NOW, SETTINGS)

    def test_hysteresis(self) -> None:
        recent = _job("e", 4, last=NOW - 10)
        assert plan_shrinks([_req("w", 2)], [recent], {"n1": 0}, NOW, SETTINGS) == []
        assert plan_shrinks([_req("w", 2)], [recent], {"n1": 0}, NOW + 300, SETTINGS)

    def test_the_job_that_loses_least_gives_first(self) -> None:
        scales, flat = _job("scales", 4, curve=_linear(1.0)), _job("flat", 4, curve=_linear(0.2))
        out = plan_shrinks([_req("w", 2)], [scales, flat], {"n1": 0}, NOW, SETTINGS)
        assert {r.task_id for r in out} == {"flat"}

    def test_node_constraints(self) -> None:
        jobs = [_job("e", 4, node="n1"), _job("f", 4, node="n2")]
        out = plan_shrinks([_req("w", 2)], jobs, {"n1": 0, "n2": 0}, NOW, SETTINGS,
                           accepts=lambda req, node_id: node_id == "n2")
        assert [r.task_id for r in out] == ["f"]

    def test_waiting_for_something_else_shrinks_nothing(self) -> None:
        """Its GPUs are free already on a node it accepts: it waits for CPU or memory, not for GPUs."""
        assert plan_shrinks([_req("w", 2)], [_job("e", 4)], {"n1": 0, "n2": 4}, NOW, SETTINGS) == []

    def test_a_multi_node_job_gives_back_whole_nodes(self) -> None:
        wide = ElasticJob("wide", 0, ElasticRange(8, 24, 8), 24, (("n1", 8), ("n2", 8), ("n3", 8)))
        out = plan_shrinks([_req("w", 8)], [wide], {"n1": 0, "n2": 0, "n3": 0}, NOW, SETTINGS)
        assert [(r.from_gpus, r.to_gpus) for r in out] == [(24, 16)]

    @given(st.lists(st.tuples(st.integers(1, 8), st.integers(1, 8), st.integers(0, 3)), min_size=1, max_size=6),
           st.lists(st.integers(1, 8), min_size=1, max_size=4))
    @settings(max_examples=150, deadline=None)
    def test_sizes_stay_within_range_and_below_now(self, jobs: list[tuple[int, int, int]], needs: list[int]) -> None:
        elastic = [_job(f"e{i}", max(lo, size), node=f"n{node}", lo=lo, hi=8)
                   for i, (size, lo, node) in enumerate(jobs)]
        by_id = {j.task_id: j for j in elastic}
        out = plan_shrinks([_req(f"w{i}", n) for i, n in enumerate(needs)], elastic, {f"n{i}": 0 for i in range(4)},
                           NOW, SETTINGS)
        assert len({r.task_id for r in out}) == len(out)
        for r in out:
            j = by_id[r.task_id]
            assert j.range.minimum <= r.to_gpus < r.from_gpus == j.size


class TestGiveBack:
    """A task waiting on its queue's limit: the queue's elastic jobs give back GPUs wherever they run."""

    def test_just_enough_from_the_job_losing_least_on_any_node(self) -> None:
        scales, flat = _job("scales", 4, "n1", curve=_linear(1.0)), _job("flat", 4, "n2", curve=_linear(0.2))
        out = plan_give_back("w", 0, 2, [scales, flat], NOW, SETTINGS, "its queue's limit")
        assert [(r.task_id, r.from_gpus, r.to_gpus, r.for_task) for r in out] == [("flat", 4, 2, "w")]
        assert "w is waiting on its queue's limit: shrinks to 2" in out[0].reason

    def test_never_below_the_minimum_nor_in_vain(self) -> None:
        assert plan_give_back("w", 0, 3, [_job("e", 4, lo=2)], NOW, SETTINGS, "x") == []
        assert [r.to_gpus for r in plan_give_back("w", 0, 2, [_job("e", 4, lo=2)], NOW, SETTINGS, "x")] == [2]

    def test_priority_and_hysteresis(self) -> None:
        assert plan_give_back("w", 0, 1, [_job("e", 4, prio=5)], NOW, SETTINGS, "x") == []
        assert plan_give_back("w", 0, 1, [_job("e", 4, last=NOW - 10)], NOW, SETTINGS, "x") == []


class TestGrow:
    def test_grows_into_its_own_nodes_idle_gpus(self) -> None:
        out = plan_grows([_job("e", 2, hi=4)], {"n1": 2, "n2": 8}, NOW, SETTINGS)
        assert [(r.from_gpus, r.to_gpus) for r in out] == [(2, 4)]
        assert out[0].grow and out[0].expected_speedup > 1

    def test_not_when_the_restart_does_not_pay(self) -> None:
        costly = ElasticJob("e", 0, ElasticRange(1, 4, 4), 2, (("n1", 2),), restart_cost_s=10_000.0)
        assert plan_grows([costly], {"n1": 2}, NOW, SETTINGS) == []
        short = ElasticJob("e", 0, ElasticRange(1, 4, 4), 2, (("n1", 2),), remaining_s=20.0)
        assert plan_grows([short], {"n1": 2}, NOW, SETTINGS) == []

    def test_hysteresis_and_range(self) -> None:
        assert plan_grows([_job("e", 2, last=NOW - 1)], {"n1": 2}, NOW, SETTINGS) == []
        assert plan_grows([_job("e", 4, hi=4)], {"n1": 4}, NOW, SETTINGS) == []

    def test_idle_gpus_go_to_the_better_scaling_job(self) -> None:
        jobs = [_job("scales", 1, curve=_linear(1.0)), _job("flat", 1, curve=_linear(0.1))]
        out = {r.task_id: r.to_gpus for r in plan_grows(jobs, {"n1": 1}, NOW, SETTINGS)}
        assert out == {"scales": 2}

    def test_a_job_whose_node_is_full_moves_to_the_node_that_fits_it_best(self) -> None:
        """No idle GPU on n1: the grow is a restart anyway, so the job moves — to the node with the fewest idle GPUs
        that hold its largest size within a node, else to the one with the most."""
        out = plan_grows([_job("e", 2, hi=4)], {"n1": 0, "n2": 8, "n3": 4, "n4": 3}, NOW, SETTINGS)
        assert [(r.task_id, r.from_gpus, r.to_gpus) for r in out] == [("e", 2, 4)]
        assert "another node" in out[0].reason
        out = plan_grows([_job("e", 2, hi=16)], {"n1": 0, "n2": 6, "n3": 3}, NOW, SETTINGS)
        assert [(r.from_gpus, r.to_gpus) for r in out] == [(2, 6)]

    def test_a_move_respects_the_jobs_constraints(self) -> None:
        out = plan_grows([_job("e", 2, hi=8)], {"n1": 0, "n2": 8, "n3": 4}, NOW, SETTINGS,
                         accepts=lambda task_id, node_id: node_id != "n2")
        assert [(r.from_gpus, r.to_gpus) for r in out] == [(2, 4)]
        assert plan_grows([_job("e", 2, hi=8)], {"n1": 0, "n2": 8}, NOW, SETTINGS,
                          accepts=lambda task_id, node_id: False) == []

    def test_its_own_node_first_and_no_move_that_is_no_bigger(self) -> None:
        out = plan_grows([_job("e", 2, hi=8)], {"n1": 1, "n2": 8}, NOW, SETTINGS)
        assert [(r.from_gpus, r.to_gpus) for r in out] == [(2, 3)] and "another node" not in out[0].reason
        assert plan_grows([_job("e", 3, hi=8)], {"n1": 0, "n2": 3}, NOW, SETTINGS) == []

    def test_moves_share_a_nodes_idle_gpus_by_marginal_speed_up(self) -> None:
        jobs = [_job("flat", 1, node="n1", hi=4, curve=_linear(0.1)),
                _job("scales", 1, node="n2", hi=4, curve=_linear(1.0))]
        out = {r.task_id: r.to_gpus for r in plan_grows(jobs, {"n1": 0, "n2": 0, "n3": 4, "n4": 2}, NOW, SETTINGS)}
        assert out == {"scales": 4, "flat": 2}

    def test_a_move_that_does_not_pay_its_restart_back_is_not_made(self) -> None:
        costly = ElasticJob("e", 0, ElasticRange(1, 4, 4), 2, (("n1", 2),), restart_cost_s=10_000.0)
        assert plan_grows([costly], {"n1": 0, "n2": 4}, NOW, SETTINGS) == []

    def test_a_multi_node_job_grows_only_into_nodes_of_its_width(self) -> None:
        """An idle 4-GPU node is no room for a part of 8 GPUs."""
        wide = ElasticJob("wide", 0, ElasticRange(8, 32, 8), 16, (("n1", 8), ("n2", 8)))
        assert plan_grows([wide], {"n1": 0, "n2": 0, "n3": 4, "n4": 4}, NOW, SETTINGS) == []

    def test_a_multi_node_job_grows_by_whole_idle_nodes(self) -> None:
        wide = ElasticJob("wide", 0, ElasticRange(8, 32, 8), 16, (("n1", 8), ("n2", 8)))
        out = plan_grows([wide], {"n1": 0, "n2": 0, "n3": 8, "n4": 5}, NOW,
                         SETTINGS)
        assert [(r.from_gpus, r.to_gpus) for r in out] == [(16, 24)]


class TestFirstSize:
    def test_a_requeued_job_comes_back_at_its_target_else_smaller(self) -> None:
        rng = ElasticRange(1, 8, 8)
        assert first_size(rng, 0) == 1 and first_size(rng, 6) == 6 and first_size(rng, 99) == 8
        engine = PlacementEngine.from_name(ClusterSnapshot(nodes=(make_node("n1", gpus=4, gpu_mem_gib=40,
                                                                             disk_gib=100),)), "max-utilization")
        placement = place_down(engine, request_at(_req("e", 1), rng, 6), rng, 6)
        assert placement is not None and sum(len(a.gpu_indices) for a in placement.assignments) == 4
        assert place_down(engine, request_at(_req("f", 1), rng, 2), rng, 2) is None   # not even 1 GPU is left


class TestSizing:
    def _engine(self, *gpus: int) -> PlacementEngine:
        nodes = tuple(make_node(f"n{i + 1}", gpus=g, gpu_mem_gib=40, disk_gib=100, gpu_model="TEST-GPU")
                      for i, g in enumerate(gpus))
        return PlacementEngine.from_name(ClusterSnapshot(nodes=nodes), "max-utilization")

    def test_placed_at_minimum_then_takes_what_is_left_up_to_its_wish(self) -> None:
        engine = self._engine(4)
        rng = ElasticRange(1, 4, 4)
        req = request_at(_req("e", 1), rng, 1)
        first = engine.place(req)
        assert isinstance(first, Placement)
        idle = idle_gpus(engine.snapshot().nodes)
        sized = size_placements(engine, [(req, rng, SpeedupCurve(), first, 3)], idle)
        placement = sized["e"]
        assert placement is not None and sum(len(a.gpu_indices) for a in placement.assignments) == 3
        assert idle_gpus(engine.snapshot().nodes) == {"n1": 1}

    def test_two_jobs_share_by_marginal_speed_up(self) -> None:
        engine = self._engine(8)
        rng = ElasticRange(1, 8, 8)
        reqs = [request_at(_req(t, 1), rng, 1) for t in ("a", "b")]
        placed = []
        for r in reqs:
            p = engine.place(r)
            assert isinstance(p, Placement)
            placed.append((r, rng, SpeedupCurve(), p, 8))
        sized = size_placements(engine, placed, idle_gpus(engine.snapshot().nodes))
        sizes = {t: sum(len(a.gpu_indices) for a in p.assignments) for t, p in sized.items() if p is not None}
        assert sizes == {"a": 4, "b": 4}   # the same prior curve: an even split

    def test_node_accepts(self) -> None:
        node = make_node("n1", gpus=4, gpu_mem_gib=40, disk_gib=100, gpu_model="NVIDIA H100")
        assert node_accepts(node, _req("w", 1))
        assert not node_accepts(node, Request("w", Resources(gpus=1.0), gpu_model="A100"))
        assert not node_accepts(node, Request("w", Resources(gpus=1.0), avoid_nodes=frozenset({"n1"})))


def test_readings_folded_together_are_the_readings_folded_one_by_one() -> None:
    readings = [10.0, 12.0, float("nan"), 9.0, -1.0, 11.0]
    one_by_one = SpeedupCurve(((1, 5.0),))
    for r in readings:
        one_by_one = one_by_one.observe(4, r)
    together = SpeedupCurve(((1, 5.0),)).observe_all(4, readings)
    assert together == one_by_one and together.throughput(4) == one_by_one.throughput(4)
    assert together.observe_all(4, []) is together and together.observe_all(0, [3.0]) is together
