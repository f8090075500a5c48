"""Literal transcriptions of the placement algorithms, the yardstick for the production engine.

Written as plain loops over plain lists, one function per algorithm, straight from the algorithms as
CONTRIBUTING.md states them ("Placement policies"). They understand only what the paper's model has:
a demand vector per request, a capacity and a reservation vector per node, a threshold; every
node schedulable, no constraints, GPU slots not modelled. Gang requests (``nodes > 1``) take the
first ``nodes`` nodes of the same order, all or nothing.

Tie-breaking, defined once for both implementations: every sort is stable over the snapshot's
node order (Python's ``sorted``, also with ``reverse=True``), and requests of equal compute
demand keep their batch order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from coordinator.domain import ClusterSnapshot, Request

__all__ = ["RefNode", "reference_place", "to_ref_nodes"]

Choice = tuple[str, ...] | None
"""The nodes a request got (in choice order), or None when it waits."""


@dataclass
class RefNode:
    """A mutable node for the reference loops."""

    node_id: str
    capacity: list[float]
    used: list[float]
    powered_on: bool
    idle_w: float
    max_w: float


def to_ref_nodes(snapshot: ClusterSnapshot) -> list[RefNode]:
    """Copy a snapshot into mutable reference nodes, in snapshot order."""
    return [
        RefNode(
            node_id=n.node_id,
            capacity=list(n.capacity.as_tuple()),
            used=list(n.used.as_tuple()),
            powered_on=n.powered_on,
            idle_w=n.power.idle_w,
            max_w=n.power.max_w,
        )
        for n in snapshot.nodes
    ]


def compute_utilization(node: RefNode) -> float:
    """GPU compute used over GPU compute capacity (0 for a node without GPUs)."""
    if node.capacity[0] > 0:
        return node.used[0] / node.capacity[0]
    return 0.0


def fits(node: RefNode, request: Request, threshold: float) -> bool:
    """Every dimension stays ≤ threshold × capacity after placement."""
    demand = request.demand.as_tuple()
    for d in range(5):  # noqa: SIM110 - kept as the algorithm's explicit loop over dimensions
        if not node.used[d] + demand[d] <= threshold * node.capacity[d]:
            return False
    return True


def place_on(node: RefNode, request: Request) -> None:
    """Reserve the request's demand on the node."""
    demand = request.demand.as_tuple()
    for d in range(5):
        node.used[d] = node.used[d] + demand[d]


def power(node: RefNode, util: float) -> float:
    """Linear power curve: idle + (max - idle) · u."""
    return node.idle_w + (node.max_w - node.idle_w) * util


def power_increase(node: RefNode, request: Request) -> float:
    """Predicted power after placement minus before; an asleep node (off, or nothing allocated) draws 0 now."""
    nothing_allocated = all(u == 0 for u in node.used)
    if node.powered_on and not nothing_allocated:  # noqa: SIM108 - one branch per case of the definition
        before = power(node, compute_utilization(node))
    else:
        before = 0.0
    capacity = node.capacity[0] if node.capacity[0] > 0 else 1.0
    after = power(node, (node.used[0] + request.demand.gpus) / capacity)
    return after - before


def sort_requests(requests: Sequence[Request]) -> list[Request]:
    """Alg. 1-3, line 1: sort requests by descending compute demand."""
    return sorted(requests, key=lambda r: r.demand.gpus * r.nodes, reverse=True)


def first_fitting(order: list[RefNode], request: Request, threshold: float) -> list[RefNode]:
    """Walk nodes in order; collect the first ``request.nodes`` where the request fits."""
    chosen: list[RefNode] = []
    for node in order:
        if fits(node, request, threshold):
            chosen.append(node)
            if len(chosen) == request.nodes:
                break
    return chosen


def commit(chosen: list[RefNode], request: Request, result: dict[str, Choice]) -> bool:
    """All or nothing: reserve on every chosen node if there are enough of them."""
    if len(chosen) < request.nodes:
        result[request.task_id] = None  # Alg. 1/2: a new node is requested; Alg. 3: waits.
        return False
    for node in chosen:
        place_on(node, request)
    result[request.task_id] = tuple(n.node_id for n in chosen)
    return True


