"""Load-balancing placement (paper Alg. 2; objective: minimise the std-dev of node utilization).

Requests are taken by descending compute demand; nodes are tried by **ascending** compute
utilization (ties: snapshot order); the first node where every dimension stays ≤ threshold
after placement wins. When no node can take a request, it asks for a new node (scale-out);
on bare metal the request waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.domain import NodeId, NodeSnapshot, Request
from coordinator.scheduler.policies.base import (
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLD_MODE,
    FloatArray,
    KeyedPolicy,
    NodeArrays,
    PolicyArgs,
    feasible,
)

__all__ = ["NAME", "LoadBalancing", "LoadBalancingArgs", "build", "feasible", "rank", "rank_key"]

NAME = "load-balancing"


@dataclass(frozen=True, slots=True)
class LoadBalancingArgs(PolicyArgs):
    """Arguments of :class:`LoadBalancing` (``threshold`` in (0, 1], checked when built)."""


def rank_key(util: FloatArray) -> FloatArray:
    """Sort key per node: the emptiest node (lowest compute utilization) comes first.

    :param util: compute utilization per node.
    :returns: ``util`` itself (smaller is tried first).
    """
    return util


def rank(req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
    """Node ids by ascending compute utilization, ties in snapshot order.

    :param req: the request (unused: the order depends on the nodes only).
    :param nodes: the nodes in snapshot order.
    :returns: the order in which nodes are tried.
    """
    return [n.node_id for n in sorted(nodes, key=lambda n: n.compute_util)]


class LoadBalancing(KeyedPolicy):
    """Alg. 2 as a :class:`~coordinator.scheduler.policies.base.Policy`.

    :param args: validated arguments.
    """

    name = NAME
    sorts_requests = True
    scale_out = True

    def rank(self, req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
        """Rank: see :func:`rank`."""
        return rank(req, nodes)

    def key_array(self, view: NodeArrays, req: Request) -> FloatArray:
        """Key: :func:`rank_key` of the compute utilization."""
        return rank_key(view.util)

    def key_at(self, view: NodeArrays, req: Request, i: int) -> float:
        """Key of node ``i``: its utilization."""
        return view.util.item(i)


def build(threshold: float = DEFAULT_THRESHOLD, *, seed: int | None = None,
          mode: str = DEFAULT_THRESHOLD_MODE) -> LoadBalancing:
    """Build the policy.

    :param threshold: cap on every dimension's utilization after placement, in (0, 1].
    :param mode: which dimensions the threshold caps (``whole-gpus`` or ``paper``).
    :param seed: ignored (every factory in the registry takes one, for the random policy).
    :returns: the policy.
    :raises ValidationError: on a threshold outside (0, 1].
    """
    return LoadBalancing(LoadBalancingArgs(threshold=threshold, threshold_mode=mode))
