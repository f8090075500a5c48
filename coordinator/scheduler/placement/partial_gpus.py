"""An index of the partly shared GPUs of a cluster, for shared-GPU (fractional) requests.

A fully free GPU can hold any share, and the engine already knows each node's best fully free
GPU; what remains for "is there a GPU with share ≥ s and memory ≥ X on this node?" are the GPUs
that are partly taken. They are kept in compact arrays (swap-remove on change), so the check
costs time in proportion to how many such GPUs exist, not to the cluster size.
"""

from __future__ import annotations

import numpy as np

from coordinator.scheduler.policies.base import BoolArray

__all__ = ["PartialGpus"]


class PartialGpus:
    """Compact arrays of ``(node, share free, memory free)`` for every partly shared GPU.

    :param capacity: the most GPUs the cluster has (an upper bound on the entries).
    """

    def __init__(self, capacity: int) -> None:
        size = max(capacity, 1)
        self._node = np.zeros(size, dtype=np.int64)
        self._share = np.zeros(size)
        self._mem = np.zeros(size)
        self.where: dict[tuple[int, int], int] = {}   # (node, slot) -> position, for every GPU indexed
        self._slots: list[tuple[int, int]] = []

    def __len__(self) -> int:
        """How many GPUs are partly shared now."""
        return len(self._slots)

    def update(self, node: int, slot: int, share_free: float, mem_free: float) -> None:
        """Record one GPU's state; it is indexed only while ``0 < share_free < 1``.

        :param node: node index.
        :param slot: the GPU's position on the node.
        :param share_free: its free compute share.
        :param mem_free: its free memory in bytes.
        """
        key = (node, slot)
        pos = self.where.get(key)
        if 0.0 < share_free < 1.0:
            if pos is None:
                pos = len(self._slots)
                self._slots.append(key)
                self.where[key] = pos
                self._node[pos] = node
            self._share[pos] = share_free
            self._mem[pos] = mem_free
        elif pos is not None:
            last = len(self._slots) - 1
            moved = self._slots[last]
            self._slots[pos] = moved
            self.where[moved] = pos
            self._node[pos], self._share[pos], self._mem[pos] = self._node[last], self._share[last], self._mem[last]
            self._slots.pop()
            del self.where[key]

    def mark(self, mask: BoolArray, share: float, mem: float) -> None:
        """Set ``mask[node]`` for every node with a partly shared GPU that holds ``share`` and ``mem``.

        :param mask: a mask over nodes, updated in place.
        :param share: the share needed.
        :param mem: the memory needed, in bytes.
        """
        n = len(self._slots)
        if n:
            fits = (self._share[:n] >= share) & (self._mem[:n] >= mem)
            mask[self._node[:n][fits]] = True
