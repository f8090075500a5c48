"""Elastic jobs in the simulator: the measured scaling curves, a hand-computed replay where an elastic job
grows into an idle node and shrinks for a rigid job, and the production rules doing the deciding."""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import coordinator.elastic.rules as rules
from common.errors import UsageError
from coordinator.elastic.allocator import learned_restart_cost_s, remaining_estimate_s
from coordinator.scheduler import cycle, pipeline
from coordinator.simulator import elastic as sim_elastic
from coordinator.simulator import elastic_cli
from coordinator.simulator.cli import add_simulate_parser, run_simulate
from coordinator.simulator.elastic import ElasticSimConfig
from coordinator.simulator.engine import SimConfig, SimJob, SimResult, Simulator
from coordinator.simulator.queue_report import write_records
from coordinator.simulator.scaling import (
    MAX_GPUS,
    MODELS,
    ScalingCurve,
    assign_models,
    default_scaling_dir,
    load_curves,
    measured_spread,
    model_for,
)
from tests.helpers.sim import cluster, job, node, spy_on_runs, write_csv

SCALING = default_scaling_dir()


def toy_curve() -> ScalingCurve:
    """Throughput n at 1..4 GPUs, 6 at 8 (one more per two GPUs beyond 4)."""
    return ScalingCurve("toy", 1, tuple(float(n) if n <= 4 else 4.0 + (n - 4) / 2 for n in range(1, MAX_GPUS + 1)),
                        (1, 2, 3, 4, 8))


# ---- the scaling data --------------------------------------------------------------------------------------

def test_measured_curves_rise_with_gpus_and_are_sublinear() -> None:
    curves = load_curves(SCALING)
    assert set(curves) == set(MODELS)
    for model, c in curves.items():
        t = c.throughput
        assert len(t) == MAX_GPUS
        assert all(b >= a for a, b in itertools.pairwise(t)), model        # never slower with more GPUs
        assert t[-1] > 2 * t[0], model                                            # and faster at scale
        # Sublinear: at most 5 % above linear anywhere (measurement noise at 2 GPUs), well under at 64.
        assert all(t[n - 1] <= 1.05 * n * t[0] for n in range(1, MAX_GPUS + 1)), model
        assert c.speedup(64) < 0.9 * 64, model
        assert c.local_bsz > 0 and 1 in c.measured and 64 in c.measured


def test_models_follow_the_gpu_hour_classes() -> None:
    rng = random.Random(1)
    assert model_for(0.5, rng) in ("cifar10", "ncf")
    assert model_for(1.0, rng) in ("deepspeech2", "bert")
    assert model_for(99.9, rng) == "yolov3"
    assert model_for(100.0, rng) == "imagenet"
    hours = [0.1] * 200 + [5.0] * 200
    drawn = assign_models(hours, seed=7)
    assert drawn == assign_models(hours, seed=7)                     # seeded
    assert {"cifar10", "ncf"} == set(drawn[:200]) and {"deepspeech2", "bert"} == set(drawn[200:])


# ---- a replay computed by hand -----------------------------------------------------------------------------

def grow_then_shrink() -> tuple[list[SimJob], ElasticSimConfig]:
    """Two 4-GPU nodes. Rigid B (4 GPUs, 100 s) at t=0; elastic A (trace 2 GPUs × 2000 s, so 4000 samples at the
    toy curve's throughput 2; range 1..8) at t=1; rigid C (4 GPUs, 100 s) at t=450. Hysteresis 300 s, restart 30 s."""
    jobs = [job("b", 4, 0.0, 100.0), job("a", 2, 1.0, 2000.0), job("c", 4, 450.0, 100.0)]
    config = ElasticSimConfig(curves={"toy": toy_curve()}, models=("", "toy", ""), max_factor=4.0, interval_s=300.0,
                              restart_cost_s=30.0)
    return jobs, config


def replay(jobs: list[SimJob], config: ElasticSimConfig | None, **kwargs: Any) -> tuple[Simulator, SimResult]:
    sim = Simulator(cluster(node("n1"), node("n2")), jobs,
                    SimConfig("first-fit", keep_order=True, keep_series=False, elastic=config, **kwargs))
    return sim, sim.run()


