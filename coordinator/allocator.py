"""Resource Allocator: turn a node choice into concrete GPU indices and reservations.

The policy picks nodes; the allocator picks GPUs on each node and says what becomes reserved.

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
from dataclasses import replace

from common.errors import PlacementError
from common.scheduling import GpuSlot, NodeAssignment, NodeSnapshot, Request, Resources

__all__ = ["allocate", "choose_gpu_indices", "choose_gpus", "release", "reserve"]

_FULL = 1.0
# Share arithmetic in floats leaves crumbs (0.1 + 0.2 …); a share this close to 1 is whole again.
_SHARE_EPS = 1e-9


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


def choose_gpus(req: Request, gpus: Sequence[GpuSlot]) -> tuple[tuple[int, ...], float] | None:
    """Pick GPUs for a request on one node.

    :param req: the request.
    :param gpus: the node's GPUs.
    :returns: ``(gpu indices, share of each)``, or None when the node's GPUs cannot hold it.
    """
    positions = choose_gpu_indices(
        [g.mem_free_bytes for g in gpus],
        [g.share_free for g in gpus],
        [g.topology_group for g in gpus],
        whole=req.whole_gpus,
        share=req.demand.gpus,
        mem_per_gpu=req.gpu_mem_per_gpu_bytes,
    )
    if positions is None:
        return None
    share = _FULL if req.whole_gpus > 0 or not positions else req.demand.gpus
    return tuple(gpus[p].index for p in positions), share


def allocate(req: Request, node: NodeSnapshot) -> NodeAssignment:
    """Choose GPUs on a node the policy picked.

    :param req: the request.
    :param node: the node chosen for it.
    :returns: the node's part of the placement.
    :raises PlacementError: when the node's GPUs cannot hold the request.
    """
    chosen = choose_gpus(req, node.gpus)
    if chosen is None:
        raise PlacementError(f"node {node.node_id!r} has no GPUs for task {req.task_id!r}")
    indices, share = chosen
    return NodeAssignment(node_id=node.node_id, gpu_indices=indices, gpu_share=share)


def _apply(
    node: NodeSnapshot, assignment: NodeAssignment, demand: Resources, mem_per_gpu: int, sign: int
) -> NodeSnapshot:
    """Add (sign +1) or remove (sign -1) an assignment's reservation on a node."""
    taken = set(assignment.gpu_indices)
    slots = []
    for g in node.gpus:
        if g.index not in taken:
            slots.append(g)
            continue
        share = g.share_free - sign * assignment.gpu_share
        share = _FULL if share >= _FULL - _SHARE_EPS else max(share, 0.0)
        mem = min(g.mem_total_bytes, max(0, g.mem_free_bytes - sign * mem_per_gpu))
        slots.append(replace(g, share_free=share, mem_free_bytes=mem))
    used = node.used.add(demand) if sign > 0 else node.used.sub(demand)
    return replace(node, used=used, gpus=tuple(slots))


def reserve(node: NodeSnapshot, assignment: NodeAssignment, demand: Resources, mem_per_gpu: int) -> NodeSnapshot:
    """The node after reserving an assignment on it.

    :param node: the node before.
    :param assignment: GPUs and share to reserve.
    :param demand: the vector to add to ``node.used``.
    :param mem_per_gpu: memory to take from each reserved GPU.
    :returns: a new snapshot of the node.
    """
    return _apply(node, assignment, demand, mem_per_gpu, +1)


def release(node: NodeSnapshot, assignment: NodeAssignment, demand: Resources, mem_per_gpu: int) -> NodeSnapshot:
    """The node after releasing an assignment (a task ended).

    :param node: the node before.
    :param assignment: GPUs and share to give back.
    :param demand: the vector to take from ``node.used``.
    :param mem_per_gpu: memory to give back to each GPU.
    :returns: a new snapshot of the node.
    """
    return _apply(node, assignment, demand, mem_per_gpu, -1)
