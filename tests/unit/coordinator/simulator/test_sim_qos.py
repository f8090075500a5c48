"""Priorities and preemption in the simulator: openb QoS classes, the leader's victim rule, the --qos report."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.simulator.cli import add_simulate_parser, run_simulate
from coordinator.simulator.engine import SimConfig, SimJob, SimResult, Simulator
from coordinator.simulator.qos import priority_of
from coordinator.simulator.qos_report import class_stats
from coordinator.simulator.replay import ReplaySetup, load
from tests.helpers.sim import cluster, job, node, write_csv

JOBS_HEADER = "job_id,submit_s,duration_s,gpus,gpu_share,cpu_cores,mem_gib,group,status,orig_submit"
NODES_HEADER = "node_id,gpus,gpu_model,gpu_mem_gib,cpu_cores,mem_gib"


def prio(j: SimJob, priority: int) -> SimJob:
    """The job with another priority."""
    return replace(j, request=replace(j.request, priority=priority))


def timeline(result: SimResult) -> dict[str, tuple[float, float]]:
    """job id → (last start, end)."""
    return {r.job_id: (r.start_s, r.end_s) for r in result.jobs}


def tiny_openb(directory: Path) -> tuple[Path, Path]:
    """One 4-GPU node; a BE job holds it all when an LS job and a Burstable job arrive."""
    jobs = write_csv(directory / "jobs.csv", JOBS_HEADER, [
        "be-1,0,1000,4,1,1,2,BE,Running,0",
        "ls-1,100,50,2,1,1,2,LS,Running,100",
        "bu-1,120,50,2,1,1,2,Burstable,Running,120",
        "be-2,130,10,1,1,1,2,BE,Running,130",
    ])
    nodes = write_csv(directory / "nodes.csv", NODES_HEADER, ["n1,4,TEST-GPU,40,32,256"])
    return jobs, nodes


class TestQosClassPriority:
    """openb QoS classes become priorities; anything else (Philly's virtual clusters) is equal."""

    @pytest.mark.parametrize(("group", "priority"), [("Guaranteed", 20), ("LS", 20), ("Burstable", 10),
                                                     ("BE", 0), ("be", 0), ("6214e9", 0), ("", 0)])
    def test_mapping(self, group: str, priority: int) -> None:
        """Guaranteed and LS are high, Burstable middle, BE and unknown groups low."""
        assert priority_of(group) == priority

    def test_trace_jobs_carry_their_class_priority(self, tmp_path: Path) -> None:
        """Loading an openb-style trace gives each request the priority of its group."""
        jobs, nodes = tiny_openb(tmp_path)
        _cluster, sim_jobs = load(ReplaySetup(jobs, nodes))
        assert {j.request.task_id: j.request.priority for j in sim_jobs} == {"be-1": 0, "ls-1": 20, "bu-1": 10,
                                                                             "be-2": 0}


class TestSimPreemption:
    """A high-priority job on a full simulated cluster preempts a low one and starts at once."""

    def jobs(self) -> list[SimJob]:
        return [prio(job("low", 4, 0, 1000), 0), prio(job("high", 4, 100, 50), 20)]

    def test_without_preemption_it_waits(self) -> None:
        """Without preemption the high-priority job starts when the low one ends."""
        result = Simulator(cluster(node("a")), self.jobs(), SimConfig("first-fit")).run()
        assert timeline(result) == {"low": (0, 1000), "high": (1000, 1050)}
        assert result.metrics["preemptions"] == 0 and result.preempted == {}

    def test_preemption_starts_it_at_once(self) -> None:
        """The low job is preempted at 100, loses its 100 s of progress, and reruns whole after the high one."""
        result = Simulator(cluster(node("a")), self.jobs(), SimConfig("first-fit", preemption=True)).run()
        assert timeline(result) == {"high": (100, 150), "low": (150, 1150)}
        assert result.metrics["preemptions"] == 1 and result.preempted == {"low": (1, 100.0)}
        stats = class_stats(result, self.jobs())
        assert stats[20]["delay_mean_s"] == 0 and stats[0]["delay_mean_s"] == pytest.approx(50)
        assert stats[0]["lost_gpu_h"] == pytest.approx(4 * 100 / 3600)

    def test_equal_priority_never_preempts(self) -> None:
        """Two jobs of the same priority: the second waits even with preemption on."""
        jobs = [prio(job("a", 4, 0, 1000), 20), prio(job("b", 4, 100, 50), 20)]
        result = Simulator(cluster(node("a")), jobs, SimConfig("first-fit", preemption=True)).run()
        assert timeline(result) == {"a": (0, 1000), "b": (1000, 1050)}

    def test_protection_window_holds(self) -> None:
        """A job preempted less than the window ago is not chosen again: the second high job waits."""
        jobs = [prio(job("low", 4, 0, 1000), 0), prio(job("h1", 4, 100, 50), 20), prio(job("h2", 4, 160, 50), 20)]
        cfg = SimConfig("max-utilization", preemption=True, protection_s=1000.0)
        result = Simulator(cluster(node("a")), jobs, cfg).run()
        assert result.preempted == {"low": (1, 100.0)}
        assert timeline(result)["h2"] == (1150, 1200)

    def test_gang_victim_frees_every_node(self) -> None:
        """A 2-node low gang is preempted for an 8-GPU high job; it reruns after it, its progress lost."""
        jobs = [prio(job("gang", 4, 0, 500, nodes=2), 0), prio(job("big", 4, 50, 100, nodes=2), 20)]
        result = Simulator(cluster(node("a"), node("b")), jobs, SimConfig("first-fit", preemption=True)).run()
        assert timeline(result) == {"big": (50, 150), "gang": (150, 650)}
        assert result.preempted == {"gang": (1, 50.0)}


class TestQosReport:
    """``simulate --qos`` prints per-class delays with and without preemption on a tiny trace."""

    def test_report_runs(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The high class waits without preemption and not with it; the table and qos.md say so."""
        jobs, nodes = tiny_openb(tmp_path)
        parser = argparse.ArgumentParser(prog="gptrmctl")
        add_simulate_parser(parser.add_subparsers(dest="command"))
        out = tmp_path / "out"
        run_simulate(None, parser.parse_args(["simulate", "--jobs", str(jobs), "--nodes", str(nodes), "--qos",
                                              "--policies", "first-fit", "--no-plots", "--out", str(out)]))
        text = capsys.readouterr().out
        rows = {line.split("|")[2].strip(): line for line in text.splitlines() if line.startswith("| first-fit")}
        assert "| 900 → 0 |" in rows["high (Guaranteed/LS)"]
        assert "preemptions: 1" in rows["all"]   # the middle job fits beside the high one
        assert rows["high (Guaranteed/LS)"] in (out / "qos.md").read_text()