def algorithm_1_max_utilization(requests: Sequence[Request], nodes: list[RefNode], threshold: float) -> dict:
    """Alg. 1: nodes by descending compute utilization; the first that fits wins."""
    result: dict[str, Choice] = {}
    for request in sort_requests(requests):
        order = sorted(nodes, key=compute_utilization, reverse=True)
        commit(first_fitting(order, request, threshold), request, result)
    return result


def algorithm_2_load_balancing(requests: Sequence[Request], nodes: list[RefNode], threshold: float) -> dict:
    """Alg. 2: nodes by ascending compute utilization; the first that fits wins."""
    result: dict[str, Choice] = {}
    for request in sort_requests(requests):
        order = sorted(nodes, key=compute_utilization)
        commit(first_fitting(order, request, threshold), request, result)
    return result


def algorithm_3_power_efficient(requests: Sequence[Request], nodes: list[RefNode], threshold: float) -> dict:
    """Alg. 3: among nodes with enough resources, the smallest estimated power increase wins."""
    result: dict[str, Choice] = {}
    for request in sort_requests(requests):
        candidates = [n for n in nodes if fits(n, request, threshold)]
        candidates = sorted(candidates, key=lambda n: power_increase(n, request))
        commit(candidates[: request.nodes], request, result)
    return result


def first_fit(requests: Sequence[Request], nodes: list[RefNode], threshold: float) -> dict:
    """Baseline: queue order; the first node in snapshot order that fits."""
    result: dict[str, Choice] = {}
    for request in requests:
        commit(first_fitting(nodes, request, threshold), request, result)
    return result


def round_robin(requests: Sequence[Request], nodes: list[RefNode], threshold: float, cursor: int = 0) -> dict:
    """Baseline: queue order; walk from the cursor, wrapping; the cursor moves past the last node used."""
    result: dict[str, Choice] = {}
    for request in requests:
        order = nodes[cursor:] + nodes[:cursor]
        chosen = first_fitting(order, request, threshold)
        if commit(chosen, request, result):
            cursor = (nodes.index(chosen[-1]) + 1) % len(nodes)
    return result


def random_choice(requests: Sequence[Request], nodes: list[RefNode], threshold: float, seed: int) -> dict:
    """Baseline: queue order; uniformly random among the nodes that fit, from the uniforms of a numpy
    Generator with the given seed (``rng.random()``, one at a time). Each node of a request, with ``r``
    fitting nodes not yet taken by it among ``N``: while ``4 r >= N``, node ``floor(u N)`` for each
    next ``u`` until it is one of them; otherwise the ``floor(u r)``-th of them in node order."""
    rng = np.random.default_rng(seed)
    result: dict[str, Choice] = {}
    for request in requests:
        candidates = [n for n in nodes if fits(n, request, threshold)]
        chosen: list[RefNode] = []
        if len(candidates) >= request.nodes:
            for _ in range(request.nodes):
                left = [n for n in candidates if all(n is not c for c in chosen)]
                if 4 * len(left) >= len(nodes):
                    node = nodes[int(rng.random() * len(nodes))]
                    while all(node is not n for n in left):
                        node = nodes[int(rng.random() * len(nodes))]
                else:
                    node = left[int(rng.random() * len(left))]
                chosen.append(node)
        commit(chosen, request, result)
    return result


def reference_place(
    policy: str, snapshot: ClusterSnapshot, requests: Sequence[Request], threshold: float, seed: int = 0
) -> dict[str, Choice]:
    """Run the reference for a policy name on a copy of the snapshot."""
    nodes = to_ref_nodes(snapshot)
    if policy == "max-utilization":
        return algorithm_1_max_utilization(requests, nodes, threshold)
    if policy == "load-balancing":
        return algorithm_2_load_balancing(requests, nodes, threshold)
    if policy == "power-efficient":
        return algorithm_3_power_efficient(requests, nodes, threshold)
    if policy == "first-fit":
        return first_fit(requests, nodes, threshold)
    if policy == "round-robin":
        return round_robin(requests, nodes, threshold)
    if policy == "random":
        return random_choice(requests, nodes, threshold, seed)
    raise ValueError(f"no reference for policy {policy!r}")
