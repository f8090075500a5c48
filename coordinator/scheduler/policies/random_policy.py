"""Random placement (baseline): a uniformly random feasible node, from an injected RNG.

Requests are taken in queue order. A single-node request draws ``rng.integers(k)`` among the
``k`` feasible nodes (in snapshot order); a gang of ``n`` draws ``rng.choice(k, n, replace=False)``.
A request no node can take draws nothing, so the random stream depends only on the placements.
No scale-out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common.domain import NodeId, NodeSnapshot, Request
from common.errors import ValidationError
from coordinator.scheduler.policies.base import (
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLD_MODE,
    BoolArray,
    IntArray,
    NodeArrays,
    PolicyArgs,
    ShapeIndex,
    ThresholdPolicy,
    feasible,
)

__all__ = ["NAME", "RandomArgs", "RandomPolicy", "build", "draw", "feasible", "rank"]

NAME = "random"
_LIST_MAX = 8192   # up to this many nodes, listing the feasible ones costs less than reading the block counts


@dataclass(frozen=True, slots=True)
class RandomArgs(PolicyArgs):
    """Arguments of :class:`RandomPolicy`.

    :param mode: which dimensions the threshold caps (``whole-gpus`` or ``paper``).
    :param seed: seed of the RNG :func:`build` makes (None: fresh entropy); must be ≥ 0.
    """

    seed: int | None = None

    def __post_init__(self) -> None:
        PolicyArgs.__post_init__(self)
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValidationError("policy.seed", f"must be a non-negative integer, got {self.seed!r}")


def draw(n_feasible: int, count: int, rng: np.random.Generator) -> IntArray:
    """Positions (among the feasible nodes) of a uniformly random choice of ``count`` of them.

    :param n_feasible: how many nodes are feasible (≥ ``count``).
    :param count: how many nodes are needed.
    :param rng: the random generator.
    :returns: ``count`` distinct positions in ``range(n_feasible)``.
    """
    if count == 1:
        return np.array([rng.integers(n_feasible)], dtype=np.int64)
    return rng.choice(n_feasible, size=count, replace=False).astype(np.int64)


def rank(nodes: Sequence[NodeSnapshot], rng: np.random.Generator) -> list[NodeId]:
    """Node ids in a uniformly random order.

    :param nodes: the nodes in snapshot order.
    :param rng: the random generator.
    :returns: a random permutation of the ids.
    """
    return [nodes[int(i)].node_id for i in rng.permutation(len(nodes))]


class RandomPolicy(ThresholdPolicy):
    """Random placement as a :class:`~coordinator.scheduler.policies.base.Policy`.

    :param args: validated arguments.
    :param rng: the injected random generator (tests pass a seeded one).
    """

    name = NAME
    sorts_requests = False
    scale_out = False
    reads_view = False

    def __init__(self, args: RandomArgs, rng: np.random.Generator) -> None:
        super().__init__(args)
        self.rng = rng

    def rank(self, req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
        """Rank: see :func:`rank` (consumes randomness)."""
        return rank(nodes, self.rng)

    def select(self, view: NodeArrays, mask: BoolArray, req: Request) -> IntArray:
        """``req.nodes`` random feasible nodes; none drawn when too few are feasible."""
        candidates = mask.nonzero()[0].astype(np.int64, copy=False)
        if len(candidates) < req.nodes:
            return candidates
        if req.nodes == 1:
            # draw(n, 1, rng) without building its array: the same single rng.integers(n) call.
            k = int(self.rng.integers(len(candidates)))
            return candidates[k : k + 1]
        return candidates[draw(len(candidates), req.nodes, self.rng)]

    def select_indexed(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> IntArray:
        """:meth:`select` with the same draws; on a large cluster the nodes are found from the entry's
        block counts (the k-th feasible node) instead of listing every feasible one."""
        if len(entry.mask) <= _LIST_MAX:
            return self.select(view, entry.mask, req)
        if req.nodes == 1:
            chosen = self.select_one(view, entry, req)
            return np.array([chosen] if chosen >= 0 else [], dtype=np.int64)
        count, rng = req.nodes, self.rng
        # A gang: draw(n, count, rng) among the n feasible nodes, as select does; with fewer than
        # count feasible, no draw, and select lists them.
        nodes = entry.pick_many(lambda n: draw(n, count, rng).tolist() if n >= count else None)
        if nodes is None:
            return self.select(view, entry.mask, req)
        return np.array(nodes, dtype=np.int64)

    def select_one(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> int:
        """A one-node request's random node (-1: none), with :meth:`select`'s draw."""
        if len(entry.mask) <= _LIST_MAX:
            chosen = self.select(view, entry.mask, req)
            return int(chosen[0]) if len(chosen) else -1
        rng = self.rng
        return entry.pick(lambda n: int(rng.integers(n)))


def build(threshold: float = DEFAULT_THRESHOLD, *, seed: int | None = None,
          mode: str = DEFAULT_THRESHOLD_MODE) -> RandomPolicy:
    """Build the policy with ``numpy.random.default_rng(seed)``.

    :param threshold: cap on every dimension's utilization after placement, in (0, 1].
    :param seed: RNG seed; None draws fresh entropy (not reproducible).
    :returns: the policy.
    :raises ValidationError: on a threshold outside (0, 1] or a negative seed.
    """
    args = RandomArgs(threshold=threshold, seed=seed, threshold_mode=mode)
    return RandomPolicy(args, np.random.default_rng(args.seed))
