"""The one reservation model: what an allocation takes from a node, and gives back when it ends.

A node's reservation is the field-wise sum of its allocations' demand vectors plus the multiset
of GPU indices they hold (a GPU shared by k tasks appears k times). Per GPU, an allocation takes
its memory and its share (1 for a whole GPU). Everything that keeps reservations uses these
functions: the placement engine's columns within a batch, the leader's node holdings between
cycles (``coordinator/state.py``, which sums a node's allocations in memory: etcd stores no totals),
the snapshot that rebuilds per-GPU use from live allocations, and ``coordinator/sync``, which checks
a commit's whole GPUs against the holdings.

Float dimensions (GPUs, cores, shares) are rounded back to the nearest whole value when they come
within ``CRUMB`` of it, so that adding and removing fractions (0.1 + 0.2 …) never leaves residue
that would make a free GPU look taken or an empty node look busy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from common.errors import IllegalTransition
from coordinator.domain import Resources

__all__ = [
    "CRUMB",
    "NodeReservation",
    "ReservationConflict",
    "give_back_gpu",
    "gpu_usage",
    "take_gpu",
]

CRUMB = 1e-9
"""Float residue below which a share or a float dimension snaps to the whole value."""


class ReservationConflict(IllegalTransition):
    """A whole-GPU allocation asks for a GPU that is already reserved on the node."""


def take_gpu(mem_free: float, share_free: float, mem_bytes: float, share: float) -> tuple[float, float]:
    """One GPU after an allocation took ``mem_bytes`` and ``share`` of it: ``(mem_free, share_free)``."""
    return max(mem_free - mem_bytes, 0), max(share_free - share, 0.0)


def give_back_gpu(mem_free: float, share_free: float, mem_bytes: float, share: float,
                  mem_total: float) -> tuple[float, float]:
    """One GPU after an allocation gave back ``mem_bytes`` and ``share``: ``(mem_free, share_free)``."""
    back = share_free + share
    return min(mem_free + mem_bytes, mem_total), 1.0 if back >= 1.0 - CRUMB else back


def _round(x: float) -> float:
    return round(x, 9)


def is_whole(gpu_share: float) -> bool:
    """An allocation with this share holds its GPUs alone (0 means a whole GPU on older records)."""
    return gpu_share <= 0 or gpu_share >= 1


@dataclass(frozen=True, slots=True)
class NodeReservation:
    """What the allocations on one node hold.

    :param used: the field-wise sum of the allocations' demand vectors (``gpu_mem_total_bytes`` is
        the memory of all their GPUs together).
    :param gpu_indices: sorted multiset of reserved GPU indices.
    """

    used: Resources = Resources()
    gpu_indices: tuple[int, ...] = ()

    def add(self, node_id: str, demand: Resources, gpu_indices: Sequence[int], gpu_share: float, *,
            check: bool = True) -> NodeReservation:
        """The reservation after one more allocation.

        :param check: refuse a whole GPU already reserved (False: sum whatever is given, to follow a record as stored).
        :raises ReservationConflict: a whole-GPU allocation asks for a GPU already reserved.
        """
        if check and is_whole(gpu_share):
            taken = sorted(set(self.gpu_indices) & set(gpu_indices))
            if taken:
                raise ReservationConflict(f"node {node_id}: GPU {', '.join(map(str, taken))} already reserved")
        u = self.used
        used = Resources(gpus=_round(u.gpus + demand.gpus), gpu_mem_total_bytes=u.gpu_mem_total_bytes
                         + demand.gpu_mem_total_bytes, cpu_cores=_round(u.cpu_cores + demand.cpu_cores),
                         mem_bytes=u.mem_bytes + demand.mem_bytes, disk_bytes=u.disk_bytes + demand.disk_bytes)
        return NodeReservation(used, tuple(sorted((*self.gpu_indices, *gpu_indices))))

    def remove(self, demand: Resources, gpu_indices: Sequence[int]) -> NodeReservation:
        """The reservation after an allocation ended; never below zero."""
        u = self.used
        used = Resources(gpus=max(_round(u.gpus - demand.gpus), 0.0),
                         gpu_mem_total_bytes=max(u.gpu_mem_total_bytes - demand.gpu_mem_total_bytes, 0),
                         cpu_cores=max(_round(u.cpu_cores - demand.cpu_cores), 0.0),
                         mem_bytes=max(u.mem_bytes - demand.mem_bytes, 0),
                         disk_bytes=max(u.disk_bytes - demand.disk_bytes, 0))
        left = list(self.gpu_indices)
        for index in gpu_indices:
            if index in left:
                left.remove(index)
        return NodeReservation(used, tuple(left))


def gpu_usage(holdings: Iterable[tuple[Sequence[int], int, float]]) -> dict[int, tuple[int, float]]:
    """Per-GPU memory and share held on one node by its live allocations.

    :param holdings: per allocation on the node, ``(gpu indices, memory of all those GPUs together,
        share of each GPU)``; the memory is split evenly over the GPUs, a share of 0 counts as 1.
    :returns: GPU index → ``(memory held, share held)``.
    """
    out: dict[int, tuple[int, float]] = {}
    for indices, mem_total, share in holdings:
        per_gpu = mem_total // max(1, len(indices))
        for i in indices:
            mem, held = out.get(i, (0, 0.0))
            out[i] = (mem + per_gpu, held + (share or 1.0))
    return out
