"""The door: a submitted task that no known node could ever hold is refused at submit, not queued.

"Could ever hold" is the placement filter itself (:func:`~coordinator.scheduler.policies.base.feasible`,
under the policy's threshold and threshold mode) on an empty copy of every known node: ready, off,
cordoned, draining and lost nodes alike, as each would be with nothing reserved and schedulable
(:meth:`~coordinator.scheduler.snapshot.SnapshotBuilder.empty_nodes`). A gang needs that many such
nodes. Nothing is refused while no node is known at all, nor when a node provider can create nodes
(a new node may be the answer); and an operator can queue such a task on purpose
(``gptrmctl submit --queue-unplaceable``).

A task whose constraints (``--nodelist``, ``--exclude``, ``--constraint`` labels, the GPU model) no known node
matches is refused naming the constraint field (:func:`constraint_refusal`).

An elastic task is judged at both ends of its range: at its minimum (where it starts) and at its
maximum (what it asked to grow to). A maximum no known node could hold (``--gpus 1:5`` where every
node has 4 GPUs) is refused like a fixed request of that size, naming ``spec.elastic.max_gpus`` (or
``max_nodes``), as a batch scheduler refuses a request no node can satisfy, rather than accepting a
range whose top can never be reached.

Example::

    admission = PlaceabilityCheck(lambda: snapshots.empty_nodes(registry), lambda: policy.current, creates_nodes=False,
                                  generation=lambda: registry.generation)
    admission.check(task)   # raises PlacementError with the reason
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from common.errors import PlacementError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from coordinator.domain import NodeSnapshot, Request
from coordinator.elastic.rules import request_at
from coordinator.elastic.spec import elastic_range
from coordinator.scheduler.placement.engine import describe_demand
from coordinator.scheduler.policies.base import feasible
from coordinator.scheduler.policy import threshold_mode
from coordinator.scheduler.queue import request_for

__all__ = ["PlaceabilityCheck", "constraint_refusal", "unplaceable_reason"]

_GIB = 1024**3
_NOT_AVAILABLE = "requested node configuration is not available"


def _size(node: NodeSnapshot) -> tuple[float, int, float, int, int]:
    """What "largest" compares: GPUs first, then GPU memory, cores, memory, disk."""
    return node.capacity.as_tuple()


def _describe_node(node: NodeSnapshot) -> str:
    c = node.capacity
    return (f"{c.gpus:g} GPUs, {c.cpu_cores:g} cores, {c.mem_bytes / _GIB:.0f} GiB memory, "
            f"{c.disk_bytes / _GIB:.0f} GiB disk")


def _few(names: Sequence[str], most: int = 5) -> str:
    shown = ", ".join(sorted(names)[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def constraint_refusal(req: Request, nodes: Sequence[NodeSnapshot]) -> str | None:
    """The constraint field that no known node can ever match, in the order they narrow the nodes down
    (``--nodelist``, ``--exclude``, ``--constraint``, the GPU model); None when some node matches them all.

    :param req: the task's placement request.
    :param nodes: every known node.
    """
    left = list(nodes)
    if req.only_nodes:
        left = [n for n in left if n.node_id in req.only_nodes]
        if not left:
            return (f"spec.constraints.only_nodes: no known node is among {_few(list(req.only_nodes))} "
                    f"(known: {_few([n.node_id for n in nodes])})")
    if req.avoid_nodes:
        left = [n for n in left if n.node_id not in req.avoid_nodes]
        if not left:
            return "spec.constraints.avoid_nodes: it excludes every known node it could go to"
    for key, value in sorted(req.node_selector.items()):
        left = [n for n in left if n.labels.get(key) == value]
        if not left:
            return f"spec.constraints.node_selector: no known node it could go to has the label {key}={value}"
    if req.gpu_model and not any(req.gpu_model.lower() in n.gpu_model.lower() for n in left):
        return f"spec.constraints.gpu_model: no known node it could go to has a {req.gpu_model!r} GPU"
    return None


_PASSED_MAX = 1024
"""Request shapes the admission check remembers as placeable at most (then it starts over)."""


def unplaceable_reason(req: Request, nodes: Sequence[NodeSnapshot], threshold: float, mode: str) -> str | None:
    """Why no known node (or too few, for a gang) could hold the request even empty; None when enough could.

    :param req: the task's placement request.
    :param nodes: every known node, empty and schedulable.
    :param threshold: the policy's threshold.
    :param mode: the policy's threshold mode.
    :returns: the reason, naming the largest node and what it lacks; None when the request could be placed,
        or when no node is known (nothing to judge by).
    """
    if not nodes:
        return None
    refusals = [(node, feasible(req, node, threshold, mode)) for node in nodes]
    fitting = sum(1 for _, why in refusals if why is None)
    if fitting >= req.nodes:
        return None
    if fitting == 0:
        unmatched = constraint_refusal(req, nodes)
        if unmatched is not None:
            return f"{_NOT_AVAILABLE}: {unmatched}"
    if fitting > 0:
        return (f"{_NOT_AVAILABLE}: spec.nodes: a gang of {req.nodes} nodes requested; only {fitting} of the "
                f"{len(nodes)} known nodes could hold {describe_demand(req)} even empty")
    largest, why = max(refusals, key=lambda pair: _size(pair[0]))
    if req.whole_gpus > largest.capacity.gpus:
        return (f"{_NOT_AVAILABLE}: spec.demand.gpus: {req.whole_gpus} GPUs per node requested; "
                f"the largest node, {largest.node_id}, has {largest.capacity.gpus:g}")
    return (f"{_NOT_AVAILABLE}: no known node could hold {describe_demand(req)} even empty; the largest node, "
            f"{largest.node_id} ({_describe_node(largest)}), refuses it: {why}")


class PlaceabilityCheck:
    """Refuses, at submit, tasks that could never be placed (see the module docstring).

    :param nodes: every known node, empty and schedulable (called once per submit).
    :param policy: the policy in force (its threshold and threshold mode).
    :param creates_nodes: the node provider can create nodes: never refuse.
    :param generation: the node table's change counter (:attr:`~coordinator.monitor.nodes.NodeRegistry.generation`);
        while it is the one the nodes were last fetched at, ``nodes`` is not called again and the nodes fetched
        then are judged. None: ``nodes`` is called at every check.
    """

    def __init__(self, nodes: Callable[[], Sequence[NodeSnapshot]], policy: Callable[[], types_pb2.Policy], *,
                 creates_nodes: bool, generation: Callable[[], int] | None = None) -> None:
        self._nodes, self._policy, self._creates_nodes = nodes, policy, creates_nodes
        self._generation = generation
        self._fetched_at: int | None = None   # the generation ``_passed_on`` was fetched at
        self._log = get_logger("admission")
        # The shapes let through on the node views in ``_passed_on`` (the same objects: a view is immutable, and
        # ``SnapshotBuilder.empty_nodes`` hands out a new one when a node changes). Two requests of one shape are
        # accepted by the same nodes, so a sweep's thousand submits of one shape check the nodes once.
        self._passed: set[tuple[object, ...]] = set()
        self._passed_on: tuple[NodeSnapshot, ...] = ()

    def check(self, task: types_pb2.Task) -> None:
        """Let the profiled task through, or refuse it.

        :param task: the task about to be queued (its demand profiled).
        :raises PlacementError: no known node could hold it even empty (gangs: not enough of them).
        """
        if self._creates_nodes:
            return
        policy = self._policy()
        req = request_for(task)
        rng = elastic_range(task.spec)
        generation = None if self._generation is None else self._generation()
        if generation is None or generation != self._fetched_at:
            nodes: Sequence[NodeSnapshot] = self._nodes()
            if len(nodes) != len(self._passed_on) or any(a is not b for a, b in zip(nodes, self._passed_on,
                                                                                     strict=True)):
                self._passed, self._passed_on = set(), tuple(nodes)
            self._fetched_at = generation
        else:   # the table has not changed since the nodes were fetched: they are the nodes now
            nodes = self._passed_on
        key = (req.shape, rng, policy.threshold, threshold_mode(policy))
        if key in self._passed:
            return
        reason = unplaceable_reason(req, nodes, policy.threshold, threshold_mode(policy))
        if reason is None and rng is not None:
            top = request_at(req, rng, rng.maximum)
            reason = unplaceable_reason(top, nodes, policy.threshold, threshold_mode(policy))
            if reason is not None:   # name the field the submitter wrote, not the request derived from it
                reason = (reason.replace("spec.demand.gpus:", "spec.elastic.max_gpus:")
                          .replace("spec.nodes:", "spec.elastic.max_nodes:")
                          + " (the elastic range's maximum; lower it to what a node can hold)")
        if reason is not None:
            self._log.info("task_refused_unplaceable", name=task.spec.name, gpus=req.demand.gpus, nodes=req.nodes,
                           reason=reason)
            raise PlacementError(reason)
        if len(self._passed) >= _PASSED_MAX:
            self._passed.clear()
        self._passed.add(key)
