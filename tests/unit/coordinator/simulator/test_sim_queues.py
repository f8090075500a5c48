"""Team queues in the simulator: the scheduler's plan_queues and reclaim_for decide, the per-queue report
and the per-job records."""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from coordinator.queues import Queue, QueueConfig, planning
from coordinator.scheduler import cycle, pipeline
from coordinator.simulator import queues as sim_queues
from coordinator.simulator import queues_cli
from coordinator.simulator.cli import add_simulate_parser, run_simulate
from coordinator.simulator.engine import SimConfig, SimJob, SimResult, Simulator
from coordinator.simulator.queue_report import (
    RECORDS_HEADER,
    proportional_queues,
    queue_stats,
    strict,
    write_records,
)
from coordinator.simulator.workload import queue_name
from tests.helpers.sim import cluster, job, node, spy_on_runs, write_csv

JOBS_HEADER = "job_id,submit_s,duration_s,gpus,gpu_share,cpu_cores,mem_gib,group,status,orig_submit"
NODES_HEADER = "node_id,gpus,gpu_model,gpu_mem_gib,cpu_cores,mem_gib"
TREE = QueueConfig(queues=(Queue(name="a", gpus={"*": 4}), Queue(name="b", gpus={"*": 4})))
"""Two queues sharing an 8-GPU cluster equally, lending everything, no limit."""


def queued(j: SimJob, queue: str) -> SimJob:
    """The job in ``queue``."""
    return replace(j, queue=queue)


def burst() -> list[SimJob]:
    """Queue a bursts with eight 1-GPU jobs of 1000 s at t=0; queue b sends four 1-GPU jobs of 100 s at t=100."""
    return ([queued(job(f"a{i}", 1, 0.0, 1000.0), "a") for i in range(8)]
            + [queued(job(f"b{i}", 1, 100.0, 100.0), "b") for i in range(4)])


def replay(jobs: Sequence[SimJob], **kwargs: Any) -> SimResult:
    """Replay ``jobs`` on two 4-GPU nodes with first-fit in FIFO order."""
    return Simulator(cluster(node("n1"), node("n2")), jobs,
                     SimConfig("first-fit", keep_order=True, keep_series=False, **kwargs)).run()


def starts(result: SimResult, jobs: Sequence[SimJob]) -> dict[str, float]:
    """job id → first start."""
    out: dict[str, float] = {}
    for r in result.runs:
        task_id = jobs[r.job].request.task_id
        out[task_id] = min(out.get(task_id, r.start_s), r.start_s)
    return out


def peak_held(result: SimResult, jobs: Sequence[SimJob], queue: str) -> int:
    """The most GPUs ``queue`` held at any time."""
    events = [(t, d) for r in result.runs if jobs[r.job].queue == queue
              for t, d in ((r.start_s, jobs[r.job].request.demand.gpus), (r.end_s, -jobs[r.job].request.demand.gpus))]
    held = peak = 0.0
    for _t, d in sorted(events):     # at one instant, ends (negative) before starts
        held += d
        peak = max(peak, held)
    return int(peak)


