"""Tests for the per-shape feasibility cache (coordinator/_shape_cache.py).

Shapes repeat here on purpose (a small catalogue), so entries are reused after commits and
releases: the replay path (a few nodes re-checked), the rebuild path (too many changed), and
the log cut are all exercised, and each must leave exactly what a fresh vectorised pass gives.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_placement import assert_matches_reference, gpu_cluster

from coordinator.domain import Placement, Request, Resources
from coordinator.scheduler.placement import shape_cache as _shape_cache
from coordinator.scheduler.placement.engine import PlacementEngine
from coordinator.scheduler.placement.state import is_exact
from coordinator.scheduler.policies import POLICIES, random_policy
from tests.helpers.builders import GIB, make_request, random_cluster

POLICY_NAMES = sorted(p for p in POLICIES if p != "time-aware")  # no paper reference: its own tests


def catalogue(rng: random.Random, size: int, *, inexact: bool = False) -> list[Resources]:
    """A few demand vectors, the way the profiler produces few shapes."""
    shapes = []
    for _ in range(size):
        gpus = float(rng.choice((0, 1, 2, 4, 8)))
        cpu = 0.1 * rng.randint(1, 60) if inexact else rng.randint(1, 16) / 2
        shapes.append(Resources(gpus, int(gpus * rng.choice((10, 40, 80)) * GIB), cpu,
                                rng.randint(1, 96) * GIB, rng.randint(0, 300) * GIB))  # fmt: skip
    return shapes


def repeated_requests(rng: random.Random, n: int, shapes: list[Resources]) -> list[Request]:
    """``n`` requests drawn from ``shapes`` (some gangs)."""
    return [
        Request(f"t{k:03d}", rng.choice(shapes), nodes=rng.choice((1, 1, 1, 2)))
        for k in range(n)
    ]


def fresh_arrays(engine: PlacementEngine, req: Request) -> tuple[np.ndarray, np.ndarray | None]:
    """What a full vectorised pass gives now for the request's shape."""
    values = req.demand.as_tuple()
    mask = engine.state.feasible_mask(req, values, req.whole_gpus, is_exact(values))
    keyed = None
    if engine.policy.ranked_by_key:
        keyed = np.where(mask, engine.policy.key_array(engine.state.view, req), np.inf)
    return mask, keyed


