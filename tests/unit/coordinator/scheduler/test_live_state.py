"""The placement state kept across cycles (coordinator/scheduler/placement/live.py) against a full rebuild.

Hypothesis draws sequences of cycles: each places a batch on the live engine, the leader stores
what it placed, then some nodes change (a task ends and frees a node, the power curve or power
state moves, a node is cordoned or relabelled, a node is replaced by another inventory, a node
joins or leaves). After every update the live state must hold exactly what a state built from
the same snapshot holds, and the live engine must decide a batch exactly as a fresh one.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain import ClusterSnapshot, NodeSnapshot, PowerCurve, Request, Resources
from coordinator.scheduler.placement.engine import PlacementEngine
from coordinator.scheduler.placement.live import LivePlacement
from coordinator.scheduler.placement.state import PlacementState
from coordinator.scheduler.policies import POLICIES
from tests.helpers.builders import GIB, make_node, make_request, random_cluster, random_requests

OPS = ("release", "replace", "power", "cordon", "label", "add", "remove", "nothing")


def requests(rng: random.Random, n: int) -> list[Request]:
    """Whole-GPU, CPU-only and shared-GPU requests (some gangs, some with constraints)."""
    out = random_requests(rng, n)
    for k in range(n // 3):
        share = rng.choice((0.25, 0.5))
        out.append(Request(f"s{k:03d}", Resources(share, 8 * GIB, 1.0, 4 * GIB, 0), allow_sharing=True,
                           gpu_mem_per_gpu_bytes=8 * GIB, node_selector={"rack": "r1"} if rng.random() < 0.3 else {}))
    return out


def partial(state: PlacementState) -> set[tuple[int, int, float, float]]:
    """The shared-GPU index as a set of (node, slot, share free, memory free)."""
    p = state._partial
    return {(key[0], key[1], float(p._share[pos]), float(p._mem[pos])) for key, pos in p.where.items()}


def assert_same(live: PlacementState, fresh: PlacementState) -> None:
    """Everything placement reads is equal (the live state may only have looser lower bounds)."""
    assert live.nodes == fresh.nodes
    for name in ("cap", "limit", "hlimit", "shared_limit", "schedulable"):
        assert np.array_equal(getattr(live, name), getattr(fresh, name)), name
    assert np.array_equal(live.used_array(), fresh.used_array())   # also brings whole_desc up to date
    # The live state keeps the width it was built with (nodes may since have fewer GPUs): rows past
    # the rebuilt one's are padding (-1) only, and change no answer.
    width = fresh.width
    assert np.array_equal(live.whole_desc[:width], fresh.whole_desc)
    assert np.all(live.whole_desc[width:] == -1.0)
    assert live.whole_bound[:width] == fresh.whole_bound
    assert np.array_equal(live.headroom, fresh.headroom)
    for name in ("util", "neg_util", "used_gpus", "cap_gpus_safe", "idle_w", "slope_w", "before_w"):
        assert np.array_equal(getattr(live.view, name), getattr(fresh.view, name)), name
    for name in ("rows", "free_desc", "slot_ids",
                 "slot_total", "slot_mem", "slot_share", "slot_topology", "plain_ids", "node_ids", "power_rows",
                 "schedulable_list", "limit_bound", "room_bound", "slack"):
        assert getattr(live, name) == getattr(fresh, name), name
    assert partial(live) == partial(fresh)
    assert all(low <= real for low, real in zip(live.room_min, fresh.room_min, strict=True))


def change(rng: random.Random, nodes: list[NodeSnapshot], op: str) -> None:
    """One change to the cluster, in place."""
    if not nodes:
        return
    k = rng.randrange(len(nodes))
    node = nodes[k]
    if op == "release":
        gpus = tuple(replace(g, mem_free_bytes=g.mem_total_bytes, share_free=1.0) for g in node.gpus)
        nodes[k] = replace(node, used=Resources(), gpus=gpus)
    elif op == "replace":
        nodes[k] = replace(random_cluster(rng, 1).nodes[0], node_id=node.node_id)
    elif op == "power":
        nodes[k] = replace(node, power=PowerCurve(idle_w=rng.choice((50.0, 90.0)), max_w=rng.choice((400.0, 900.0))),
                           powered_on=not node.powered_on)
    elif op == "cordon":
        nodes[k] = replace(node, schedulable=not node.schedulable)
    elif op == "label":
        nodes[k] = replace(node, labels={"rack": rng.choice(("r0", "r1"))}, gpu_model=rng.choice(("NVIDIA L4", "H100")))
    elif op == "add":
        nodes.append(replace(random_cluster(rng, 1).nodes[0], node_id=f"z{rng.randrange(10**6):06d}"))
    elif op == "remove":
        del nodes[k]


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(sorted(POLICIES)),
       cycles=st.lists(st.lists(st.sampled_from(OPS), max_size=4), min_size=1, max_size=5))
def test_incremental_equals_rebuilt(seed: int, policy: str, cycles: list[list[str]]) -> None:
    """Random cycles of placements, releases and node changes: the live state equals the rebuilt one."""
    rng = random.Random(seed)
    threshold = rng.choice((0.7, 0.9, 1.0))
    mode = rng.choice(("whole-gpus", "paper"))
    gang_label = rng.choice(("", "rack"))
    start = random_cluster(rng, rng.randint(1, 12)).nodes
    nodes = [replace(n, labels={"rack": f"r{i % 2}"}) for i, n in enumerate(start)]
    snapshot = ClusterSnapshot(nodes=tuple(nodes))
    live = LivePlacement()
    for ops in cycles:
        batch = requests(rng, rng.randint(1, 12))
        name = policy if rng.random() < 0.7 else rng.choice(sorted(POLICIES))   # the policy in force may change
        engine = live.engine(snapshot, name, threshold, seed=seed, mode=mode, gang_label=gang_label)
        fresh = PlacementEngine.from_name(snapshot, name, threshold, seed=seed, mode=mode, gang_label=gang_label)
        assert live.state is not None
        assert_same(live.state, fresh.state)
        decided = engine.place_batch(batch)
        assert decided == fresh.place_batch(batch)
        # The leader stores what was placed: those nodes' next snapshots carry the reservations
        # (new objects); every other node keeps its object.
        stored = fresh.snapshot().nodes
        nodes = [stored[i] if fresh.state.touched(i) else snapshot.nodes[i] for i in range(len(stored))]
        for op in ops:
            change(rng, nodes, op)
        nodes.sort(key=lambda n: n.node_id)
        snapshot = ClusterSnapshot(nodes=tuple(nodes), taken_at_s=rng.random())
    engine = live.engine(snapshot, policy, threshold, seed=seed, mode=mode, gang_label=gang_label)
    assert live.state is not None
    assert_same(live.state, PlacementState(snapshot, threshold, mode))


def test_unchanged_cycle_applies_nothing() -> None:
    """A cycle whose snapshot hands the same node objects, after a batch that placed nothing, applies no node."""
    snapshot = random_cluster(random.Random(3), 40)
    live = LivePlacement()
    live.engine(snapshot, "max-utilization")
    live.engine(snapshot, "max-utilization")
    assert (live.builds, live.applied) == (1, 0)


@pytest.mark.parametrize("policy", ["random", "first-fit", "round-robin"])
def test_view_left_to_the_columns_write_equals_committed(policy: str) -> None:
    """A policy that does not read the view leaves a commit's utilization, GPUs reserved and power to
    the columns' write: in Python for a few nodes, with numpy for many (here 200), the values are
    bit for bit those of commits that write them at once, and of a state rebuilt from the result."""
    rng = random.Random(11)
    nodes = [make_node(f"n{i:03d}", used_gpus=rng.choice((0, 0, 2, 5)), idle_w=300.0 + i, max_w=4000.0 + 7 * i,
                       powered_on=rng.random() < 0.8) for i in range(200)]
    snapshot = ClusterSnapshot(nodes=tuple(nodes))
    # One shape (its entry is replayed node by node, never rebuilt, so nothing writes the columns
    # until the end), four GPUs each: about one request per node.
    batch = [make_request(f"t{k:03d}", gpus=4.0, cpu=2.0) for k in range(150)]
    for few in (False, True):
        deferred = PlacementEngine.from_name(snapshot, policy, 0.9, seed=3)
        at_once = PlacementEngine.from_name(snapshot, policy, 0.9, seed=3)
        at_once.state.set_derive_on_commit(True)
        assert not deferred.state.derive_on_commit
        chosen = batch[:10] if few else batch
        assert deferred.place_batch(chosen) == at_once.place_batch(chosen)
        dirty = len(deferred.state._dirty)
        assert (dirty < 64) if few else (dirty >= 64)   # the Python and the numpy write
        rebuilt = PlacementState(deferred.snapshot(), 0.9, deferred.policy.threshold_mode)
        for state in (deferred.state, at_once.state, rebuilt):
            state.used_array()
        for name in ("util", "neg_util", "used_gpus", "before_w"):
            values = getattr(deferred.state.view, name).tobytes()   # bytes: -0.0 and 0.0 differ
            assert values == getattr(at_once.state.view, name).tobytes(), name
            assert np.array_equal(getattr(deferred.state.view, name), getattr(rebuilt.view, name)), name
