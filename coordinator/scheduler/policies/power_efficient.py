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

__all__ = [
    "NAME",
    "PowerEfficient",
    "PowerEfficientArgs",
    "build",
    "feasible",
    "power_increase",
    "power_increase_w",
    "rank",
]

NAME = "power-efficient"


@dataclass(frozen=True, slots=True)
class PowerEfficientArgs(PolicyArgs):
    """Arguments of :class:`PowerEfficient` (``threshold`` in (0, 1], checked when built)."""


def power_increase(node: NodeSnapshot, demand_gpus: float) -> float:
    """Estimated power increase, in watts, of placing ``demand_gpus`` on a node.

    :param node: the node.
    :param demand_gpus: GPU compute the request adds to it.
    :returns: ``power(u_after) - power(u_before)``, where ``power(u_before)`` is 0 for an asleep node.
    """
    awake = node.powered_on and not node.used.is_zero()
    before = node.power.power(node.compute_util) if awake else 0.0
    cap = node.capacity.gpus if node.capacity.gpus > 0 else 1.0
    after = node.power.power((node.used.gpus + demand_gpus) / cap)
    return after - before


def power_increase_w(view: NodeArrays, demand_gpus: float) -> FloatArray:
    """Vectorised :func:`power_increase` over every node (same operations, same rounding).

    :param view: the engine's node arrays.
    :param demand_gpus: GPU compute the request adds.
    :returns: estimated power increase per node, in watts.
    """
    after = view.idle_w + view.slope_w * ((view.used_gpus + demand_gpus) / view.cap_gpus_safe)
    return after - view.before_w


def rank(req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
    """Node ids by ascending estimated power increase, ties in snapshot order.

    :param req: the request (its GPU demand drives the increase).
    :param nodes: the nodes in snapshot order.
    :returns: the order in which nodes are tried.
    """
    return [n.node_id for n in sorted(nodes, key=lambda n: power_increase(n, req.demand.gpus))]


class PowerEfficient(KeyedPolicy):
    """Alg. 3 as a :class:`~coordinator.scheduler.policies.base.Policy`.

    :param args: validated arguments.
    """

    name = NAME
    sorts_requests = True
    scale_out = False

    def rank(self, req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
        """Rank: see :func:`rank`."""
        return rank(req, nodes)

    def key_array(self, view: NodeArrays, req: Request) -> FloatArray:
        """Key: the estimated power increase (:func:`power_increase_w`)."""
        return power_increase_w(view, req.demand.gpus)

    def key_at(self, view: NodeArrays, req: Request, i: int) -> float:
        """Key of node ``i``: :func:`power_increase_w` for that node alone, operation for operation."""
        used = view.used_gpus.item(i) + req.demand.gpus
        after = view.idle_w.item(i) + view.slope_w.item(i) * (used / view.cap_gpus_safe.item(i))
        return after - view.before_w.item(i)


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
