"""The event loop: completion times, gangs, power states (the production Resource Adaptor), and that it runs
production code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import coordinator.scheduler.placement.engine
import coordinator.scheduler.policies.max_utilization
import coordinator.scheduler.policies.round_robin
from coordinator.simulator.engine import SimConfig, SimJob, SimResult, Simulator
from coordinator.simulator.replay import ReplaySetup, load
from tests.helpers.sim import cluster, job, node, synthetic_trace

POLICIES = ("max-utilization", "load-balancing", "power-efficient", "round-robin", "random", "first-fit")


def timeline(result: SimResult) -> dict[str, tuple[float, float]]:
    """job id → (start, end)."""
    return {r.job_id: (r.start_s, r.end_s) for r in result.jobs}


class TestCompletionTimes:
    """Jobs finish after their duration, in the order the policy and the queue allow."""

    def test_queueing_on_one_node(self) -> None:
        """A takes all 4 GPUs for 100 s; B and C (2 GPUs each) wait for it and then run side by side."""
        jobs = [job("A", 4, 0, 100), job("B", 2, 10, 50), job("C", 2, 20, 30)]
        result = Simulator(cluster(node("a")), jobs, SimConfig("first-fit")).run()
        assert timeline(result) == {"A": (0, 100), "B": (100, 150), "C": (100, 130)}
        m = result.metrics
        # JCT 100, 140, 110; waits 0, 90, 80
        assert m["jct_mean_s"] == pytest.approx(350 / 3)
        assert m["queue_delay_mean_s"] == pytest.approx(170 / 3)
        assert (m["makespan_s"], m["completed_jobs"], m["unplaced_jobs"]) == (150, 3, 0)

    def test_energy_of_a_fixed_schedule(self) -> None:
        """1000 W for 100 s (4 of 4 GPUs), then 560 W for 100 s (2 of 4) on a 120 → 1000 W node: 156 kJ."""
        jobs = [job("A", 4, 0, 100), job("B", 2, 100, 100)]
        result = Simulator(cluster(node("a", idle_w=120.0, max_w=1000.0)), jobs, SimConfig("first-fit")).run()
        # 120 + 880 · 0.5 = 560 W
        assert result.metrics["energy_kwh"] == pytest.approx((1000 * 100 + 560 * 100) / 3.6e6)
        assert result.metrics["util_mean"] == pytest.approx(0.75)

    def test_energy_per_job_is_its_gpus_share(self) -> None:
        """Each job gets its GPUs' share of the node's power over its run, as the agent attributes it:
        A holds 4 of 4 GPUs for 100 s (1000 W), B 2 of 4 for 100 s (2 · 1000/4 = 500 W); a gang sums its nodes."""
        jobs = [job("A", 4, 0, 100), job("B", 2, 100, 100)]
        result = Simulator(cluster(node("a", idle_w=120.0, max_w=1000.0)), jobs, SimConfig("first-fit")).run()
        energy = {r.job_id: r.energy_j for r in result.jobs}
        assert energy == {"A": pytest.approx(100_000), "B": pytest.approx(50_000)}
        assert result.metrics["job_energy_mean_kwh"] == pytest.approx(75_000 / 3.6e6)
        gang = Simulator(cluster(node("a", gpus=8, idle_w=100.0, max_w=900.0), node("b", gpus=8, idle_w=100.0,
                                                                                  max_w=900.0)),
                         [job("G", 8, 0, 10, nodes=2)], SimConfig("first-fit")).run()
        assert gang.jobs[0].energy_j == pytest.approx(2 * 900 * 10)

    def test_gang_needs_all_its_gpus_at_once(self) -> None:
        """A 2×8-GPU gang waits until both servers are empty; a 1-GPU job fits beside the blocker meanwhile."""
        jobs = [job("X", 1, 0, 100), job("G", 8, 10, 10, nodes=2), job("Y", 1, 20, 5)]
        result = Simulator(cluster(node("a", gpus=8), node("b", gpus=8)), jobs, SimConfig("first-fit")).run()
        assert timeline(result) == {"X": (0, 100), "G": (100, 110), "Y": (20, 25)}
        assert result.placements["G"] == ("a", "b")

    def test_never_placed_is_counted(self) -> None:
        """A gang wider than the cluster stays unplaced and the replay still ends."""
        jobs = [job("G", 8, 0, 10, nodes=2), job("A", 1, 5, 10)]
        result = Simulator(cluster(node("a", gpus=8)), jobs, SimConfig("max-utilization")).run()
        assert (result.metrics["unplaced_jobs"], result.metrics["completed_jobs"]) == (1, 1)

    @pytest.mark.parametrize(("keep_order", "expected"), [
        # largest first (Alg. 1): B (4 GPUs) runs at 0, A waits for it
        (False, {"A": (10, 20), "B": (0, 10)}),
        # queue order: A (submitted first) runs at 0 and B waits
        (True, {"A": (0, 10), "B": (10, 20)}),
    ])  # fmt: skip
    def test_batch_order(self, keep_order: bool, expected: dict[str, tuple[float, float]]) -> None:
        """Alg. 1 takes a batch largest first; keep_order decides it in queue order."""
        jobs = [job("A", 1, 0, 10), job("B", 4, 0, 10)]
        result = Simulator(cluster(node("a")), jobs, SimConfig("max-utilization", keep_order=keep_order)).run()
        assert timeline(result) == expected


class TestPowerStates:
    """Idle nodes draw idle power; the PowerManager powers them down after the threshold and wakes one for a job."""

    def test_power_down_and_wake(self) -> None:
        """Two 100 → 500 W nodes, off after 50 s idle, 20 s to wake: 22 kJ and 140 node-seconds by hand."""
        jobs = [job("A", 4, 0, 10), job("B", 4, 100, 10)]
        config = SimConfig("first-fit", power_down_after_s=50.0, wake_delay_s=20.0, spare_nodes=0)
        result = Simulator(cluster(node("a"), node("b")), jobs, config).run()
        # a: busy 0-10, idle 10-60, off 60-100, waking 100-120, busy 120-130; b: idle 0-50, then off
        assert timeline(result) == {"A": (0, 10), "B": (120, 130)}
        # 600·10 + 200·40 + 100·10 + 0·40 + 100·20 + 500·10 = 22 000 J
        assert result.metrics["energy_kwh"] == pytest.approx(22_000 / 3.6e6)
        assert result.metrics["active_node_hours"] == pytest.approx(140 / 3600)
        assert result.metrics["horizon_s"] == 130.0  # leftover power-down timers do not stretch it
        assert result.metrics["queue_delay_mean_s"] == pytest.approx(10.0)  # B waited 20 s for the wake-up

    def test_work_keeps_a_node_up(self) -> None:
        """A node that gets work before its timer fires stays on."""
        jobs = [job("A", 4, 0, 10), job("B", 4, 30, 10)]
        result = Simulator(cluster(node("a")), jobs, SimConfig("first-fit", power_down_after_s=50.0,
                                                               spare_nodes=0)).run()
        assert timeline(result)["B"] == (30, 40)
        assert result.metrics["active_node_hours"] == pytest.approx(40 / 3600)

    def test_wake_takes_the_off_node_adding_least_idle_power(self) -> None:
        """With every node off, a waiting job wakes the node with the least idle power (Alg. 3's measure)."""
        nodes = cluster(node("big", gpus=8, idle_w=800.0, max_w=4000.0), node("small", gpus=2, idle_w=200.0))
        config = SimConfig("max-utilization", power_down_after_s=10.0, wake_delay_s=5.0, spare_nodes=0)
        # A runs on big (the tie-break) and ends at 1; both nodes are off by 11, so J wakes one.
        result = Simulator(nodes, [job("A", 1, 0, 1), job("J", 1, 100, 10)], config).run()
        assert result.placements == {"A": ("big",), "J": ("small",)}
        assert timeline(result)["J"] == (105, 115)
        assert (result.metrics["power_offs"], result.metrics["power_ons"]) == (2, 1)

    def test_spare_node_stays_on(self) -> None:
        """One spare node: of two idle nodes only one is powered down, and a job starts on the spare at once."""
        config = SimConfig("first-fit", power_down_after_s=10.0, wake_delay_s=30.0, spare_nodes=1)
        result = Simulator(cluster(node("a"), node("b")), [job("A", 4, 0, 5), job("B", 4, 100, 5)], config).run()
        assert timeline(result)["B"] == (100, 105)
        assert (result.metrics["power_offs"], result.metrics["power_ons"]) == (1, 0)

    def test_every_node_on_without_power_down(self) -> None:
        """Without a power-down threshold no adaptor runs: both nodes draw idle power all along."""
        result = Simulator(cluster(node("a"), node("b")), [job("A", 4, 0, 10)], SimConfig("first-fit")).run()
        assert result.metrics["energy_kwh"] == pytest.approx((500 + 100) * 10 / 3.6e6)
        assert "power_offs" not in result.metrics


class TestProductionCode:
    """The simulator decides with the coordinator's own placement engine and policies."""

    def test_calls_the_policy_and_the_engine(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Alg. 1's rank keys and PlacementEngine.place are the functions that decide."""
        calls: dict[str, int] = {"rank": 0, "place": 0, "round-robin": 0}

        def counting(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                return fn(*args, **kwargs)

            return wrapper

        mu = coordinator.scheduler.policies.max_utilization.MaxUtilization
        monkeypatch.setattr(mu, "key_array", counting("rank", mu.key_array))
        monkeypatch.setattr(mu, "key_at", counting("rank", mu.key_at))
        rr = coordinator.scheduler.policies.round_robin.RoundRobin
        monkeypatch.setattr(rr, "select_one", counting("round-robin", rr.select_one))
        engine = coordinator.scheduler.placement.engine.PlacementEngine
        monkeypatch.setattr(engine, "place", counting("place", engine.place))
        jobs = [job(f"j{k}", 1 + k % 4, k, 50) for k in range(20)]
        result = Simulator(cluster(node("a", gpus=8), node("b", gpus=8)), jobs, SimConfig("max-utilization")).run()
        assert result.metrics["completed_jobs"] == 20
        assert calls["rank"] >= 20 and calls["place"] >= 20 and calls["round-robin"] == 0
        Simulator(cluster(node("a", gpus=8)), jobs[:3], SimConfig("round-robin")).run()
        assert calls["round-robin"] >= 3

    def test_random_policy_is_seeded(self) -> None:
        """The same seed gives the same placements; the random policy's RNG is the injected one."""
        jobs = [job(f"j{k}", 1, k, 30) for k in range(30)]
        nodes = cluster(*(node(f"n{k}") for k in range(6)))
        first = Simulator(nodes, jobs, SimConfig("random", seed=5)).run().placements
        assert Simulator(nodes, jobs, SimConfig("random", seed=5)).run().placements == first
        assert Simulator(nodes, jobs, SimConfig("random", seed=6)).run().placements != first


class TestParts:
    """The simulator's parts run the pipeline through the replay's narrow interface (coordinator/simulator/ports.py)."""

    def test_parts_use_only_the_replays_interface(self) -> None:
        """No part imports the engine (no import cycle), and none reaches for a private member of the replay."""
        import ast

        import coordinator.simulator

        root = Path(coordinator.simulator.__file__).parent
        for name in ("elastic.py", "queues.py", "qos.py", "ports.py"):
            tree = ast.parse((root / name).read_text(encoding="utf-8"))
            for n in ast.walk(tree):
                if isinstance(n, ast.ImportFrom):
                    assert n.module != "coordinator.simulator.engine", f"{name} imports the engine"
                if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__"):
                    owner = n.value
                    is_sim = (isinstance(owner, ast.Name) and owner.id == "sim") or (
                        isinstance(owner, ast.Attribute) and owner.attr == "sim")
                    assert not is_sim, f"{name}:{n.lineno} reads the replay's private {n.attr}"


@pytest.fixture(scope="module")
def busy_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[SimJob]]:
    """A synthetic trace that overloads its 10 nodes, loaded through the trace and profiler path."""
    directory: Path = tmp_path_factory.mktemp("busy")
    jobs_path, nodes_path = synthetic_trace(directory, n_jobs=160, n_nodes=10, seed=11)
    return load(ReplaySetup(jobs_path, nodes_path))


class TestFastPathEqualsPlaceBatch:
    """The shape-grouped pass decides exactly what place_batch over the whole queue decides."""

    @pytest.mark.parametrize("policy", POLICIES)
    @pytest.mark.parametrize("extra", [{}, {"power_down_after_s": 300.0, "wake_delay_s": 60.0},
                                       {"power_down_after_s": 300.0, "spare_nodes": 0, "keep_order": True}])
    def test_same_decisions(self, busy_trace: tuple[Any, list[SimJob]], policy: str, extra: dict[str, Any]) -> None:
        """Placements, start and end times and metrics match the reference mode for every policy."""
        cluster_snapshot, jobs = busy_trace
        config = SimConfig(policy, keep_series=False, **extra)
        fast = Simulator(cluster_snapshot, jobs, config).run()
        exact = Simulator(cluster_snapshot, jobs, replace(config, exact_batches=True)).run()
        assert fast.metrics["waited_jobs"] > 0  # the trace really queues
        assert fast.placements == exact.placements
        assert timeline(fast) == timeline(exact)
        assert fast.metrics == exact.metrics


class TestThePipelinesOrder:
    def test_least_slack_first_as_on_the_leader(self) -> None:
        """The replay orders its queue by the leader's rule: within a priority, the least slack (deadline − expected
        run time) first, not the earliest deadline."""
        def deadline_job(task_id: str, deadline_s: float, expected_s: float) -> SimJob:
            j = job(task_id, 1, 0.0, 100.0)
            return replace(j, request=replace(j.request, deadline_s=deadline_s, expected_run_s=expected_s))

        jobs = [deadline_job("early-but-short", 1000.0, 10.0), deadline_job("late-but-long", 2000.0, 1900.0)]
        for exact in (False, True):
            result = Simulator(cluster(node("n1", gpus=1)), jobs,
                               SimConfig("first-fit", keep_series=False, exact_batches=exact)).run()
            assert [r.job_id for r in sorted(result.jobs, key=lambda r: r.start_s)] == ["late-but-long",
                                                                                         "early-but-short"]


class TestStep:
    def test_one_pass_on_given_inputs(self) -> None:
        """step() runs one timestamp (arrivals, then one pass) and says what it decided; the next steps go on from
        there, and stepping to the end gives what run() gives."""
        jobs = [job("a", 2, 0.0, 50.0), job("b", 2, 0.0, 80.0), job("c", 4, 0.0, 10.0)]
        sim = Simulator(cluster(node("n1", gpus=4)), jobs, SimConfig("first-fit", keep_series=False))
        first = sim.step()
        assert first is not None and first.now == 0.0
        assert sorted(first.started) == ["a", "b"] and first.stopped == {} and first.waiting == ["c"]
        assert first.started["a"].node_ids == ("n1",)
        steps = [first]
        while (record := sim.step()) is not None:
            steps.append(record)
        assert [(r.now, sorted(r.started)) for r in steps] == [(0.0, ["a", "b"]), (50.0, []), (80.0, ["c"]),
                                                              (90.0, [])]
        whole = Simulator(cluster(node("n1", gpus=4)), jobs, SimConfig("first-fit", keep_series=False)).run()
        assert timeline(sim.result()) == timeline(whole)
