"""Load-balancing placement (paper Alg. 2; objective: minimise the std-dev of node utilization).

Requests are taken by descending compute demand; nodes are tried by **ascending** compute
utilization (ties: snapshot order); the first node where every dimension stays ≤ threshold
after placement wins. When no node can take a request, it asks for a new node (scale-out);
on bare metal the request waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.domain import NodeId, NodeSnapshot, Request
from coordinator.scheduler.policies.base import (
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLD_MODE,
    FloatArray,
    KeyedPolicy,
    NodeFields,
    PolicyArgs,
    feasible,
)

__all__ = ["NAME", "LoadBalancing", "LoadBalancingArgs", "build", "feasible", "rank"]

NAME = "load-balancing"


@dataclass(frozen=True, slots=True)
class LoadBalancingArgs(PolicyArgs):
    """Arguments of :class:`LoadBalancing` (``threshold`` in (0, 1], checked when built)."""


def rank(req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
    """Node ids by ascending compute utilization, ties in snapshot order.

    :param req: the request (unused: the order depends on the nodes only).
    :param nodes: the nodes in snapshot order.
    :returns: the order in which nodes are tried.
    """
    return LoadBalancing(LoadBalancingArgs()).rank(req, nodes)


class LoadBalancing(KeyedPolicy):
    """Alg. 2 as a :class:`~coordinator.scheduler.policies.base.Policy`.

    :param args: validated arguments.
    """

    name = NAME
    sorts_requests = True
    scale_out = True

    def key(self, nodes: NodeFields, req: Request) -> FloatArray | float:
        """The emptiest node (lowest compute utilization) first: ``util`` itself."""
        return nodes.util


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
