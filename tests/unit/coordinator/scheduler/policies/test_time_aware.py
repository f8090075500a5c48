"""Time-aware packing: tasks expected to end together share a node."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest

from coordinator.domain import ClusterSnapshot, Placement, Request, Resources
from coordinator.scheduler.placement import shape_cache
from coordinator.scheduler.placement.engine import PlacementEngine
from coordinator.scheduler.placement.live import LivePlacement
from coordinator.scheduler.policies import POLICIES, time_aware
from coordinator.scheduler.policies.base import node_arrays
from coordinator.scheduler.policies.time_aware import END_BUCKET_S
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

    def test_ends_in_one_minute_count_as_together(self) -> None:
        """Ends are compared by the minute they fall in: within one, the fuller node wins, and a node
        a few seconds away but in another minute loses to one in the request's minute."""
        engine = self.engine(now=960.0)                       # minute 16
        assert place(engine, req("a", 3, 90.0)) == "n1"       # ends at 1050: minute 17
        assert place(engine, req("b", 2, 115.0)) == "n2"      # n1 has 1 GPU left; ends at 1075: minute 17
        assert place(engine, req("c", 1, 114.0)) == "n1"      # 1074: n2 is 1 s away, but n1 is fuller
        engine = self.engine(now=960.0)
        assert place(engine, req("a", 3, 90.0)) == "n1"       # 1050: minute 17
        assert place(engine, req("b", 2, 179.0)) == "n2"      # 1139: minute 18
        assert place(engine, req("c", 1, 121.0)) == "n2"      # 1081, minute 18: 31 s from n1, 58 s from n2

    def test_emptied_node_forgets_its_end(self) -> None:
        """Once a node's work is released its old expected end no longer attracts tasks."""
        engine = self.engine()
        first = engine.place(req("a", 4, 100.0))
        assert isinstance(first, Placement) and first.node_ids == ("n1",)
        assert place(engine, req("b", 1, 5000.0)) == "n2"
        engine.release(first, 0)
        assert place(engine, req("c", 1, 100.0)) == "n2"   # n1 is empty now: busy n2 comes first


