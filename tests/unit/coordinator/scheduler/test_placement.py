"""Tests for the production placement engine (coordinator/placement.py)."""

from __future__ import annotations

import gc
import math
import random
from collections import defaultdict

import pytest

from coordinator.domain import ClusterSnapshot, Decision, Placement, Rejection, Request, Resources
from coordinator.scheduler.placement.engine import PlacementEngine
from coordinator.scheduler.policies import POLICIES, THRESHOLD_MODES
from coordinator.scheduler.policies.base import is_shared, limit_factors
from tests.helpers.builders import GIB, make_node, make_request, random_cluster, random_requests
from tests.helpers.reference_algorithms import reference_place

POLICY_NAMES = sorted(p for p in POLICIES if p != "time-aware")  # no paper reference: its own tests
CASES_PER_POLICY = 1000


def choices(engine: PlacementEngine, requests: list[Request]) -> dict[str, tuple[str, ...] | None]:
    """Node ids per task (None when refused), from one batch."""
    decisions = engine.place_batch(requests)
    pairs = zip(requests, decisions, strict=True)
    return {r.task_id: d.node_ids if isinstance(d, Placement) else None for r, d in pairs}


def assert_matches_reference(
    policy: str, cluster: ClusterSnapshot, requests: list[Request], threshold: float, seed: int
) -> None:
    """One batch on a fresh engine in paper mode (the threshold caps every dimension, as the reference's)
    gets exactly the reference's nodes (or waits) for every request."""
    expected = reference_place(policy, cluster, requests, threshold, seed=seed)
    engine = PlacementEngine.from_name(cluster, policy, threshold, seed=seed, mode="paper")
    assert choices(engine, requests) == expected, f"seed {seed}"


class TestMatchesReference:
    """The engine makes the reference's choices on inputs the reference understands."""

    @pytest.mark.parametrize("policy", POLICY_NAMES)
    def test_random_clusters(self, policy: str) -> None:
        """On 1,000 random clusters and batches, every request gets the reference's nodes (or waits)."""
        for seed in range(CASES_PER_POLICY):
            rng = random.Random(seed)
            cluster = random_cluster(rng, rng.randint(1, 16))
            requests = random_requests(rng, rng.randint(1, 20))
            assert_matches_reference(policy, cluster, requests, rng.choice((0.5, 0.7, 0.85, 0.9, 1.0)), seed)

    @pytest.mark.parametrize("policy", POLICY_NAMES)
    def test_saturated_clusters(self, policy: str) -> None:
        """Long batches that fill the cluster (many refusals, shortcut paths) still match the reference."""
        for seed in range(40):
            rng = random.Random(10_000 + seed)
            cluster = random_cluster(rng, rng.randint(2, 12))
            assert_matches_reference(policy, cluster, random_requests(rng, 80, gang=seed % 2 == 0), 0.9, seed)

    @pytest.mark.parametrize("policy", POLICY_NAMES)
    def test_inexact_values_take_the_general_path(self, policy: str) -> None:
        """Demands that are not multiples of 2**-20 (0.1 cores) are decided like the reference."""
        for seed in range(30):
            rng = random.Random(20_000 + seed)
            cluster = random_cluster(rng, 8)
            requests = [
                Request(r.task_id, Resources(r.demand.gpus, r.demand.gpu_mem_total_bytes, 0.1 * rng.randint(1, 90),
                                             r.demand.mem_bytes, r.demand.disk_bytes), nodes=r.nodes)
                for r in random_requests(rng, 30)
            ]  # fmt: skip
            assert_matches_reference(policy, cluster, requests, 0.85, seed)