def test_elastic_job_grows_into_an_idle_node_and_shrinks_for_a_rigid_job() -> None:
    jobs, config = grow_then_shrink()
    sim, result = replay(jobs, config)
    # t=1: A placed at 1 GPU on n2 (n1 holds B), sized before it starts to n2's four GPUs (no whole node idle).
    # t=100: B ends; nothing waits, so A grows 4 → 8 onto n1 (learned: 4 samples/s at 4 GPUs; the prior
    #        exponent 0.8 predicts ×1.74 at 8, which pays the 30 s restart back within 300 s). It did
    #        99 s × 4 = 396 samples, 3604 left.
    # t=450: C waits; A (settled since 400) shrinks 8 → 4 for it: 320 s at 6 samples/s after its restart, 1920
    #        samples, 1684 left. A is queued before C (submitted earlier): placed at 1 GPU on n1, C goes to n2,
    #        then A is sized to its target 4 on n1.
    # t=550: C ends, but A resized at 450: it waits for its hysteresis, which runs out at 750 (a tick):
    #        A grows 4 → 8 (now learned ×1.5 at 8: 300 × (1 - 1/1.5) = 100 s > 30 s); 270 s × 4 = 1080 done,
    #        604 left, so it ends at 750 + 30 + 604 / 6.
    jct = {r.job_id: r.end_s - r.submit_s for r in result.jobs}
    end_a = 780.0 + 604.0 / 6.0
    assert jct == pytest.approx({"b": 100.0, "a": end_a - 1.0, "c": 100.0})
    a_runs = [(r.start_s, r.end_s, r.placement.demand.gpus * len(r.placement.node_ids), r.resized)
              for r in result.runs if r.job == 1]
    assert [r[3] for r in a_runs] == [True, True, True, False]
    assert [x for r in a_runs for x in r[:3]] == pytest.approx([1.0, 100.0, 4.0, 100.0, 450.0, 8.0, 450.0, 750.0, 4.0,
                                                                750.0, end_a, 8.0])
    assert (result.metrics["resizes_grow"], result.metrics["resizes_shrink"]) == (2, 1)
    # The replay ends with A: the ends its resized runs would have had (the first at 1 + 4000 / 4) are not waited for.
    assert result.metrics["horizon_s"] == pytest.approx(end_a)
    a = sim.elastic.jobs[1] if sim.elastic is not None else None
    assert a is not None and a.curve.as_dict() == pytest.approx({"4": 4.0, "8": 6.0})   # learned from what it ran at
    c_run = next(r for r in result.runs if r.job == 2)
    assert c_run.start_s == 450.0 and c_run.placement.node_ids == ("n2",)


def test_a_job_whose_node_is_full_moves_to_grow() -> None:
    """Two 4-GPU nodes. Rigid B (2 GPUs, 5000 s) on n1 and rigid C (4 GPUs, 100 s) on n2 at t=0; elastic A (trace
    2 GPUs × 2000 s, 4000 samples; range 1..8) at t=1."""
    jobs = [job("b", 2, 0.0, 5000.0), job("c", 4, 0.0, 100.0), job("a", 2, 1.0, 2000.0)]
    config = ElasticSimConfig(curves={"toy": toy_curve()}, models=("", "", "toy"), max_factor=4.0, interval_s=300.0,
                              restart_cost_s=30.0)
    _, result = replay(jobs, config)
    # t=1: A placed at 1 GPU on n1, sized before it starts to the 2 GPUs left there.
    # t=100: C ends. n1 has no idle GPU, so A moves: it restarts at 4 GPUs on n2 (the prior exponent predicts ×1.74,
    #        which pays the 30 s restart back). It did 99 s × 2 = 198 samples; 3802 left at 4 samples/s.
    a_runs = [(r.start_s, r.end_s, r.placement.node_ids, r.placement.demand.gpus) for r in result.runs if r.job == 2]
    assert a_runs == [(1.0, 100.0, ("n1",), 2.0), (100.0, pytest.approx(130.0 + 3802.0 / 4), ("n2",), 4.0)]
    assert result.metrics["resizes_grow"] == 1


def test_rigid_replay_of_the_same_jobs_for_contrast() -> None:
    jobs, _ = grow_then_shrink()
    _, result = replay(jobs, None)
    # A runs its trace 2 GPUs for 2000 s from t=1 on n2; C finds n1 free at 450.
    jct = {r.job_id: r.end_s - r.submit_s for r in result.jobs}
    assert jct == pytest.approx({"b": 100.0, "a": 2000.0, "c": 100.0})


