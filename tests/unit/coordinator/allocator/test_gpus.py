"""Tests for the Resource Allocator's GPU choice (coordinator/allocator/gpus.py)."""

from __future__ import annotations

import pytest

from coordinator.allocator.gpus import choose_gpu_indices

GIB = 1024**3


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


class TestDegradedLast:
    """DEGRADED GPUs (``avoid``) are taken only when the node's other GPUs cannot hold the task."""

    def test_whole_gpu_skips_a_degraded_best_fit(self) -> None:
        mem = [40 * GIB, 80 * GIB, 80 * GIB]
        assert choose_gpu_indices(mem, [1, 1, 1], [-1] * 3, whole=1, share=0.0, mem_per_gpu=GIB) == (0,)
        assert choose_gpu_indices(mem, [1, 1, 1], [-1] * 3, whole=1, share=0.0, mem_per_gpu=GIB,
                                  avoid=frozenset({0})) == (1,)

    def test_degraded_taken_when_nothing_else_fits(self) -> None:
        assert choose_gpu_indices([80 * GIB] * 2, [1, 1], [-1, -1], whole=2, share=0.0, mem_per_gpu=GIB,
                                  avoid=frozenset({0})) == (0, 1)
        assert choose_gpu_indices([80 * GIB] * 2, [1, 0.5], [-1, -1], whole=0, share=0.5, mem_per_gpu=GIB,
                                  avoid=frozenset({1})) == (0,)
