"""Tests for the Resource Allocator (coordinator/allocator.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_builders import GIB, make_node, make_request

from common.errors import PlacementError
from common.scheduling import NodeAssignment
from coordinator.allocator import allocate, choose_gpu_indices, choose_gpus, release, reserve


class TestChooseGpuIndices:
    """Best fit on free memory, topology-aware for multi-GPU requests, shares packed."""

    @pytest.mark.parametrize(
        ("mem", "share", "topology", "whole", "frac", "need", "expected"),
        [
            # best fit: the GPU with the least free memory that still has 30 → index 2 (40).
            ([80, 50, 40, 20], [1, 1, 1, 1], [-1] * 4, 1, 0.0, 30, (2,)),
            # two GPUs, no topology: the two tightest fits, 40 and 50 → (1, 2).
            ([80, 50, 40, 20], [1, 1, 1, 1], [-1] * 4, 2, 0.0, 30, (1, 2)),
            # one group beats the tighter pair across groups (50 + 60 = 110): group 0 = GPUs 0, 3
            # leaves 50 + 80 = 130, group 1 = GPUs 1, 2 leaves 60 + 80 = 140 → (0, 3).
            ([50, 60, 80, 80], [1, 1, 1, 1], [0, 1, 1, 0], 2, 0.0, 40, (0, 3)),
            # a tighter group wins: group 0 (50 + 60 = 110) over group 1 (80 + 80 = 160).
            ([50, 60, 80, 80], [1, 1, 1, 1], [0, 0, 1, 1], 2, 0.0, 40, (0, 1)),
            # no group holds three: best fit across groups.
            ([50, 60, 80, 80], [1, 1, 1, 1], [0, 0, 1, 1], 3, 0.0, 40, (0, 1, 2)),
            # partly shared GPUs are skipped for whole GPUs.
            ([80, 80], [0.5, 1], [-1, -1], 1, 0.0, 10, (1,)),
            # a share goes to the busiest GPU that still fits it: index 2 (10 GiB and 0.25 left).
            ([80, 30, 10], [1, 0.5, 0.25], [-1] * 3, 0, 0.25, 8, (2,)),
            # not enough share anywhere.
            ([80, 80], [0.1, 0.2], [-1, -1], 0, 0.25, 8, None),
            # not enough whole GPUs.
            ([80, 80], [1, 0], [-1, -1], 2, 0.0, 8, None),
            # CPU-only task: no GPU.
            ([80], [1], [-1], 0, 0.0, 0, ()),
        ],
    )  # fmt: skip
    def test_table(
        self,
        mem: list[int],
        share: list[float],
        topology: list[int],
        whole: int,
        frac: float,
        need: int,
        expected: tuple[int, ...] | None,
    ) -> None:
        """Each row: free memory (GiB), free share, groups, request → positions chosen."""
        got = choose_gpu_indices(
            [m * GIB for m in mem], share, topology, whole=whole, share=frac, mem_per_gpu=need * GIB
        )
        assert got == expected


class TestReservations:
    """allocate, reserve and release turn a node choice into reservations and back."""

    def test_allocate_reserve_release_round_trip(self) -> None:
        """Two GPUs are reserved on the node and released back to the original snapshot."""
        node = make_node("n", gpus=4, used_gpus=1, topology=(0, 0, 1, 1))
        req = make_request("t", gpus=2, per_gpu_gib=40, cpu=8, mem_gib=64)
        assignment = allocate(req, node)
        # GPU 0 is taken; group 1 (GPUs 2, 3) is the only group with two free GPUs.
        assert assignment == NodeAssignment("n", (2, 3), 1.0)
        reserved = reserve(node, assignment, req.demand, req.gpu_mem_per_gpu_bytes)
        assert reserved.used.gpus == 3 and [g.share_free for g in reserved.gpus] == [0.0, 1.0, 0.0, 0.0]
        assert reserved.gpus[2].mem_free_bytes == 40 * GIB
        assert release(reserved, assignment, req.demand, req.gpu_mem_per_gpu_bytes) == node

    def test_shares_add_up(self) -> None:
        """Four 0.25 shares fill one GPU before the next is used, and releasing them makes it whole."""
        node = make_node("n", gpus=2, gpu_mem_gib=40)
        req = make_request("t", gpus=0.25, per_gpu_gib=5, allow_sharing=True)
        assignments = []
        for _ in range(5):
            assignment = allocate(req, node)
            assignments.append(assignment)
            node = reserve(node, assignment, req.demand, req.gpu_mem_per_gpu_bytes)
        assert [a.gpu_indices for a in assignments] == [(0,), (0,), (0,), (0,), (1,)]
        assert all(a.gpu_share == 0.25 for a in assignments)
        for assignment in assignments:
            node = release(node, assignment, req.demand, req.gpu_mem_per_gpu_bytes)
        assert [g.share_free for g in node.gpus] == [1.0, 1.0]

    def test_choose_gpus_maps_positions_to_indices(self) -> None:
        """GPU indices, not list positions, are returned."""
        node = make_node("n", gpus=2)
        gpus = tuple(replace(g, index=g.index + 4) for g in node.gpus)
        assert choose_gpus(make_request("t", gpus=1), gpus) == ((4,), 1.0)

    def test_allocate_refuses_when_gpus_are_taken(self) -> None:
        """A node with no free GPU is a placement error naming the node and task."""
        with pytest.raises(PlacementError, match="node 'n' has no GPUs for task 't'"):
            allocate(make_request("t", gpus=1), make_node("n", gpus=1, used_gpus=1))