def test_grows_or_shrinks_can_be_left_out() -> None:
    jobs, config = grow_then_shrink()

    _, grow_only = replay(jobs, replace(config, shrink=False))
    # No shrink at t=450: C waits for A, which ends at 100 + 30 + 3604 / 6.
    end_a = 130.0 + 3604.0 / 6.0
    jct = {r.job_id: r.end_s - r.submit_s for r in grow_only.jobs}
    assert jct == pytest.approx({"b": 100.0, "a": end_a - 1.0, "c": end_a + 100.0 - 450.0})
    assert (grow_only.metrics["resizes_grow"], grow_only.metrics["resizes_shrink"]) == (1, 0)
    _, shrink_only = replay(jobs, replace(config, grow=False))
    # No grow at t=100: A keeps 4 GPUs on n2 and ends at 1 + 4000 / 4; C takes n1 at 450.
    jct = {r.job_id: r.end_s - r.submit_s for r in shrink_only.jobs}
    assert jct == pytest.approx({"b": 100.0, "a": 1000.0, "c": 100.0})
    assert (shrink_only.metrics["resizes_grow"], shrink_only.metrics["resizes_shrink"]) == (0, 0)


def test_the_production_rules_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    # The simulator's elastic passes are the scheduling pipeline's own functions, the ones the leader's cycle runs...
    for name in ("plan_placements", "plan_resizes"):
        assert getattr(sim_elastic, name) is getattr(pipeline, name), name
    for name in ("plan_placements", "plan_resizes"):
        assert getattr(cycle, name) is getattr(pipeline, name), name
    # ...which decide by coordinator.elastic.rules's rules, and the replay goes through them.
    for name in ("plan_grows", "plan_shrinks", "size_placements"):
        assert getattr(pipeline, name) is getattr(rules, name), name
    calls: list[str] = []

    def spy(name: str) -> Any:
        real = getattr(rules, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return real(*args, **kwargs)
        return wrapped

    for name in ("plan_grows", "plan_shrinks", "size_placements"):
        monkeypatch.setattr(pipeline, name, spy(name))
    jobs, config = grow_then_shrink()
    replay(jobs, config)
    assert {"plan_grows", "plan_shrinks", "size_placements"} <= set(calls)


def test_power_down_leaves_grows_to_ready_nodes() -> None:
    jobs, config = grow_then_shrink()
    sim, result = replay(jobs, config, power_down_after_s=0.0, spare_nodes=0, wake_delay_s=60.0)
    assert len(result.jobs) == 3 and result.metrics["unplaced_jobs"] == 0
    assert result.metrics["powered_gpu_hours"] >= result.metrics["allocated_gpu_hours"] > 0
    # The adaptor was told what every run held, and the same when it ended: nothing is left reserved.
    assert sim.adaptor is not None
    assert all(e.reserved.gpus == 0 for e in sim.adaptor.entries)


def test_records_name_the_sizes_an_elastic_job_was_resized_to(tmp_path: Path) -> None:
    jobs, config = grow_then_shrink()
    _, result = replay(jobs, config)
    write_records(tmp_path / "r.csv", result, jobs)
    with open(tmp_path / "r.csv", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["job_id"] == "a"]
    assert [r["gpus"] for r in rows] == ["4", "8", "4", "8"]
    assert {r["resizes"] for r in rows} == {"100:8;450:4;750:8"}


def test_simulate_elastic_writes_the_report(tmp_path: Path) -> None:
    rows = [f"j{i},{60 * i},{600 + 300 * (i % 5)},{1 + (i % 3)},1,,,g,," for i in range(24)]
    jobs_csv = write_csv(tmp_path / "jobs.csv", "job_id,submit_s,duration_s,gpus,gpu_share,cpu_cores,mem_gib,"
                         "group,status,orig_submit", rows)
    nodes_csv = write_csv(tmp_path / "nodes.csv", "node_id,gpus,gpu_model,gpu_mem_gib,cpu_cores,mem_gib",
                          ["n1,4,,,,", "n2,4,,,,"])
    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers())
    args = parser.parse_args(["simulate", "--jobs", str(jobs_csv), "--nodes", str(nodes_csv), "--policies",
                              "first-fit", "--elastic", "--no-plots", "--out", str(tmp_path / "out"),
                              "--records", str(tmp_path / "rec.csv")])
    run_simulate(None, args)
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert list(data) == ["fcfs", "fcfs-pd", "elastic", "elastic-pd", "elastic-x2", "shrink-only", "grow-only"]
    assert all(d["completed_jobs"] == 24 for d in data.values())
    assert "- throughput curves: measured training throughput read from" in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "rec-elastic.csv").is_file()
    parsed = parser.parse_args(["simulate", "--jobs", str(jobs_csv), "--nodes", str(nodes_csv), "--policies",
                                "first-fit", "--elastic", "--no-plots", "--out", str(tmp_path / "some"),
                                "--elastic-runs", "fcfs-pd,elastic-pd"])
    run_simulate(None, parsed)
    some = json.loads((tmp_path / "some" / "results.json").read_text())
    assert list(some) == ["fcfs-pd", "elastic-pd"]
    assert "elastic-pd vs fcfs-pd" in (tmp_path / "some" / "report.md").read_text()
    parsed.elastic_runs = "fcfs,elastik"
    with pytest.raises(UsageError, match="elastik"):
        run_simulate(None, parsed)