class TestMatchesReference:
    """With shapes that repeat, the engine still makes the reference's choices."""

    @pytest.mark.parametrize("policy", POLICY_NAMES)
    def test_repeated_shapes(self, policy: str) -> None:
        """300 random clusters; each batch draws from 2-5 shapes, so most lookups replay changes."""
        for seed in range(300):
            rng = random.Random(50_000 + seed)
            cluster = random_cluster(rng, rng.randint(1, 40))
            requests = repeated_requests(rng, rng.randint(5, 80), catalogue(rng, rng.randint(2, 5)))
            assert_matches_reference(policy, cluster, requests, rng.choice((0.7, 0.9, 1.0)), seed)

    @pytest.mark.parametrize("policy", POLICY_NAMES)
    def test_many_blocks(self, policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """Blocks of 3 nodes: choices across many blocks (best key, k-th feasible node, gangs) are still
        the reference's."""
        monkeypatch.setattr(_shape_cache, "BLOCK", 3)
        for seed in range(200):
            rng = random.Random(70_000 + seed)
            cluster = random_cluster(rng, rng.randint(1, 40))
            requests = repeated_requests(rng, rng.randint(5, 80), catalogue(rng, rng.randint(2, 5)))
            assert_matches_reference(policy, cluster, requests, rng.choice((0.7, 0.9, 1.0)), seed)

    @pytest.mark.parametrize("policy", POLICY_NAMES)
    def test_repeated_inexact_shapes(self, policy: str) -> None:
        """Non-dyadic core counts (the general filter path) with repeated shapes."""
        for seed in range(60):
            rng = random.Random(60_000 + seed)
            cluster = random_cluster(rng, rng.randint(4, 30))
            requests = repeated_requests(rng, 60, catalogue(rng, 3, inexact=True))
            assert_matches_reference(policy, cluster, requests, 0.85, seed)


class TestEntriesStayExact:
    """After any sequence of commits and releases an entry equals a fresh vectorised pass."""

    @pytest.mark.parametrize("mode", ["whole-gpus", "paper"])
    @pytest.mark.parametrize("policy", ["max-utilization", "load-balancing", "power-efficient", "first-fit"])
    def test_commits_and_releases(self, policy: str, mode: str) -> None:
        """Shared GPUs, per-GPU memory and constraints, with releases between placements."""
        for seed in range(40):
            rng = random.Random(70_000 + seed)
            engine = PlacementEngine.from_name(gpu_cluster(rng, rng.randint(2, 12)), policy, 0.9, mode=mode)
            shapes = [
                make_request("s", gpus=0.25, per_gpu_gib=8, cpu=2.0, mem_gib=8, allow_sharing=True),
                make_request("s", gpus=1.0, per_gpu_gib=39, cpu=4.0, mem_gib=16),
                make_request("s", gpus=2.0, per_gpu_gib=20, cpu=8.0, mem_gib=32, gpu_model="H100"),
                make_request("s", gpus=0.0, cpu=6.0, mem_gib=48, node_selector={"zone": "a"}),
            ]
            placed: list[tuple[Placement, Request]] = []
            for k in range(120):
                if placed and rng.random() < 0.35:
                    done, done_req = placed.pop(rng.randrange(len(placed)))
                    engine.release(done, done_req.gpu_mem_per_gpu_bytes)
                req = rng.choice(shapes)
                values = req.demand.as_tuple()
                entry = engine._shapes.lookup(req, values, req.whole_gpus)
                entry.settle()   # nodes only committed to are re-checked lazily by first-fit and round-robin
                mask, keyed = fresh_arrays(engine, req)
                assert np.array_equal(entry.mask, mask), (seed, k)
                if keyed is not None:
                    assert np.array_equal(entry.keyed, keyed), (seed, k)
                decision = engine.place(req)
                if isinstance(decision, Placement):
                    placed.append((decision, req))

    def test_replay_rebuild_and_log_cut(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A few changed nodes are replayed in place; many make a rebuild; a long log drops every entry."""
        monkeypatch.setattr(_shape_cache, "_LOG_MAX", 50)
        rng = random.Random(7)
        # Round-robin puts consecutive requests on consecutive nodes: every placement changes a new node.
        engine = PlacementEngine.from_name(random_cluster(rng, 60), "round-robin", 1.0)
        probe = make_request("probe", gpus=0.0, cpu=0.5, mem_gib=1)
        filler = make_request("filler", gpus=0.0, cpu=0.5, mem_gib=2)
        values = probe.demand.as_tuple()
        cache = engine._shapes

        def lookup() -> np.ndarray:
            entry = cache.lookup(probe, values, 0)
            entry.settle()
            mask = entry.mask
            assert np.array_equal(mask, fresh_arrays(engine, probe)[0])
            return mask

        first = lookup()
        for _ in range(3):                     # fewer changed nodes than the replay limit (8 + 60 // 256)
            assert isinstance(engine.place(filler), Placement)
        assert lookup() is first               # replayed in place
        for _ in range(20):                    # more than the limit
            assert isinstance(engine.place(filler), Placement)
        rebuilt = lookup()
        assert rebuilt is not first
        engine.place(filler)
        assert len(cache) == 2 and lookup() is rebuilt
        for _ in range(40):                    # the log passes 50 entries: cut, entries dropped
            assert isinstance(engine.place(filler), Placement)
        assert len(engine.state.changes) < 40  # 25 + 40 entries without the cut
        assert lookup() is not rebuilt


class TestRandomDraws:
    """The random baseline draws the same nodes from a shape entry as from a listing of its mask."""

    def test_entry_and_listing_draw_alike(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Blocks of 3; one node and gangs of 2-5, dense and sparse masks: ``select_indexed`` (the entry's
        flags, block counts, nodes set aside) gives ``select``'s nodes (a listing), and leaves the entry
        as it was."""
        monkeypatch.setattr(_shape_cache, "BLOCK", 3)
        branches = set()
        for seed in range(150):
            rng = random.Random(90_000 + seed)
            engine = PlacementEngine.from_name(random_cluster(rng, rng.randint(1, 60)), "random", 1.0, seed=seed)
            for k, shape in enumerate(catalogue(rng, 4)):
                req = Request(f"t{k}", shape, nodes=rng.choice((1, 2, 3, 5)))
                values = req.demand.as_tuple()
                entry = engine._shapes.lookup(req, values, req.whole_gpus)
                before = (entry.mask.copy(), list(entry.block_count), list(entry.group_count), entry.feasible)
                from_entry = random_policy.build(1.0, seed=seed + k).select_indexed(engine.state.view, entry, req)
                listed = random_policy.build(1.0, seed=seed + k).select(engine.state.view, entry.mask.copy(), req)
                assert from_entry.tolist() == listed.tolist(), (seed, k)
                assert np.array_equal(entry.mask, before[0])
                assert (entry.block_count, entry.group_count, entry.feasible) == before[1:]
                dense = random_policy.DENSE * entry.feasible >= len(entry.mask)
                branches.add((dense, req.nodes > 1, len(from_entry) > 0))
        # Every way but a dense mask refusing one node (dense: at least one is feasible).
        assert branches == {(d, g, p) for d in (True, False) for g in (True, False) for p in (True, False)
                            if d <= (g or p)}
