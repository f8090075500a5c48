"""Tests for the scheduling data types (common/scheduling.py)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from coordinator.domain import (
    ClusterSnapshot,
    NodeAssignment,
    NodeSnapshot,
    Placement,
    PowerCurve,
    Request,
    Resources,
    new_assignment,
    new_placement,
    queue_key,
)


class TestResources:
    """Vector arithmetic over the five dimensions."""

    def test_add_sub_scale(self) -> None:
        """add, sub and scale work element-wise and sub may go negative."""
        a, b = Resources(1.0, 10, 2.0, 100, 1000), Resources(0.5, 5, 1.0, 50, 500)
        assert a.add(b) == Resources(1.5, 15, 3.0, 150, 1500)
        assert b.sub(a) == Resources(-0.5, -5, -1.0, -50, -500)
        assert b.scale(2) == Resources(1.0, 10, 2.0, 100, 1000)
        assert a.as_tuple() == (1.0, 10, 2.0, 100, 1000)
        assert Resources().is_zero() and not a.is_zero()


class TestNodeAndPower:
    """Derived node values."""

    @pytest.mark.parametrize(("util", "watts"), [(0.0, 100.0), (0.5, 250.0), (1.0, 400.0)])
    def test_power_curve(self, util: float, watts: float) -> None:
        """power(u) = idle + (max - idle) · u."""
        assert PowerCurve(100.0, 400.0).power(util) == watts

    def test_compute_util(self) -> None:
        """used/capacity GPUs, 0 on a node without GPUs; by_id indexes nodes."""
        node = NodeSnapshot("a", capacity=Resources(gpus=8.0), used=Resources(gpus=2.0))
        cpu_only = NodeSnapshot("b", capacity=Resources(cpu_cores=4.0))
        assert node.compute_util == 0.25 and cpu_only.compute_util == 0.0
        assert ClusterSnapshot(nodes=(node, cpu_only)).by_id()["b"] is cpu_only


class TestRequest:
    """Request helpers and queue order."""

    @pytest.mark.parametrize(
        ("gpus", "sharing", "whole"),
        [(0.0, False, 0), (0.5, True, 0), (0.5, False, 1), (1.0, False, 1), (4.0, True, 4)],
    )
    def test_whole_gpus(self, gpus: float, sharing: bool, whole: int) -> None:
        """A fraction is a share only when sharing is allowed; otherwise it takes a whole GPU."""
        assert Request("t", Resources(gpus=gpus), allow_sharing=sharing).whole_gpus == whole

    def test_gang_of_zero_is_refused(self) -> None:
        """A request for zero nodes cannot be built."""
        with pytest.raises(ValueError, match="nodes must be ≥ 1"):
            Request("t", Resources(gpus=1.0), nodes=0)

    def test_compute_demand(self) -> None:
        """Compute demand counts every node of a gang."""
        assert Request("t", Resources(gpus=4.0), nodes=3).compute_demand == 12.0

    def test_queue_order(self) -> None:
        """Priority first (higher first), then deadline (earlier first, none last), then submit time."""
        reqs = [
            Request("late-low", Resources(), priority=0, submit_s=1.0),
            Request("no-deadline", Resources(), priority=5, submit_s=0.0),
            Request("deadline-20", Resources(), priority=5, submit_s=9.0, deadline_s=20.0),
            Request("deadline-10", Resources(), priority=5, submit_s=9.0, deadline_s=10.0),
            Request("early-low", Resources(), priority=0, submit_s=0.5),
        ]
        ordered = [r.task_id for r in sorted(reqs, key=queue_key)]
        assert ordered == ["deadline-10", "deadline-20", "no-deadline", "early-low", "late-low"]


class TestDecisionBuilders:
    def test_built_like_the_constructors(self) -> None:
        """The engine's builders give objects equal to (and hashed like) the constructors' ones, still frozen."""
        demand = Resources(gpus=2.0, gpu_mem_total_bytes=80, cpu_cores=4.0, mem_bytes=1, disk_bytes=2)
        a = new_assignment("n1", (0, 3), 1.0)
        assert a == NodeAssignment("n1", (0, 3), 1.0) and hash(a) == hash(NodeAssignment("n1", (0, 3), 1.0))
        p = new_placement("t1", (a,), demand, "random")
        assert p == Placement("t1", (NodeAssignment("n1", (0, 3), 1.0),), demand, "random")
        assert p.node_ids == ("n1",)
        with pytest.raises(FrozenInstanceError):
            a.gpu_share = 0.5  # type: ignore[misc]
        with pytest.raises(FrozenInstanceError):
            p.policy = "first-fit"  # type: ignore[misc]