def test_simulate_elastic_with_queues_and_preemption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--elastic --queues proportional --qos``: every run of the report replays with the team queues (borrowing and
    reclaim) and priority preemption, as the leader runs them together with elastic jobs."""
    rows = [f"j{i},{60 * i},{600 + 300 * (i % 5)},{1 + (i % 3)},1,,,{'ab'[i % 2]},," for i in range(16)]
    jobs_csv = write_csv(tmp_path / "jobs.csv", "job_id,submit_s,duration_s,gpus,gpu_share,cpu_cores,mem_gib,"
                         "group,status,orig_submit", rows)
    nodes_csv = write_csv(tmp_path / "nodes.csv", "node_id,gpus,gpu_model,gpu_mem_gib,cpu_cores,mem_gib",
                          ["n1,4,,,,", "n2,4,,,,"])
    configs = spy_on_runs(monkeypatch, elastic_cli)
    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers())
    args = parser.parse_args(["simulate", "--jobs", str(jobs_csv), "--nodes", str(nodes_csv), "--policies",
                              "first-fit", "--elastic", "--queues", "proportional", "--qos", "--elastic-runs",
                              "fcfs,elastic", "--no-plots", "--out", str(tmp_path / "out")])
    run_simulate(None, args)
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert list(data) == ["fcfs", "elastic"]
    assert all(d["completed_jobs"] == 16 for d in data.values())
    assert [(c.queues is not None and c.queues.managed, c.reclaim, c.preemption, c.elastic is not None)
            for c in configs] == [(True, True, True, False), (True, True, True, True)]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "every run with team queues `proportional`" in report and "every run with priority preemption" in report


# ---- what the allocator is told: the leader's information, or the truth behind --oracle --------------------

def seen_by_rules(monkeypatch: pytest.MonkeyPatch) -> list[rules.ElasticJob]:
    """Every job the replay's resizes (the pipeline's plan_resizes) hand plan_grows or plan_shrinks, in order."""
    seen: list[rules.ElasticJob] = []

    def spy(name: str) -> Any:
        real = getattr(rules, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            jobs = args[1] if name == "plan_shrinks" else args[0]
            seen.extend(jobs)
            return real(*args, **kwargs)
        return wrapped

    for name in ("plan_grows", "plan_shrinks"):
        monkeypatch.setattr(pipeline, name, spy(name))
    return seen


def noisy_toy() -> ScalingCurve:
    return replace(toy_curve(), noise=0.2)


def test_the_allocator_never_sees_the_truth_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs, config = grow_then_shrink()
    config = replace(config, curves={"toy": noisy_toy()}, restart_cost_s=90.0)
    assert not config.oracle
    seen = seen_by_rules(monkeypatch)
    sim, _ = replay(jobs, config)
    assert seen
    true = noisy_toy()
    for j in seen:
        # Throughput learned from noisy readings: never the true value at a size it ran at...
        assert all(t != true.at(n) for n, t in j.curve.points), j
        # ...no job of its model had finished: no run-time estimate; the first restart is the leader's default.
        assert j.remaining_s is None
    assert seen[0].restart_cost_s == rules.DEFAULT_RESTART_COST_S
    a = sim.elastic.jobs[1] if sim.elastic is not None else None
    assert a is not None and {n for n, _ in a.curve.points} == {4, 8}   # only the sizes it ran at


def test_the_oracle_is_told_the_truth_only_behind_its_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs, config = grow_then_shrink()
    config = replace(config, curves={"toy": noisy_toy()}, restart_cost_s=90.0, oracle=True)
    seen = seen_by_rules(monkeypatch)
    replay(jobs, config)
    true = noisy_toy()
    assert seen and all(t == true.at(n) for j in seen for n, t in j.curve.points)
    assert all(j.restart_cost_s == 90.0 for j in seen)
    assert all(j.remaining_s is not None and j.remaining_s > 0 for j in seen)
    # The command line tells the truth only when asked.
    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers())
    base = ["simulate", "--jobs", "j.csv", "--nodes", "n.csv", "--elastic", "--out", "o"]
    assert parser.parse_args(base).oracle is False
    assert parser.parse_args([*base, "--oracle"]).oracle is True
    assert parser.parse_args([*base, "--throughput-noise", "0.1"]).throughput_noise == 0.1


def test_restart_cost_is_learned_from_the_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grow-then-shrink replay with a true restart of 90 s: the first resize is decided on the leader's default
    30 s, the next ones on what the restarts took (each resized run is placed at once: 90 s until it runs)."""
    jobs, config = grow_then_shrink()
    seen = seen_by_rules(monkeypatch)
    replay(jobs, replace(config, restart_cost_s=90.0))
    a = [j for j in seen if j.task_id == "a"]
    assert a[0].restart_cost_s == rules.DEFAULT_RESTART_COST_S
    assert a[-1].last_resize_s is not None and a[-1].restart_cost_s == pytest.approx(90.0)
    seen.clear()
    replay(jobs, replace(config, restart_cost_s=90.0, assumed_restart_cost_s=45.0))
    assert next(j for j in seen if j.task_id == "a").restart_cost_s == 45.0   # --elastic-restart-cost until measured
    # The leader's rule, a moving average of the measured restarts, converges on what they take.
    cost = 0.0
    for k in range(8):
        stop = 1000.0 * (k + 1)
        cost = learned_restart_cost_s(cost, stop, stop + 90.0, 30.0)
    assert cost == pytest.approx(90.0)
    assert learned_restart_cost_s(0.0, 0.0, None, 30.0) == 30.0
    assert sim_elastic.learned_restart_cost_s is learned_restart_cost_s   # one rule, not a copy