class TestReplayWithQueues:
    """A burst of one queue against the other queue's quota."""

    def test_without_queues_the_burst_takes_everything(self) -> None:
        """FCFS: queue a holds all 8 GPUs, b waits until a's jobs end at t=1000."""
        jobs = burst()
        result = replay(jobs)
        assert all(starts(result, jobs)[f"b{i}"] == 1000.0 for i in range(4))
        stats = queue_stats(result, jobs, TREE, 8)
        assert stats["queues"]["b"]["met"] == 0.0
        assert stats["queues"]["b"]["entitled_gpu_h"] > 0

    def test_borrowing_and_reclaim_give_the_other_queue_its_quota(self) -> None:
        """a borrows b's idle quota at t=0; at t=100 reclaim preempts a's four newest jobs and b starts."""
        jobs = burst()
        result = replay(jobs, queues=TREE)
        first = starts(result, jobs)
        assert all(first[f"a{i}"] == 0.0 for i in range(8))          # borrowed while b was idle
        assert all(first[f"b{i}"] == 100.0 for i in range(4))
        preempted = sorted(jobs[r.job].request.task_id for r in result.runs if r.preempted)
        assert preempted == ["a4", "a5", "a6", "a7"]                  # the newest (same start: highest id)
        stats = queue_stats(result, jobs, TREE, 8)
        assert stats["queues"]["b"]["met"] == pytest.approx(1.0)
        assert stats["queues"]["a"]["met"] == pytest.approx(1.0)
        assert stats["queues"]["a"]["preempted"] == 4
        assert result.metrics["preemptions"] == 4

    def test_a_team_whose_jobs_are_larger_than_its_quota_gets_its_entitlement(self) -> None:
        """Queue big (quota 5) floods the 8 GPUs with 1-GPU jobs, borrowing lender's idle quota and small's; small
        (quota 1) sends 2-GPU jobs, larger than its quota. Its jobs are never owed within its quota, and nobody
        lends under contention: it waited until big's jobs ended. Under its quota, it now claims its whole job
        from big, which stays at or above its own quota: every team gets ≥ 95 % of its entitlement moment by
        moment, and lender's idle quota is never touched."""
        tree = QueueConfig(queues=(Queue(name="big", gpus={"*": 5}), Queue(name="small", gpus={"*": 1}),
                                   Queue(name="lender", gpus={"*": 2})))
        jobs = ([queued(job(f"big{i}", 1, 0.0, 3000.0), "big") for i in range(16)]
                + [queued(job(f"small{i}", 2, 100.0 + 10 * i, 300.0), "small") for i in range(3)])
        result = replay(jobs, queues=tree)
        stats = queue_stats(result, jobs, tree, 8)
        assert stats["contended_h"] > 0
        for name in ("big", "small"):
            assert stats["queues"][name]["met"] >= 0.95, (name, stats["queues"][name])
        assert starts(result, jobs)["small0"] == 100.0
        assert peak_held(result, jobs, "big") == 8 and peak_held(result, jobs, "small") == 2

    def test_without_reclaim_borrowers_keep_their_gpus(self) -> None:
        """Borrowing without reclaim: b waits for a's borrowed GPUs to come back."""
        jobs = burst()
        result = replay(jobs, queues=TREE, reclaim=False)
        assert all(starts(result, jobs)[f"b{i}"] == 1000.0 for i in range(4))
        assert not any(r.preempted for r in result.runs)

    def test_strict_quotas_never_exceed_the_quota(self) -> None:
        """limit = quota: a holds at most 4 GPUs even while b is idle, so b starts at once."""
        jobs = burst()
        result = replay(jobs, queues=strict(TREE), reclaim=False)
        assert peak_held(result, jobs, "a") == 4
        assert peak_held(result, jobs, "b") <= 4
        assert all(starts(result, jobs)[f"b{i}"] == 100.0 for i in range(4))
        assert not any(r.preempted for r in result.runs)

    def test_the_shape_fast_path_equals_place_batch(self) -> None:
        """The pass over the plan's order skips refused shapes; handing the order to place_batch decides the same."""
        jobs = [*burst(), *(queued(job(f"c{i}", 4, 50.0 + i, 300.0), "a") for i in range(3)),
                queued(job("g", 4, 120.0, 50.0, nodes=2), "b")]
        for tree in (TREE, strict(TREE)):
            fast = replay(jobs, queues=tree)
            exact = replay(jobs, queues=tree, exact_batches=True)
            key = [(r.job, r.start_s, r.end_s, r.placement.node_ids, r.preempted) for r in fast.runs]
            assert key == [(r.job, r.start_s, r.end_s, r.placement.node_ids, r.preempted) for r in exact.runs]

    def test_the_replay_calls_the_schedulers_queue_code(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every pass goes through the scheduling pipeline, which asks plan_queues (and reclaim_for after it), and
        follows their answers."""
        calls = {"plan": 0, "reclaim": 0, "victims": 0}

        def plan(*args: Any, **kwargs: Any) -> planning.QueuePlan:
            calls["plan"] += 1
            return planning.plan_queues(*args, **kwargs)

        def reclaim(*args: Any, **kwargs: Any) -> list[Any]:
            calls["reclaim"] += 1
            victims = planning.reclaim_for(*args, **kwargs)
            calls["victims"] += len(victims)
            return victims

        assert sim_queues.plan_placements is pipeline.plan_placements is cycle.plan_placements
        monkeypatch.setattr(pipeline, "plan_queues", plan)
        monkeypatch.setattr(sim_queues, "reclaim_for", reclaim)
        result = replay(burst(), queues=TREE)
        assert calls["plan"] >= 3 and calls["reclaim"] >= 1
        assert calls["victims"] == result.metrics["preemptions"] == 4

    def test_refused_plans_hold_jobs_back(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Only the plan's order is placed: a plan admitting nothing places nothing."""
        monkeypatch.setattr(pipeline, "plan_queues", lambda *a, **k: planning.QueuePlan([]))
        result = replay(burst(), queues=TREE)
        assert result.runs == [] and result.metrics["unplaced_jobs"] == 12


class TestQueuesWithPreemptionAndElastic:
    """Team queues with priority preemption and elastic jobs in one replay, as the leader runs them together."""

    @staticmethod
    def prio(j: SimJob, priority: int) -> SimJob:
        return replace(j, request=replace(j.request, priority=priority))

    def test_a_preemptor_is_booked_with_its_queue(self) -> None:
        """Queue a's high job preempts a's low job on the one 4-GPU node and starts at once, admitted by its queue;
        the low job reruns whole after it."""
        jobs = [queued(self.prio(job("low", 4, 0.0, 1000.0), 0), "a"),
                queued(self.prio(job("high", 4, 100.0, 50.0), 20), "a")]
        sim = Simulator(cluster(node("n1")), jobs, SimConfig("first-fit", keep_series=False, preemption=True,
                                                             queues=TREE))
        result = sim.run()
        assert {r.job_id: (r.start_s, r.end_s) for r in result.jobs} == {"high": (100.0, 150.0),
                                                                          "low": (150.0, 1150.0)}
        assert result.preempted == {"low": (1, 100.0)}
        assert sim.queues is not None and sim.queues.passes > 0

    def test_priority_preemption_stays_within_a_queue(self) -> None:
        """Queue b's high job does not preempt queue a's low job (within a's quota, nothing to reclaim): it waits."""
        jobs = [queued(self.prio(job("low", 4, 0.0, 1000.0), 0), "a"),
                queued(self.prio(job("high", 4, 100.0, 50.0), 20), "b")]
        result = Simulator(cluster(node("n1")), jobs, SimConfig("first-fit", keep_series=False, preemption=True,
                                                                queues=TREE)).run()
        assert {r.job_id: (r.start_s, r.end_s) for r in result.jobs} == {"low": (0.0, 1000.0),
                                                                          "high": (1000.0, 1050.0)}
        assert result.preempted == {}

    def test_elastic_jobs_run_with_queues_and_preemption(self) -> None:
        """An elastic job beside rigid ones, all in one queue that owns the cluster, preemption on (one priority):
        the replay decides what it decides without queues and preemption."""
        from coordinator.simulator.elastic import ElasticSimConfig
        from coordinator.simulator.scaling import MAX_GPUS, ScalingCurve

        curve = ScalingCurve("toy", 1, tuple(float(min(n, 4)) + max(0, n - 4) / 2 for n in range(1, MAX_GPUS + 1)),
                             (1, 2, 4, 8))
        elastic = ElasticSimConfig(curves={"toy": curve}, models=("", "toy", ""), interval_s=300.0,
                                   restart_cost_s=30.0)
        jobs = [queued(job("b", 4, 0.0, 100.0), "a"), queued(job("e", 2, 1.0, 2000.0), "a"),
                queued(job("c", 4, 450.0, 100.0), "a")]
        one = QueueConfig(queues=(Queue(name="a", gpus={"*": 8}),))
        alone = replay(jobs, elastic=elastic)
        together = replay(jobs, elastic=elastic, queues=one, preemption=True)
        assert alone.metrics["resizes_grow"] + alone.metrics["resizes_shrink"] > 0
        assert [(r.job, r.start_s, r.end_s, r.placement, r.resized) for r in together.runs] == [
            (r.job, r.start_s, r.end_s, r.placement, r.resized) for r in alone.runs]
        assert together.metrics["preemptions"] == 0


class TestQueueConfigs:
    """Generated quotas and strict limits."""

    def test_proportional_quotas_follow_gpu_hours(self) -> None:
        """GPU-hours 3:1 on 8 GPUs → quotas 6 and 2, lending all, no limit, weight 1."""
        jobs = [queued(job("x", 3, 0.0, 3600.0), "x"), queued(job("y", 1, 0.0, 3600.0), "y")]
        config = proportional_queues(jobs, 8)
        assert {q.name: q.quota_in("*") for q in config} == {"x": 6, "y": 2}
        assert all(q.limit_in("*") is None and q.weight == 1.0 and q.lend_in("*") == q.quota_in("*") for q in config)

    def test_proportional_quotas_sum_to_at_most_the_cluster(self) -> None:
        """Three equal queues on 8 GPUs: 3 + 3 + 2 (largest remainder, ties by name)."""
        jobs = [queued(job(n, 1, 0.0, 60.0), n) for n in ("p", "q", "r")]
        assert [q.quota_in("*") for q in proportional_queues(jobs, 8)] == [3, 3, 2]

    def test_strict_sets_limit_to_quota(self) -> None:
        assert [q.limit_in("*") for q in strict(TREE)] == [4, 4]

    @pytest.mark.parametrize(("group", "name"), [("6214e9", "6214e9"), ("BE", "be"), ("", "default"),
                                                 ("Team A/x", "team-a-x")])
    def test_groups_become_queue_names(self, group: str, name: str) -> None:
        assert queue_name(group) == name


def simulate(tmp_path: Path, *extra: str) -> Path:
    """Run ``gptrmctl simulate`` on a tiny two-group trace (equal GPU-hours: proportional quotas 4 and 4, on two
    4-GPU nodes; team-a bursts onto all 8 GPUs at t=0, team-b arrives at t=100); returns the output directory."""
    jobs = write_csv(tmp_path / "jobs.csv", JOBS_HEADER,
                     [f"a{i},0,1000,1,1,,,team-a,,0" for i in range(8)]
                     + [f"b{i},100,2000,1,1,,,team-b,,100" for i in range(4)])
    nodes = write_csv(tmp_path / "nodes.csv", NODES_HEADER, ["n1,4,TEST-GPU,40,32,256", "n2,4,TEST-GPU,40,32,256"])
    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers())
    out = tmp_path / "out"
    args = parser.parse_args(["simulate", "--jobs", str(jobs), "--nodes", str(nodes), "--policies", "first-fit",
                              "--no-plots", "--out", str(out), *extra])
    run_simulate(None, args)
    return out


