"""Resource Allocator: turn a node choice into concrete GPU indices.

The policy picks nodes; the allocator picks GPUs on each node (what that reserves is
:mod:`coordinator.allocator.reservations`).

* Whole GPUs on a node whose agent reported no links: among fully free GPUs with enough free
  memory, take the best fit (least free memory first, ties by index). If one topology group
  (NVLink domain / PCIe switch) can hold all of them, take the group whose best-fit GPUs leave
  the least memory free, so the task's GPUs talk over the fast links; otherwise take the best
  fit across groups.
* Whole GPUs on a node whose links are known (:class:`common.topology.NodeTopology`): the
  node's nested islands (NVLink pairs or sockets, then sockets, then the node) are read from
  the closest level up: at the first level where an island holds the task, it goes into the
  island with the fewest free GPUs (best fit; ties to the island whose enclosing islands have
  the fewest), so a 1-GPU task takes a GPU of an already broken NVLink pair, a 2-GPU task a
  whole pair, a 4-GPU task one socket, and larger islands stay free for larger tasks. Inside
  that island the task takes whole sub-islands, largest first, and the rest from the
  best-fitting one; among GPUs equally close, the least free memory goes first.
* A shared fraction (``allow_sharing`` and ``demand.gpus < 1``): the GPU with enough share and
  memory left that has the least free memory (best fit), so partly used GPUs fill up first and
  whole GPUs stay free for whole-GPU tasks.
* DEGRADED GPUs (``avoid``: throttling, a link down) are chosen last: the rules above run first on the
  node's other GPUs, and only when those cannot hold the task on all of them.

Everything here is a pure function of plain data; the placement engine calls
:func:`choose_gpu_indices` on one node's rows of its arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.topology import NodeTopology

__all__ = ["choose_gpu_indices"]

_FULL = 1.0


def _best_fit_whole(
    mem_free: Sequence[float], share_free: Sequence[float], topology: Sequence[int], count: int, mem_per_gpu: int
) -> tuple[int, ...] | None:
    """``count`` fully free GPUs with ≥ ``mem_per_gpu`` free, topology-aware best fit."""
    if count == 1:
        # The least free memory, ties to the lower index: min() of the (memory, index) pairs below,
        # in one pass without building them (the most common request).
        one, least = -1, 0.0
        for i, mem in enumerate(mem_free):
            if share_free[i] >= _FULL and mem >= mem_per_gpu and (one < 0 or mem < least):
                one, least = i, mem
        return (one,) if one >= 0 else None
    eligible = [
        (mem, i)
        for i, (mem, share) in enumerate(zip(mem_free, share_free, strict=True))
        if share >= _FULL and mem >= mem_per_gpu
    ]
    if len(eligible) < count:
        return None
    eligible.sort()
    groups: dict[int, list[tuple[float, int]]] = {}
    for mem, i in eligible:
        if topology[i] >= 0:
            groups.setdefault(topology[i], []).append((mem, i))
    best: list[tuple[float, int]] | None = None
    best_key: tuple[float, list[int]] | None = None
    for members in groups.values():
        if len(members) >= count:
            chosen = members[:count]
            # Least leftover memory first; equal leftovers go to the set with the lower indices.
            key = (sum(m for m, _ in chosen), sorted(i for _, i in chosen))
            if best_key is None or key < best_key:
                best, best_key = chosen, key
    return tuple(sorted(i for _, i in (best or eligible[:count])))


def _island_fit(
    mem_free: Sequence[float], share_free: Sequence[float], links: NodeTopology, count: int, mem_per_gpu: int
) -> tuple[int, ...] | None:
    """``count`` fully free GPUs with ≥ ``mem_per_gpu`` free, best fit in the node's closest islands."""
    eligible = [i for i in range(len(mem_free)) if share_free[i] >= _FULL and mem_free[i] >= mem_per_gpu]
    if len(eligible) <= count:
        return tuple(eligible) if len(eligible) == count else None
    island_of = links.island_of
    top = len(island_of) - 1   # the last level is the whole node: one island, nothing to choose
    free: list[list[int]] = []
    for level in range(top):
        of = island_of[level]
        counts = [0] * links.island_counts[level]
        for i in eligible:
            counts[of[i]] += 1
        free.append(counts)
    if count == 1:
        # Fewest free GPUs in its island at each level, closest level first; then least free memory.
        candidates = eligible
        for u in range(top):
            of, counts = island_of[u], free[u]
            low = min(counts[of[i]] for i in candidates)
            candidates = [i for i in candidates if counts[of[i]] == low]
        return (min(candidates, key=lambda i: (mem_free[i], i)),)
    chosen: list[int] = []

    def pick(level: int, members: list[int], k: int) -> None:
        """``k`` of ``members`` (one island of ``level + 1``), closest first."""
        if k == len(members):
            chosen.extend(members)
            return
        if level < 0:
            chosen.extend(sorted(members, key=lambda i: (mem_free[i], i))[:k])
            return
        of = island_of[level]
        groups: dict[int, list[int]] = {}
        for i in members:
            groups.setdefault(of[i], []).append(i)
        ordered = sorted(groups.values(), key=lambda g: (len(g), g[0]))
        fits = next((g for g in ordered if len(g) >= k), None)
        if fits is not None:
            pick(level - 1, fits, k)
            return
        # No island holds it: whole islands, largest first, then the best fit for the rest.
        rest = k
        left: list[list[int]] = []
        for g in reversed(ordered):
            if len(g) <= rest:
                chosen.extend(g)
                rest -= len(g)
            else:
                left.append(g)
        if rest:
            pick(level - 1, min((g for g in left if len(g) >= rest), key=lambda g: (len(g), g[0])), rest)

    for level in range(top):
        # The closest level where an island holds the task: the island with the fewest free GPUs,
        # ties to the one whose enclosing islands have the fewest, then to the lowest GPU.
        of, counts = island_of[level], free[level]
        best_key: tuple[int, ...] | None = None
        seen: set[int] = set()
        for i in eligible:
            island = of[i]
            if island in seen or counts[island] < count:
                continue
            seen.add(island)
            key = (*(free[u][island_of[u][i]] for u in range(level, top)), i)
            if best_key is None or key < best_key:
                best_key = key
        if best_key is not None:
            island = of[best_key[-1]]
            pick(level - 1, [i for i in eligible if of[i] == island], count)
            return tuple(sorted(chosen))
    pick(top - 1, eligible, count)
    return tuple(sorted(chosen))