class TestKeyForms:
    """The key's one-node form (what the shape cache updates a node with) equals its array form."""

    def test_one_node_form_equals_the_vectorised_form(self) -> None:
        """Random memories, utilizations (over-full nodes included) and clocks, timed or not."""
        for seed in range(200):
            rng = random.Random(95_000 + seed)
            n = rng.randint(1, 12)
            nodes = [make_node(f"n{i}", gpus=rng.choice((0, 4, 8)), used_gpus=0) for i in range(n)]
            view = node_arrays(nodes)
            view.used_gpus[:] = [rng.choice((0.0, 0.5, 1.0, 3.0, 9.0)) for _ in range(n)]
            view.neg_util[:] = [-rng.choice((0.0, 0.125, 0.5, 1.0, 1.125)) for _ in range(n)]
            clock = [rng.uniform(0.0, 1e9)]
            policy = time_aware.build(1.0, now=lambda c=clock: c[0])
            for _ in range(5):
                request = req("t", 1, rng.choice((None, 0.0, 59.0, 600.0, 1e12, float("inf"))))
                policy.shape_variant(request)
                if rng.random() < 0.8:
                    policy.shape_variant(request)   # asked for again: the shape cache keeps its key
                chosen = np.array(rng.sample(range(n), rng.randint(0, n)), dtype=np.int64)
                policy.select(view, np.isin(np.arange(n), chosen), request)
                policy.committed(policy.select(view, np.ones(n, dtype=np.bool_), request), n)
                keys = policy.key_array(view, request)
                assert [policy.key_at(view, request, i) for i in range(n)] == keys.tolist(), seed
                clock[0] += rng.choice((0.0, 30.0, 3600.0))


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
                    monkeypatch.setattr(policy, "select_one", lambda view, entry, r, p=policy: next(
                        iter(p.select(view, entry.mask, r).tolist()), -1))
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

    @pytest.mark.parametrize("repeated", [False, True])
    def test_choices_follow_the_rule(self, repeated: bool, monkeypatch: pytest.MonkeyPatch) -> None:
        """The engine's choices are the module docstring's rule, applied literally to the snapshot:
        busy feasible nodes by (minutes from the request's end minute, fuller first, snapshot order),
        then empty feasible nodes in snapshot order; memory kept per node as the docstring says.
        ``repeated``: a few shapes and a slow clock, so most lookups update a kept entry node by node
        (the key's one-node form) rather than build it."""
        monkeypatch.setattr(shape_cache, "BLOCK", 3)
        for seed in range(150):
            rng = random.Random(90_000 + seed)
            cluster = random_cluster(rng, rng.randint(1, 30))
            clock = [1000.0]
            policy = time_aware.build(rng.choice((0.8, 1.0)), now=lambda c=clock: c[0])
            engine = PlacementEngine(cluster, policy)
            n = len(cluster.nodes)
            memory: list[float | None] = [None] * n     # each node's remembered end minute
            placed: list[tuple[Placement, Request]] = []
            shapes = random_requests(rng, 3 if repeated else 60)
            for k in range(60):
                base = rng.choice(shapes) if repeated else shapes[k]
                run_s = rng.choice((None, 30.0, 400.0) if repeated else (None, 30.0, 50.0, 400.0, 3000.0))
                request = Request(task_id=f"t{k}", demand=base.demand, nodes=base.nodes, expected_run_s=run_s)
                clock[0] += rng.choice((0.0, 1.0, 5.0) if repeated else (0.0, 10.0, 45.0, 200.0))
                if placed and rng.random() < 0.3:
                    done, done_req = placed.pop(rng.randrange(len(placed)))
                    engine.release(done, done_req.gpu_mem_per_gpu_bytes)
                now_minute = clock[0] // END_BUCKET_S
                end_minute = now_minute if run_s is None else (clock[0] + run_s) // END_BUCKET_S
                nodes = [engine.node_snapshot(i) for i in range(n)]
                fits = [i for i in range(n) if policy.feasible(request, nodes[i]) is None]
                busy = [i for i in fits if nodes[i].used.gpus > 0]
                util = {i: min(1.0, nodes[i].used.gpus / nodes[i].capacity.gpus) for i in busy}
                if run_s is None:   # Alg. 1: fullest first (empty nodes have utilization 0)
                    order = sorted(fits, key=lambda i: (-util.get(i, 0.0), i))
                else:
                    away = {i: abs(max(now_minute if memory[i] is None else memory[i], now_minute) - end_minute)
                            for i in busy}   # minutes between the node's end minute and the request's
                    order = sorted(busy, key=lambda i: (away[i], -util[i], i))
                    order += [i for i in fits if i not in util]
                expected = order[: request.nodes] if len(order) >= request.nodes else []
                decision = engine.place(request)
                got = [engine.state.index[a.node_id] for a in decision.assignments] \
                    if isinstance(decision, Placement) else []
                assert got == expected, (seed, k)
                for i in got:
                    m = memory[i]
                    memory[i] = end_minute if i not in util or m is None else max(m, end_minute)
                if isinstance(decision, Placement):
                    placed.append((decision, request))


class TestKeptAcrossCycles:
    """The leader's placement state and shape cache are kept from cycle to cycle, each cycle with a
    fresh policy (a fresh memory of end minutes): its choices are a fresh engine's."""

    @pytest.mark.parametrize("many_ends", [False, True])
    def test_live_engine_decides_as_a_fresh_one(self, many_ends: bool, monkeypatch: pytest.MonkeyPatch) -> None:
        """Batches of a few shapes with expected run times, in the same minute cycle after cycle; with
        ``many_ends`` their end minutes are spread, so most take the present key."""
        clock = [1000.0]
        monkeypatch.setitem(POLICIES, time_aware.NAME, functools.partial(time_aware.build, now=lambda: clock[0]))
        monkeypatch.setattr(shape_cache, "BLOCK", 3)
        for seed in range(60):
            rng = random.Random(97_000 + seed)
            snapshot = random_cluster(rng, rng.randint(1, 30))
            shapes = random_requests(rng, 3)
            live = LivePlacement()
            for cycle in range(6):
                runs = [rng.uniform(60.0, 3e5) if many_ends else rng.choice((None, 30.0, 400.0)) for _ in range(15)]
                batch = [Request(task_id=f"c{cycle}-{k}", demand=s.demand, nodes=s.nodes, expected_run_s=runs[k])
                         for k, s in enumerate(rng.choices(shapes, k=rng.randint(1, 15)))]
                clock[0] += rng.choice((0.0, 1.0))
                engine = live.engine(snapshot, time_aware.NAME, 1.0)
                fresh = PlacementEngine.from_name(snapshot, time_aware.NAME, 1.0)
                assert engine.place_batch(batch) == fresh.place_batch(batch), (seed, cycle)
                if rng.random() < 0.8:   # the leader stored the placements: the next snapshot carries them
                    snapshot = fresh.snapshot()