class TestQueuesReport:
    """``--queues`` and ``--records``."""

    def test_three_runs_and_the_files(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Three runs, the table on stdout, the files beside results.json, one records file per run."""
        out = simulate(tmp_path, "--queues", "proportional", "--records", str(tmp_path / "rec" / "records.csv"))
        stats = json.loads((out / "queues.json").read_text())
        assert list(stats) == ["fcfs", "strict", "borrow"]
        assert "[[queue]]" in (out / "queues.toml").read_text()
        assert (out / "queues.csv").exists() and (out / "results.json").exists()
        assert stats["fcfs"]["queues"]["team-b"]["met"] == 0.0
        assert stats["borrow"]["queues"]["team-b"]["met"] == pytest.approx(1.0)
        assert stats["strict"]["queues"]["team-b"]["met"] == pytest.approx(1.0)
        assert stats["borrow"]["queues"]["team-a"]["quota"] == stats["borrow"]["queues"]["team-b"]["quota"] == 4
        assert "Team queues under contention" in capsys.readouterr().out
        for run in ("fcfs", "strict", "borrow"):
            assert (tmp_path / "rec" / f"records-{run}.csv").exists()

    def test_with_preemption(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """``--queues proportional --qos``: the three runs, each with priority preemption."""
        configs = spy_on_runs(monkeypatch, queues_cli)
        out = simulate(tmp_path, "--queues", "proportional", "--qos")
        assert list(json.loads((out / "queues.json").read_text())) == ["fcfs", "strict", "borrow"]
        assert [(c.queues is not None, c.preemption) for c in configs] == [(False, True), (True, True), (True, True)]
        assert "priority preemption in every run (--qos)" in (out / "queues.md").read_text()

    def test_records_header_and_recomputed_figures(self, tmp_path: Path) -> None:
        """The records file's header is fixed, and each queue's GPU-hours and mean wait recompute from it."""
        out = simulate(tmp_path, "--queues", "proportional", "--records", str(tmp_path / "records.csv"))
        stats = json.loads((out / "queues.json").read_text())
        for run in ("fcfs", "borrow"):
            with open(tmp_path / f"records-{run}.csv", newline="") as f:
                reader = csv.reader(f)
                assert tuple(next(reader)) == RECORDS_HEADER
                rows = [dict(zip(RECORDS_HEADER, r, strict=True)) for r in reader]
            assert all(r["resizes"] == "" for r in rows)
            for queue, fig in stats[run]["queues"].items():
                mine = [r for r in rows if r["queue"] == queue]
                gpu_h = sum(float(r["gpus"]) * (float(r["end_s"]) - float(r["start_s"])) for r in mine) / 3600
                assert gpu_h == pytest.approx(fig["gpu_h"])
                waits = []
                for job_id in {r["job_id"] for r in mine}:
                    runs = [r for r in mine if r["job_id"] == job_id]
                    ran = sum(float(r["end_s"]) - float(r["start_s"]) for r in runs)
                    waits.append(max(float(r["end_s"]) for r in runs) - float(runs[0]["submit_s"]) - ran)
                assert sum(waits) / len(waits) == pytest.approx(fig["wait_mean_s"])
        borrow = (tmp_path / "records-borrow.csv").read_text().splitlines()[1:]
        assert len(borrow) == 12 + 4                                  # four preempted runs, each restarted

    def test_records_without_queues_one_file_per_policy(self, tmp_path: Path) -> None:
        simulate(tmp_path, "--records", str(tmp_path / "records.csv"))
        assert (tmp_path / "records-first-fit.csv").read_text().splitlines()[0] == ",".join(RECORDS_HEADER)

    def test_queue_file(self, tmp_path: Path) -> None:
        """--queues FILE reads the TOML format of coordinator.queues.tomlfile."""
        path = tmp_path / "q.toml"
        path.write_text('[[queue]]\nname = "team-a"\ngpus = { "*" = 6 }\n\n[[queue]]\nname = "team-b"\n'
                        'gpus = { "*" = 2 }\n', encoding="utf-8")
        out = simulate(tmp_path, "--queues", str(path))
        stats = json.loads((out / "queues.json").read_text())
        assert stats["borrow"]["queues"]["team-b"]["quota"] == 2
        assert stats["strict"]["queues"]["team-a"]["gpu_h"] == pytest.approx(8 * 1000 / 3600)

    def test_write_records_of_a_job_that_never_ran(self, tmp_path: Path) -> None:
        """A job that never started has one row with empty start and end."""
        jobs = [queued(job("big", 4, 0.0, 10.0, nodes=3), "a")]
        result = replay(jobs)
        write_records(tmp_path / "r.csv", result, jobs)
        assert (tmp_path / "r.csv").read_text().splitlines()[1] == "big,a,0,,,12,3,"
