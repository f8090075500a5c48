"""Time-aware packing: tasks expected to end together share a node."""

from __future__ import annotations

import random

import pytest

from common.domain import ClusterSnapshot, Placement, Request, Resources
from coordinator.scheduler.placement import shape_cache
from coordinator.scheduler.placement.engine import PlacementEngine
from coordinator.scheduler.policies import time_aware
from tests.helpers.builders import GIB, make_node, random_cluster, random_requests


def req(task_id: str, gpus: int, run_s: float | None) -> Request:
    """A whole-GPU request expected to run ``run_s`` seconds."""
    return Request(task_id=task_id, demand=Resources(gpus=float(gpus), cpu_cores=1.0, mem_bytes=GIB),
                   expected_run_s=run_s)


def place(engine: PlacementEngine, request: Request) -> str:
    """Place one request; the node it landed on."""
    decision = engine.place(request)
    assert isinstance(decision, Placement)
    return decision.node_ids[0]


class TestTimeAware:
    """The node whose work ends closest to the request's expected end wins; empty nodes come last."""

    def engine(self, now: float = 1000.0) -> PlacementEngine:
        nodes = tuple(make_node(n, gpus=4, used_gpus=0) for n in ("n1", "n2", "n3"))
        return PlacementEngine(ClusterSnapshot(nodes=nodes), time_aware.build(1.0, now=lambda: now))

    def test_similar_end_times_share_a_node(self) -> None:
        """A short and a long task on two nodes: a later short task joins the short one, a long one the long one."""
        engine = self.engine()
        assert place(engine, req("long", 3, 5000.0)) == "n1"
        assert place(engine, req("short", 3, 100.0)) == "n2"      # n1 has no room for 3 more GPUs
        assert place(engine, req("short2", 1, 90.0)) == "n2"     # ends at 1090, n2 at 1100, n1 at 6000
        assert place(engine, req("long2", 1, 5100.0)) == "n1"

    def test_busy_nodes_before_empty_ones(self) -> None:
        """A task goes next to running work (so nodes empty together) before it opens an empty node."""
        engine = self.engine()
        assert place(engine, req("a", 1, 10.0)) == "n1"
        assert place(engine, req("b", 1, 100_000.0)) == "n1"

    def test_without_expected_run_time_fullest_node_first(self) -> None:
        """A request without an expected run time falls back to Alg. 1's order (fullest node first)."""
        engine = self.engine()
        assert place(engine, req("a", 3, None)) == "n1"
        assert place(engine, req("b", 2, None)) == "n2"
        assert place(engine, req("c", 1, None)) == "n1"

    def test_emptied_node_forgets_its_end(self) -> None:
        """Once a node's work is released its old expected end no longer attracts tasks."""
        engine = self.engine()
        first = engine.place(req("a", 4, 100.0))
        assert isinstance(first, Placement) and first.node_ids == ("n1",)
        assert place(engine, req("b", 1, 5000.0)) == "n2"
        engine.release(first, 0)
        assert place(engine, req("c", 1, 100.0)) == "n2"   # n1 is empty now: busy n2 comes first


class TestIndexedSelection:
    """``select_indexed`` (the shape cache's key and block index, one pass for expected ends) chooses what
    ``select`` (every feasible node sorted) chooses, with releases in between as in the simulator."""

    def test_same_choices_as_the_sorted_order(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Random clusters and requests, some without an expected run time, some gangs; blocks of 3 nodes."""
        monkeypatch.setattr(shape_cache, "BLOCK", 3)
        for seed in range(150):
            rng = random.Random(80_000 + seed)
            cluster = random_cluster(rng, rng.randint(1, 30))
            clock = [1000.0]
            engines = []
            for indexed in (True, False):
                policy = time_aware.build(1.0, now=lambda c=clock: c[0])
                if not indexed:
                    monkeypatch.setattr(policy, "select_indexed",
                                        lambda view, entry, r, p=policy: p.select(view, entry.mask, r))
                engines.append(PlacementEngine(cluster, policy))
            placed: list[tuple[Placement, Request]] = []
            for k, base in enumerate(random_requests(rng, 60)):
                run_s = rng.choice((None, 50.0, 400.0, 3000.0))
                request = Request(task_id=f"t{k}", demand=base.demand, nodes=base.nodes, expected_run_s=run_s)
                clock[0] += rng.choice((0.0, 10.0, 200.0))
                if placed and rng.random() < 0.3:
                    done, done_req = placed.pop(rng.randrange(len(placed)))
                    for engine in engines:
                        engine.release(done, done_req.gpu_mem_per_gpu_bytes)
                decisions = [engine.place(request) for engine in engines]
                assert decisions[0] == decisions[1], (seed, k)
                if isinstance(decisions[0], Placement):
                    placed.append((decisions[0], request))