def choose_gpu_indices(
    mem_free: Sequence[float],
    share_free: Sequence[float],
    topology: Sequence[int],
    *,
    whole: int,
    share: float,
    mem_per_gpu: int,
    links: NodeTopology | None = None,
    avoid: frozenset[int] = frozenset(),
) -> tuple[int, ...] | None:
    """Pick GPU positions on one node (see the module docstring for the rules).

    :param mem_free: free memory per GPU, in bytes.
    :param share_free: free compute share per GPU, 0..1.
    :param topology: topology group per GPU, -1 when unknown.
    :param whole: whole GPUs needed (0 for a shared fraction or a CPU-only task).
    :param share: the fraction needed when ``whole`` is 0 (0 for a CPU-only task).
    :param mem_per_gpu: memory each chosen GPU must have free.
    :param links: the node's GPU links when its agent reported them; ``topology`` is used without.
    :param avoid: positions of DEGRADED GPUs, taken only when the others cannot hold the task.
    :returns: ascending GPU positions, ``()`` when no GPU is needed, None when they do not fit.
    """
    if avoid:
        others = [0.0 if k in avoid else s for k, s in enumerate(share_free)]
        chosen = choose_gpu_indices(mem_free, others, topology, whole=whole, share=share, mem_per_gpu=mem_per_gpu,
                                    links=links)
        if chosen is not None:
            return chosen
    if whole > 0:
        if links is not None and links.count == len(mem_free):
            return _island_fit(mem_free, share_free, links, whole, mem_per_gpu)
        return _best_fit_whole(mem_free, share_free, topology, whole, mem_per_gpu)
    if share <= 0:
        return ()
    eligible = [
        (mem_free[i], share_free[i], i)
        for i in range(len(mem_free))
        if share_free[i] >= share and mem_free[i] >= mem_per_gpu
    ]
    return (min(eligible)[2],) if eligible else None
