"""Random placement (baseline): a uniformly random feasible node, from an injected RNG.

Requests are taken in queue order. The policy reads one stream of uniform floats ``u`` in
``[0, 1)`` from its generator (``rng.random()``; drawn in chunks of :data:`CHUNK`, which gives
the same values as drawing them one at a time). A request of ``n`` nodes takes them one after
another; with ``N`` nodes in the cluster and ``r`` feasible ones not yet taken by this request:

* when at least a quarter of the nodes are such (``4 r >= N``), node ``floor(u N)`` for each
  next ``u`` until one of them is (rejection: about ``N / r`` draws, at most 4 on average);
* otherwise the ``floor(u r)``-th of them in node order.

Either way the node is uniformly random among the ``r``, a gang's nodes come in draw order,
and a request no node set can take draws nothing, so the stream depends only on the
placements. Most decisions take the first way: one float and one byte read, where finding the
k-th feasible node walks the shape entry's block counts. No scale-out.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common.errors import ValidationError
from coordinator.domain import NodeId, NodeSnapshot, Request
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

__all__ = ["CHUNK", "DENSE", "NAME", "Listing", "RandomArgs", "RandomPolicy", "Uniforms", "build", "draw", "feasible",
           "rank"]

NAME = "random"
CHUNK = 256   # uniforms drawn from the generator at a time
DENSE = 4     # rejection while at least 1/DENSE of the nodes can be drawn


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


class Uniforms:
    """The generator's uniform floats in ``[0, 1)``, one at a time, drawn :data:`CHUNK` at a time: the
    values ``rng.random()`` would give call after call (one ``random(CHUNK)`` call instead of
    ``CHUNK`` calls of a microsecond each).

    :param rng: the generator; nothing else should draw from it while this is in use.
    """

    __slots__ = ("_left", "rng")

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self._left: list[float] = []   # the chunk's values not given yet, last one next

    def __call__(self) -> float:
        """The next value."""
        left = self._left
        if not left:
            left.extend(reversed(self.rng.random(CHUNK).tolist()))
        return left.pop()


class Listing:
    """A mask's feasible nodes with :class:`ShapeIndex`'s drawing reads (``feasible``, ``flags``,
    ``nth``, ``set_aside``, ``put_back``), for a mask that is not a shape entry's."""

    __slots__ = ("_pool", "feasible", "flags")

    def __init__(self, mask: BoolArray) -> None:
        self.flags = bytearray(mask.tobytes())
        self._pool = np.flatnonzero(mask).tolist()   # feasible and not set aside, in node order
        self.feasible = len(self._pool)

    def nth(self, p: int) -> int:
        return int(self._pool[p])

    def set_aside(self, i: int) -> None:
        self.flags[i] = 0
        del self._pool[bisect_left(self._pool, i)]
        self.feasible -= 1

    def put_back(self, nodes: list[int]) -> None:
        """Nothing to restore: the listing is this call's own."""


def draw(source: ShapeIndex | Listing, n_nodes: int, count: int, uniform: Uniforms) -> list[int]:
    """``count`` distinct feasible nodes by the module's rule, in draw order; none (nothing drawn) when
    fewer are feasible.

    :param source: the feasible nodes (a shape entry, exact: no suspects).
    :param n_nodes: how many nodes the cluster has.
    :param count: how many nodes are needed.
    :param uniform: the policy's stream.
    :returns: node indices.
    """
    if source.feasible < count:
        return []
    flags = source.flags
    chosen: list[int] = []
    for _ in range(count):
        left = source.feasible
        if DENSE * left >= n_nodes:
            i = int(uniform() * n_nodes)
            while not flags[i]:
                i = int(uniform() * n_nodes)
        else:
            i = source.nth(int(uniform() * left))
        chosen.append(i)
        if count > 1:
            source.set_aside(i)   # not drawn twice
    if count > 1:
        source.put_back(chosen)
    return chosen


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
    :param rng: the injected random generator (tests pass a seeded one); the policy draws its
        uniforms from it (:class:`Uniforms`) and :meth:`rank` its permutations.
    """

    name = NAME
    sorts_requests = False
    scale_out = False
    reads_view = False

    def __init__(self, args: RandomArgs, rng: np.random.Generator) -> None:
        super().__init__(args)
        self.rng = rng
        self.uniform = Uniforms(rng)

    def rank(self, req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
        """Rank: see :func:`rank` (consumes randomness)."""
        return rank(nodes, self.rng)

    def select(self, view: NodeArrays, mask: BoolArray, req: Request) -> IntArray:
        """``req.nodes`` random feasible nodes (:func:`draw`); none drawn when too few are feasible."""
        return np.array(draw(Listing(mask), len(mask), req.nodes, self.uniform), dtype=np.int64)

    def select_indexed(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> IntArray:
        """:meth:`select` with the same draws, read from the entry's flags and block counts."""
        return np.array(draw(entry, len(entry.mask), req.nodes, self.uniform), dtype=np.int64)

    def select_one(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> int:
        """A one-node request's random node (-1: none), with :meth:`select`'s draw."""
        chosen = draw(entry, len(entry.mask), 1, self.uniform)
        return chosen[0] if chosen else -1


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
