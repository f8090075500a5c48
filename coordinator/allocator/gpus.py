"""Resource Allocator: turn a node choice into concrete GPU indices.

The policy picks nodes; the allocator picks GPUs on each node (what that reserves is
:mod:`coordinator.allocator.reservations`).

* Whole GPUs: among fully free GPUs with enough free memory, take the best fit (least free
  memory first, ties by index). If one topology group (NVLink domain / PCIe switch) can hold all
  of them, take the group whose best-fit GPUs leave the least memory free, so the task's GPUs
  talk over the fast links; otherwise take the best fit across groups.
* A shared fraction (``allow_sharing`` and ``demand.gpus < 1``): the GPU with enough share and
  memory left that has the least free memory (best fit), so partly used GPUs fill up first and
  whole GPUs stay free for whole-GPU tasks.

Everything here is a pure function of plain data; the placement engine calls
:func:`choose_gpu_indices` on one node's rows of its arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["choose_gpu_indices"]

_FULL = 1.0


def _best_fit_whole(
    mem_free: Sequence[int], share_free: Sequence[float], topology: Sequence[int], count: int, mem_per_gpu: int
) -> tuple[int, ...] | None:
    """``count`` fully free GPUs with ≥ ``mem_per_gpu`` free, topology-aware best fit."""
    eligible = [
        (mem, i)
        for i, (mem, share) in enumerate(zip(mem_free, share_free, strict=True))
        if share >= _FULL and mem >= mem_per_gpu
    ]
    if len(eligible) < count:
        return None
    if count == 1:
        return (min(eligible)[1],)
    eligible.sort()
    groups: dict[int, list[tuple[int, int]]] = {}
    for mem, i in eligible:
        if topology[i] >= 0:
            groups.setdefault(topology[i], []).append((mem, i))
    best: list[tuple[int, int]] | None = None
    best_key: tuple[int, list[int]] | None = None
    for members in groups.values():
        if len(members) >= count:
            chosen = members[:count]
            # Least leftover memory first; equal leftovers go to the set with the lower indices.
            key = (sum(m for m, _ in chosen), sorted(i for _, i in chosen))
            if best_key is None or key < best_key:
                best, best_key = chosen, key
    return tuple(sorted(i for _, i in (best or eligible[:count])))


def choose_gpu_indices(
    mem_free: Sequence[int],
    share_free: Sequence[float],
    topology: Sequence[int],
    *,
    whole: int,
    share: float,
    mem_per_gpu: int,
) -> tuple[int, ...] | None:
    """Pick GPU positions on one node (see the module docstring for the rules).

    :param mem_free: free memory per GPU, in bytes.
    :param share_free: free compute share per GPU, 0..1.
    :param topology: topology group per GPU, -1 when unknown.
    :param whole: whole GPUs needed (0 for a shared fraction or a CPU-only task).
    :param share: the fraction needed when ``whole`` is 0 (0 for a CPU-only task).
    :param mem_per_gpu: memory each chosen GPU must have free.
    :returns: ascending GPU positions, ``()`` when no GPU is needed, None when they do not fit.
    """
    if whole > 0:
        return _best_fit_whole(mem_free, share_free, topology, whole, mem_per_gpu)
    if share <= 0:
        return ()
    eligible = [
        (mem_free[i], share_free[i], i)
        for i in range(len(mem_free))
        if share_free[i] >= share and mem_free[i] >= mem_per_gpu
    ]
    return (min(eligible)[2],) if eligible else None
