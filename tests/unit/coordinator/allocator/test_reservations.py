"""Tests for the one reservation model (coordinator/allocator/reservations.py)."""

from __future__ import annotations

import pytest

from coordinator.allocator.reservations import (
    NodeReservation,
    ReservationConflict,
    give_back_gpu,
    gpu_usage,
    take_gpu,
)
from coordinator.domain import Resources

GIB = 1024**3


def vec(gpus: float, gib: int = 0, cores: float = 0.0) -> Resources:
    """A demand vector with ``gib`` GiB of GPU memory in all."""
    return Resources(gpus=gpus, gpu_mem_total_bytes=gib * GIB, cpu_cores=cores)


class TestNodeReservation:
    def test_add_then_remove_is_empty(self) -> None:
        """Adding allocations and removing them again leaves nothing reserved."""
        r = NodeReservation().add("n", vec(2, 80, 8), (0, 1), 1.0).add("n", vec(1, 40, 4), (3,), 1.0)
        assert r.used == vec(3, 120, 12) and r.gpu_indices == (0, 1, 3)
        r = r.remove(vec(2, 80, 8), (0, 1)).remove(vec(1, 40, 4), (3,))
        assert r == NodeReservation()

    def test_whole_gpu_taken_twice_conflicts(self) -> None:
        """A whole-GPU allocation on a reserved GPU is refused, naming node and GPU."""
        r = NodeReservation().add("n", vec(1), (2,), 1.0)
        with pytest.raises(ReservationConflict, match="node n: GPU 2 already reserved"):
            r.add("n", vec(1), (2,), 1.0)

    def test_shares_stack_on_one_gpu(self) -> None:
        """Shared allocations may hold the same GPU; it appears once per holder."""
        r = NodeReservation()
        for _ in range(3):
            r = r.add("n", vec(0.1), (0,), 0.1)
        assert r.gpu_indices == (0, 0, 0)
        # 0.1 + 0.1 + 0.1 is 0.30000000000000004 in floats: rounded back.
        assert r.used.gpus == 0.3
        for _ in range(3):
            r = r.remove(vec(0.1), (0,))
        assert r.used.gpus == 0.0 and r.gpu_indices == ()

    def test_remove_never_goes_below_zero(self) -> None:
        """Removing more than was reserved clamps at zero."""
        assert NodeReservation().remove(vec(1, 10, 2), (0,)) == NodeReservation()


class TestGpuArithmetic:
    def test_take_and_give_back(self) -> None:
        """Taking and giving back a share restores the GPU, snapping float residue to whole."""
        mem, share = take_gpu(80 * GIB, 1.0, 10 * GIB, 0.1)
        for _ in range(2):
            mem, share = take_gpu(mem, share, 10 * GIB, 0.1)
        for _ in range(3):
            mem, share = give_back_gpu(mem, share, 10 * GIB, 0.1, 80 * GIB)
        assert (mem, share) == (80 * GIB, 1.0)

    def test_never_below_zero_or_above_total(self) -> None:
        """Memory and share stay within [0, total] and [0, 1]."""
        assert take_gpu(5, 0.2, 10, 0.5) == (0, 0.0)
        assert give_back_gpu(75, 0.9, 10, 0.5, 80) == (80, 1.0)

    def test_gpu_usage_sums_holders(self) -> None:
        """Per-GPU use splits each allocation's memory evenly and adds shares (0 counts as whole)."""
        usage = gpu_usage([((0, 1), 40 * GIB, 1.0), ((2,), 8 * GIB, 0.25), ((2,), 8 * GIB, 0.25), ((3,), GIB, 0.0)])
        assert usage == {0: (20 * GIB, 1.0), 1: (20 * GIB, 1.0), 2: (16 * GIB, 0.5), 3: (GIB, 1.0)}
