"""Power-efficient placement (paper Alg. 3; objective: minimise the cluster's total power).

Among the nodes with enough resources (the shared threshold filter), pick the one whose
estimated power increase is smallest (ties: snapshot order). A node's power is the linear curve
``idle + (max - idle) · u`` of its compute utilization ``u``. A node that is asleep — powered
off, or powered on with nothing allocated, which the adaptor would put to sleep — draws nothing
in the estimate, so waking it costs its idle power on top of the utilization term. This is what
makes Alg. 3 consolidate work instead of spreading it. When no node fits, the request waits;
this policy never asks for a new node.
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

__all__ = [
    "NAME",
    "PowerEfficient",
    "PowerEfficientArgs",
    "build",
    "feasible",
    "power_increase",
    "rank",
]

NAME = "power-efficient"


@dataclass(frozen=True, slots=True)
class PowerEfficientArgs(PolicyArgs):
    """Arguments of :class:`PowerEfficient` (``threshold`` in (0, 1], checked when built)."""


def power_increase(nodes: NodeFields, demand_gpus: float) -> FloatArray | float:
    """Estimated power increase, in watts, of placing ``demand_gpus`` on a node (or on each node).

    :param nodes: the nodes' fields (:class:`~coordinator.scheduler.policies.base.NodeArrays`), or
        one node's (:class:`~coordinator.scheduler.policies.base.NodeRow`).
    :param demand_gpus: GPU compute the request adds to it.
    :returns: ``power(u_after) - power(u_before)``, where ``power(u_before)`` is 0 for an asleep node.
    """
    after = nodes.idle_w + nodes.slope_w * ((nodes.used_gpus + demand_gpus) / nodes.cap_gpus_safe)
    return after - nodes.before_w


def rank(req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
    """Node ids by ascending estimated power increase, ties in snapshot order.

    :param req: the request (its GPU demand drives the increase).
    :param nodes: the nodes in snapshot order.
    :returns: the order in which nodes are tried.
    """
    return PowerEfficient(PowerEfficientArgs()).rank(req, nodes)


class PowerEfficient(KeyedPolicy):
    """Alg. 3 as a :class:`~coordinator.scheduler.policies.base.Policy`.

    :param args: validated arguments.
    """

    name = NAME
    sorts_requests = True
    scale_out = False

    def key(self, nodes: NodeFields, req: Request) -> FloatArray | float:
        """The smallest estimated power increase first (:func:`power_increase`)."""
        return power_increase(nodes, req.demand.gpus)


def build(threshold: float = DEFAULT_THRESHOLD, *, seed: int | None = None,
          mode: str = DEFAULT_THRESHOLD_MODE) -> PowerEfficient:
    """Build the policy.

    :param threshold: cap on every dimension's utilization after placement, in (0, 1].
    :param mode: which dimensions the threshold caps (``whole-gpus`` or ``paper``).
    :param seed: ignored (every factory in the registry takes one, for the random policy).
    :returns: the policy.
    :raises ValidationError: on a threshold outside (0, 1].
    """
    return PowerEfficient(PowerEfficientArgs(threshold=threshold, threshold_mode=mode))