def gpu_cluster(rng: random.Random, n_nodes: int) -> ClusterSnapshot:
    """Nodes with topology groups, labels, two GPU models and some half-shared GPUs."""
    nodes = []
    for i in range(n_nodes):
        gpus = rng.choice((2, 4, 8))
        node = make_node(
            f"g{i:02d}", gpus=gpus, used_gpus=rng.randint(0, gpus // 2), gpu_mem_gib=rng.choice((40, 80)),
            cpu=64.0, used_cpu=float(rng.randint(0, 16)), topology=tuple(k // 2 for k in range(gpus)),
            gpu_model=rng.choice(("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB")),
            labels={"zone": rng.choice(("a", "b"))},
        )  # fmt: skip
        nodes.append(node)
    return ClusterSnapshot(nodes=tuple(nodes))


def gpu_requests(rng: random.Random, n: int) -> list[Request]:
    """Whole-GPU, shared and CPU-only requests with per-GPU memory, constraints and gangs."""
    out = []
    for k in range(n):
        sharing = rng.random() < 0.3
        gpus = rng.choice((0.25, 0.5)) if sharing else float(rng.choice((0, 1, 2, 3, 4, 8)))
        out.append(make_request(
            f"r{k:03d}", gpus=gpus, per_gpu_gib=rng.choice((8, 20, 39, 70)) if gpus else 0,
            cpu=float(rng.randint(1, 8)), mem_gib=rng.randint(1, 64),
            nodes=1 if sharing else rng.choice((1, 1, 1, 2)), allow_sharing=sharing,
            gpu_model=rng.choice(("", "", "H100")), node_selector=rng.choice(({}, {}, {"zone": "a"})),
        ))  # fmt: skip
    return out


class TestInvariants:
    """Properties that hold for every policy on GPU-level inputs the reference does not model."""

    @pytest.mark.parametrize("mode", THRESHOLD_MODES)
    @pytest.mark.parametrize("policy", POLICY_NAMES)
    def test_threshold_gpus_and_gangs(self, policy: str, mode: str) -> None:
        """No dimension exceeds its limit, no GPU is over-booked, gangs are all or nothing."""
        for seed in range(60):
            rng = random.Random(seed)
            cluster, requests = gpu_cluster(rng, rng.randint(1, 10)), gpu_requests(rng, 40)
            threshold = rng.choice((0.6, 0.9, 1.0))
            engine = PlacementEngine.from_name(cluster, policy, threshold, seed=seed, mode=mode)
            decisions = engine.place_batch(requests)
            check_invariants(cluster, engine.snapshot(), requests, decisions, threshold, mode)


def check_invariants(
    before: ClusterSnapshot, after: ClusterSnapshot, requests: list[Request], decisions: list, threshold: float,
    mode: str = "paper",
) -> None:
    """Assert the placement invariants for one batch."""
    nodes = before.by_id()
    added: dict[str, Resources] = defaultdict(Resources)
    shared_on: set[str] = set()   # nodes a shared request went to (held to the shared limits)
    booked: dict[tuple[str, int], float] = defaultdict(float)
    for req, decision in zip(requests, decisions, strict=True):
        if isinstance(decision, Rejection):
            continue
        assert len(decision.assignments) == req.nodes
        assert len(set(decision.node_ids)) == req.nodes
        for a in decision.assignments:
            node = nodes[a.node_id]
            assert (not req.gpu_model or req.gpu_model in node.gpu_model) and node.schedulable
            assert all(node.labels.get(k) == v for k, v in req.node_selector.items())
            assert len(a.gpu_indices) == (req.whole_gpus or (1 if req.demand.gpus > 0 else 0))
            added[a.node_id] = added[a.node_id].add(req.demand)
            if is_shared(req):
                shared_on.add(a.node_id)
            for g in a.gpu_indices:
                booked[(a.node_id, g)] += a.gpu_share
                assert nodes[a.node_id].gpus[g].mem_total_bytes >= req.gpu_mem_per_gpu_bytes
    for node in after.nodes:
        used = nodes[node.node_id].used.add(added[node.node_id])
        # The loosest limits any request placed there had (GPU dimensions at capacity in whole-gpus
        # mode, unless only shared requests went there).
        only_shared = node.node_id in shared_on and all(
            is_shared(r) for r, d in zip(requests, decisions, strict=True)
            if isinstance(d, Placement) and node.node_id in d.node_ids)
        factors = limit_factors(threshold, mode, only_shared)
        for u, after_u, cap, f in zip(used.as_tuple(), node.used.as_tuple(), node.capacity.as_tuple(), factors,
                                      strict=True):
            assert math.isclose(u, after_u, abs_tol=1e-6)
            if added[node.node_id].as_tuple() != (0, 0, 0, 0, 0):
                assert u <= f * cap + 1e-9
        for slot in node.gpus:
            initially_taken = 1.0 - nodes[node.node_id].gpus[slot.index].share_free
            assert initially_taken + booked[(node.node_id, slot.index)] <= 1.0 + 1e-9


class TestMatchesScalarPipeline:
    """The vectorised filter and selection agree with the readable feasible() + rank() per request."""

    @pytest.mark.parametrize("mode", THRESHOLD_MODES)
    @pytest.mark.parametrize("policy", [p for p in POLICY_NAMES if p != "random"])
    def test_gpu_level_inputs(self, policy: str, mode: str) -> None:
        """Shares, per-GPU memory, topology and constraints: the engine picks the scalar pipeline's nodes."""
        for seed in range(40):
            rng = random.Random(30_000 + seed)
            engine = PlacementEngine.from_name(gpu_cluster(rng, rng.randint(1, 8)), policy, 0.9, mode=mode)
            for req in gpu_requests(rng, 30):
                by_id = engine.snapshot().by_id()
                order = engine.policy.rank(req, list(by_id.values()))
                ranked = [n for n in order if engine.policy.feasible(req, by_id[n]) is None]
                expected = tuple(ranked[: req.nodes]) if len(ranked) >= req.nodes else None
                decision = engine.place(req)
                assert (decision.node_ids if isinstance(decision, Placement) else None) == expected, seed


class TestReleases:
    """After releases the engine decides like a fresh engine built from its snapshot."""

    @pytest.mark.parametrize("mode", THRESHOLD_MODES)
    @pytest.mark.parametrize("policy", ["max-utilization", "power-efficient", "first-fit"])
    def test_release_then_place(self, policy: str, mode: str) -> None:
        """Random placements and releases leave no stale bound, memo or GPU index behind."""
        for seed in range(30):
            rng = random.Random(40_000 + seed)
            engine = PlacementEngine.from_name(gpu_cluster(rng, 6), policy, 0.9, mode=mode)
            placed: list[tuple[Placement, Request]] = []
            for req in gpu_requests(rng, 60):
                if placed and rng.random() < 0.4:
                    done, done_req = placed.pop(rng.randrange(len(placed)))
                    engine.release(done, done_req.gpu_mem_per_gpu_bytes)
                fresh = PlacementEngine.from_name(engine.snapshot(), policy, 0.9, mode=mode)
                decision, expected = engine.place(req), fresh.place(req)
                assert type(decision) is type(expected)
                if isinstance(decision, Placement):
                    assert decision.assignments == expected.assignments
                    placed.append((decision, req))


class TestRejections:
    """Refusals carry a readable reason and per-node reasons, and reserve nothing."""

    def test_reason_names_the_demand_and_threshold(self) -> None:
        """A 4-GPU request on nodes with 2 free GPUs is refused with counts and node reasons."""
        cluster = ClusterSnapshot(nodes=(make_node("a", gpus=8, used_gpus=6), make_node("b", gpus=8, used_gpus=6)))
        engine = PlacementEngine.from_name(cluster, "max-utilization", 0.9, mode="paper")
        [decision] = engine.place_batch([make_request("t", gpus=4, per_gpu_gib=80)])
        assert isinstance(decision, Rejection)
        assert "4 free GPUs of ≥ 80 GiB" in decision.reason and "threshold 0.9" in decision.reason
        assert decision.scale_out is True
        assert [n for n, _ in decision.node_reasons] == ["a", "b"]
        assert all(why == "gpus over threshold 0.9" for _, why in decision.node_reasons)
        assert engine.snapshot() == cluster

    def test_reason_says_when_only_a_higher_threshold_helps(self) -> None:
        """In paper mode 8 GPUs never fit 0.9 × 8: the reason says so, unlike a request that waits for room."""
        cluster = ClusterSnapshot(nodes=(make_node("a", gpus=8), make_node("b", gpus=8, used_gpus=2)))
        engine = PlacementEngine.from_name(cluster, "max-utilization", 0.9, mode="paper")
        never, later = make_request("never", gpus=8), make_request("later", gpus=7)
        decision = engine.place(never)
        assert isinstance(decision, Rejection)
        assert "gpus over threshold on every node, even with nothing reserved on it" in decision.reason
        assert isinstance(engine.place(later), Placement)
        decision = engine.place(later)
        assert isinstance(decision, Rejection)
        assert "gpus over threshold" in decision.reason and "nothing reserved" not in decision.reason
        assert isinstance(PlacementEngine.from_name(cluster, "max-utilization", 1.0, mode="paper").place(never),
                          Placement)

    def test_whole_gpus_are_never_stranded_by_default(self) -> None:
        """By default (whole-gpus mode, threshold 0.9) an 8-GPU request fits an idle 8-GPU node, and two
        1-GPU requests share a 2-GPU node; the threshold still caps host CPU."""
        cluster = ClusterSnapshot(nodes=(make_node("a", gpus=8),))
        engine = PlacementEngine.from_name(cluster, "max-utilization")
        assert engine.policy.threshold == 0.9 and engine.policy.threshold_mode == "whole-gpus"
        assert isinstance(engine.place(make_request("all", gpus=8)), Placement)
        pair = ClusterSnapshot(nodes=(make_node("p", gpus=2, gpu_mem_gib=80),))
        decisions = PlacementEngine.from_name(pair, "first-fit").place_batch(
            [make_request("one", gpus=1), make_request("two", gpus=1)])
        assert all(isinstance(d, Placement) for d in decisions)
        assert {d.assignments[0].gpu_indices for d in decisions if isinstance(d, Placement)} == {(0,), (1,)}
        cpu_bound = PlacementEngine.from_name(cluster, "first-fit").place(make_request("cpu", gpus=1, cpu=60.0))
        assert isinstance(cpu_bound, Rejection) and cpu_bound.node_reasons == (("a", "cpu_cores over threshold 0.9"),)

    def test_shared_requests_stay_under_the_threshold(self) -> None:
        """In whole-gpus mode a share of a GPU is still held to the threshold in the GPU dimensions."""
        cluster = ClusterSnapshot(nodes=(make_node("a", gpus=1, gpu_mem_gib=80),))
        engine = PlacementEngine.from_name(cluster, "first-fit", 0.9)
        half = make_request("half", gpus=0.5, per_gpu_gib=10, allow_sharing=True)
        more = make_request("more", gpus=0.5, per_gpu_gib=10, allow_sharing=True)
        assert isinstance(engine.place(half), Placement)
        decision = engine.place(more)   # 0.5 + 0.5 = 1 > 0.9 × 1
        assert isinstance(decision, Rejection) and decision.node_reasons == (("a", "gpus over threshold 0.9"),)
        # A whole GPU is not held to it: a 1-GPU request on an idle 1-GPU node fits.
        idle = PlacementEngine.from_name(cluster, "first-fit", 0.9)
        assert isinstance(idle.place(make_request("whole", gpus=1)), Placement)

    def test_more_gpus_than_any_node_has(self) -> None:
        """16 GPUs per node on 8-GPU nodes: refused from the bounds, with a reason naming the GPU count."""
        cluster = ClusterSnapshot(nodes=(make_node("a", gpus=8),))
        decision = PlacementEngine.from_name(cluster, "max-utilization").place(make_request("big", gpus=16))
        assert isinstance(decision, Rejection) and "gpus more than any node has" in decision.reason

    def test_gang_is_all_or_nothing(self) -> None:
        """A 3-node gang on a cluster where only 2 nodes qualify is refused and reserves nothing."""
        cluster = ClusterSnapshot(nodes=(make_node("a"), make_node("b"), make_node("c", used_gpus=8)))
        engine = PlacementEngine.from_name(cluster, "load-balancing", 0.9)
        [decision] = engine.place_batch([make_request("gang", gpus=4, nodes=3)])
        assert isinstance(decision, Rejection) and "only 2 qualify" in decision.reason
        assert engine.snapshot() == cluster

    def test_dominated_request_is_refused_like_the_first(self) -> None:
        """After a refusal, a request needing no less is refused with the first one's node reasons, and a reason
        that does not depend on which task was refused first (so that it stays the same from cycle to cycle
        while the queue drains)."""
        cluster = ClusterSnapshot(nodes=(make_node("a", gpus=4, used_gpus=2, cpu=8),))
        reasons = []
        for ahead in ("x", "w"):
            engine = PlacementEngine.from_name(cluster, "first-fit", 1.0)
            first, second = engine.place_batch([make_request(ahead, gpus=2, cpu=9), make_request("y", gpus=2, cpu=10)])
            assert isinstance(first, Rejection) and isinstance(second, Rejection)
            assert "needing no more, was refused" in second.reason and second.node_reasons == first.node_reasons
            reasons.append(second.reason)
        assert reasons[0] == reasons[1] and "task x" not in reasons[0]

    def test_power_efficient_does_not_scale_out(self) -> None:
        """Alg. 3 waits instead of asking for a new node."""
        engine = PlacementEngine.from_name(ClusterSnapshot(nodes=(make_node("a", gpus=1),)), "power-efficient")
        [decision] = engine.place_batch([make_request("t", gpus=2)])
        assert isinstance(decision, Rejection) and decision.scale_out is False


class TestBatches:
    """Batch order, releases and snapshots."""

    def test_decisions_align_with_input_order(self) -> None:
        """Alg. 1 decides the 4-GPU request first but answers in the caller's order."""
        cluster = ClusterSnapshot(nodes=(make_node("a", gpus=4),))
        small, big = make_request("small", gpus=1), make_request("big", gpus=4)
        decisions = PlacementEngine.from_name(cluster, "max-utilization", 1.0).place_batch([small, big])
        # Sorted by demand, "big" takes all 4 GPUs first; "small" then finds nothing.
        assert [d.task_id for d in decisions] == ["small", "big"]
        assert isinstance(decisions[0], Rejection) and isinstance(decisions[1], Placement)

    def test_keep_order_decides_in_queue_order(self) -> None:
        """With keep_order the first request in the queue is decided first."""
        cluster = ClusterSnapshot(nodes=(make_node("a", gpus=4),))
        decisions = PlacementEngine.from_name(cluster, "max-utilization", 1.0).place_batch(
            [make_request("small", gpus=1), make_request("big", gpus=4)], keep_order=True
        )
        assert isinstance(decisions[0], Placement) and isinstance(decisions[1], Rejection)

    @pytest.mark.parametrize("enabled", [True, False])
    def test_collector_paused_during_a_batch_and_restored(self, enabled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
        """The cyclic collector is off while the batch decides and back as it was afterwards, even on error."""
        seen: list[bool] = []
        original = PlacementEngine.place

        def place(engine: PlacementEngine, req: Request) -> Decision:
            seen.append(gc.isenabled())
            if req.task_id == "boom":
                raise RuntimeError("boom")
            return original(engine, req)

        monkeypatch.setattr(PlacementEngine, "place", place)
        engine = PlacementEngine.from_name(ClusterSnapshot(nodes=(make_node("a", gpus=4),)), "first-fit", 1.0)
        (gc.enable if enabled else gc.disable)()
        try:
            engine.place_batch([make_request("one", gpus=1), make_request("two", gpus=1)])
            assert seen == [False, False] and gc.isenabled() is enabled
            with pytest.raises(RuntimeError):
                engine.place_batch([make_request("boom", gpus=1)])
            assert gc.isenabled() is enabled
        finally:
            gc.enable()

    def test_release_gives_room_back(self) -> None:
        """Releasing a placement restores the snapshot and lets a refused request through."""
        cluster = ClusterSnapshot(nodes=(make_node("a", gpus=2, gpu_mem_gib=40),))
        engine = PlacementEngine.from_name(cluster, "first-fit", 1.0)
        placed = engine.place(make_request("one", gpus=0.5, per_gpu_gib=10, allow_sharing=True))
        assert isinstance(placed, Placement) and placed.assignments[0].gpu_share == 0.5
        assert isinstance(engine.place(make_request("two", gpus=2, per_gpu_gib=40)), Rejection)
        engine.release(placed, 10 * GIB)
        assert engine.snapshot() == cluster
        assert isinstance(engine.place(make_request("two", gpus=2, per_gpu_gib=40)), Placement)

    def test_unschedulable_and_constrained_nodes_are_skipped(self) -> None:
        """Cordoned nodes, other GPU models and missing labels are filtered before ranking."""
        cluster = ClusterSnapshot(nodes=(
            make_node("cordoned", schedulable=False, labels={"zone": "a"}),
            make_node("a100", gpu_model="NVIDIA A100-SXM4-80GB", labels={"zone": "a"}),
            make_node("zone-b", labels={"zone": "b"}),
            make_node("fits", labels={"zone": "a"}),
        ))  # fmt: skip
        req = make_request("t", gpus=1, gpu_model="h100", node_selector={"zone": "a"})
        [decision] = PlacementEngine.from_name(cluster, "first-fit").place_batch([req])
        assert isinstance(decision, Placement) and decision.node_ids == ("fits",)

    def test_empty_cluster_refuses(self) -> None:
        """With no nodes every request waits."""
        [decision] = PlacementEngine.from_name(ClusterSnapshot(nodes=()), "random", seed=1).place_batch(
            [make_request("t", gpus=1)]
        )
        assert isinstance(decision, Rejection)


class TestAvoidNodes:
    @pytest.mark.parametrize("policy", sorted(POLICIES))
    def test_avoided_nodes_are_never_chosen(self, policy: str) -> None:
        """A request that avoids nodes never lands on them (first of its shape and again from the shape cache),
        and is refused, saying why, when only avoided nodes have room."""
        cluster = ClusterSnapshot(nodes=tuple(make_node(f"n{i}", gpus=4) for i in range(3)))
        engine = PlacementEngine.from_name(cluster, policy, 1.0, seed=1)
        avoid = frozenset({"n0", "n1"})
        for k in range(4):   # n2's four GPUs, one at a time
            d = engine.place(Request(f"r{k}", Resources(gpus=1, cpu_cores=1.0), avoid_nodes=avoid))
            assert isinstance(d, Placement) and d.node_ids == ("n2",), d
        refused = engine.place(Request("r4", Resources(gpus=1, cpu_cores=1.0), avoid_nodes=avoid))
        assert isinstance(refused, Rejection)
        assert "another replica of its service runs there" in str(refused)
        anywhere = engine.place(Request("r5", Resources(gpus=1, cpu_cores=1.0)))
        assert isinstance(anywhere, Placement) and anywhere.node_ids[0] in avoid