def test_remaining_run_time_is_the_profilers_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two jobs of one model: once the first finished, the second's remaining run time is the first's run time
    (what the profiler learned) less what it ran; before, none."""
    jobs = [job("x", 4, 0.0, 100.0), job("y", 2, 0.0, 2000.0), job("b", 4, 0.0, 300.0)]
    config = ElasticSimConfig(curves={"toy": toy_curve()}, models=("toy", "toy", ""), interval_s=300.0)
    seen = seen_by_rules(monkeypatch)
    sim, _ = replay(jobs, config)
    assert sim.elastic is not None
    y = [j for j in seen if j.task_id == "y"]
    assert y and all(j.remaining_s is None or j.remaining_s <= 100.0 for j in y)
    assert sim.elastic.profiler.expected_run_s(sim.elastic.jobs[0].spec) is not None
    assert remaining_estimate_s(100.0, 40.0) == 60.0 and remaining_estimate_s(100.0, 140.0) is None
    assert remaining_estimate_s(None, 0.0) is None
    assert sim_elastic.remaining_estimate_s is remaining_estimate_s


def test_throughput_noise_default_is_the_measured_spread() -> None:
    curves = load_curves(SCALING)
    assert all(0.01 < c.noise < 0.15 for c in curves.values())
    # A smooth batch trend has no spread; one with independent 5 % errors reads about 5 %.
    smooth = [(b, 0.1 + 0.01 * b) for b in range(1, 200)]
    assert measured_spread([smooth]) < 0.01
    rng = random.Random(3)
    noisy = [(b, t * math.exp(0.05 * rng.gauss(0.0, 1.0))) for b, t in smooth]
    assert 0.04 < measured_spread([noisy]) < 0.06
    with pytest.raises(ValueError, match="noise"):
        ElasticSimConfig(curves={}, models=(), throughput_noise=-1.0)
