"""The production placement engine: a batch of requests against a cluster snapshot.

The pipeline for each request, in this order:

1. **queue order** — the caller hands the batch in queue order (:func:`coordinator.domain.queue_key`);
   policies that follow the paper (Alg. 1-3) then take it by descending compute demand (a stable
   sort, so equal demands keep queue order); the baselines keep queue order.
2. **demand** — the profiler already turned each task into a :class:`Request`.
3. **filter** — every node: constraints, every dimension ≤ its limit after placement (the
   threshold rule of :func:`~coordinator.scheduler.policies.base.limit_factors`), and the right
   free GPUs. Cheapest first, and before ranking, because ranking only needs to look at survivors.
   The result is kept per request shape (:mod:`coordinator.scheduler.placement.shape_cache`): the first
   request of a shape runs the vectorised filter over all nodes; later ones re-check only the
   nodes committed to or released since, so one decision does not scan every node.
4. **rank/select** — Alg. 1-3 rank by a per-node key that the same cache keeps (+inf on refused
   nodes), so choosing is one ``argmin``; the baselines' ``select`` reads the cached mask.
5. **allocate** — concrete GPU indices on the chosen node(s); the state is updated at once, so
   the next request of the same batch sees this reservation.

Gang requests (``nodes > 1``) are all or nothing: either ``nodes`` distinct nodes pass the filter
and all are reserved, or nothing is. With a gang topology label, a gang that fits among the nodes
sharing one value of it is kept there (:mod:`coordinator.scheduler.placement.gang_topology`).

Before step 3 two exact shortcuts refuse requests that cannot fit without looking at every
node: an earlier refusal of a request that needed no more (reservations only grow until
:meth:`PlacementEngine.release`), and upper bounds on the room any node has left. Both give the
answer the full filter would give; they only make refusals cheap.

Example::

    engine = PlacementEngine.from_name(snapshot, "power-efficient", threshold=0.9)
    for decision in engine.place_batch(requests):
        if isinstance(decision, Placement):
            ...  # commit decision.assignments
        else:
            ...  # keep waiting; log decision.reason; scale out if decision.scale_out
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from coordinator.domain import (
    DIMENSIONS,
    ClusterSnapshot,
    Decision,
    NodeSnapshot,
    Placement,
    Rejection,
    Request,
    new_placement,
)
from coordinator.scheduler.placement.gang_topology import label_groups, prefer_one_group
from coordinator.scheduler.placement.refusals import RefusalMemo
from coordinator.scheduler.placement.shape_cache import ShapeCache
from coordinator.scheduler.placement.state import PlacementState
from coordinator.scheduler.policies import DEFAULT_THRESHOLD, DEFAULT_THRESHOLD_MODE, Policy, build
from coordinator.scheduler.policies.base import (
    BoolArray,
    FloatArray,
    IntArray,
    constraint_reason,
    dimension_reason,
    first_k_keyed,
    gpu_fit_reason,
)

__all__ = ["PlacementEngine", "collector_paused", "describe_demand"]

_GIB = 1024**3
_SAMPLE_REASONS = 5


def describe_demand(req: Request) -> str:
    """A short phrase for what a request needs on each node, for rejection messages.

    :param req: the request.
    :returns: e.g. ``"4 free GPUs of ≥ 80 GiB, 16 cores, 128 GiB memory"``.
    """
    d = req.demand
    if req.whole_gpus > 0:
        gpus = f"{req.whole_gpus} free GPUs of ≥ {req.gpu_mem_per_gpu_bytes / _GIB:.0f} GiB"
    elif d.gpus > 0:
        gpus = f"a {d.gpus:g} share of a GPU with {req.gpu_mem_per_gpu_bytes / _GIB:.0f} GiB free"
    else:
        gpus = "no GPU"
    return f"{gpus}, {d.cpu_cores:g} cores, {d.mem_bytes / _GIB:.0f} GiB memory, {d.disk_bytes / _GIB:.0f} GiB disk"


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for one batch (or one state build), then restore it as it was.

    A batch allocates many small acyclic objects (decisions, tuples), which keeps triggering
    collections that walk every live object, the snapshot's included: about a tenth of a
    batch's time, and half of building the state of a large cluster. Nothing the engine
    creates forms a reference cycle, so reference counting frees it all the same; collection
    resumes when the work ends.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def prefer_image_holder(i: int, keyed: np.ndarray, nodes: Sequence[NodeSnapshot], image: str) -> int:
    """Node ``i``, or the first node the policy ranks equal to it (the same key, so feasible) whose image store
    holds ``image`` (Kubernetes' image locality: a node that need not pull starts the task sooner)."""
    if image in nodes[i].images:
        return i
    for j in np.flatnonzero(keyed == keyed[i]).tolist():
        if image in nodes[j].images:
            return int(j)
    return i


class PlacementEngine:
    """Places requests on a snapshot with one policy, reserving as it goes.

    :param snapshot: the cluster at the start of the cycle; node order is the tie-break order.
    :param policy: the policy (see :data:`coordinator.scheduler.policies.POLICIES`).
    :param gang_label: the node label whose shared value gangs prefer ("" none).
    """

    def __init__(self, snapshot: ClusterSnapshot, policy: Policy, *, gang_label: str = "") -> None:
        self.policy = policy
        self._gang_groups = label_groups(snapshot.nodes, gang_label)
        with collector_paused():   # building the state allocates a few Python objects per node and GPU
            self.state = PlacementState(snapshot, policy.threshold, policy.threshold_mode)
        self.state.set_derive_on_commit(policy.reads_view)
        self._refusals = RefusalMemo()
        self._like: dict[tuple[tuple[float, int, float, int, int], int, int], str] = {}   # _reject_like's reasons
        self._shapes = ShapeCache(self.state, policy)

    @classmethod
    def on_state(cls, state: PlacementState, policy: Policy, shapes: ShapeCache,
                 gang_groups: IntArray | None) -> PlacementEngine:
        """An engine on a state kept across cycles (:class:`~coordinator.scheduler.placement.live.LivePlacement`).

        :param state: the state, brought up to date with this cycle's snapshot.
        :param policy: a fresh policy.
        :param shapes: the state's shape cache for this policy's key.
        :param gang_groups: :func:`label_groups` of the state's nodes.
        :returns: the engine (a fresh refusal memo: nothing refused yet this cycle).
        """
        engine = cls.__new__(cls)
        engine.policy = policy
        engine._gang_groups = gang_groups
        engine.state = state
        state.set_derive_on_commit(policy.reads_view)
        engine._refusals = RefusalMemo()
        engine._like = {}
        engine._shapes = shapes
        return engine

    @classmethod
    def from_name(
        cls, snapshot: ClusterSnapshot, name: str, threshold: float = DEFAULT_THRESHOLD, *, seed: int | None = None,
        mode: str = DEFAULT_THRESHOLD_MODE,
        gang_label: str = "",
    ) -> PlacementEngine:
        """Build an engine with a policy from the registry.

        :param snapshot: the cluster.
        :param name: policy name (``max-utilization``, ``load-balancing``, ``power-efficient``,
            ``round-robin``, ``random``, ``first-fit``).
        :param threshold: cap on the capped dimensions' utilization after placement, in (0, 1].
        :param seed: RNG seed for ``random``.
        :param mode: the threshold mode (``whole-gpus`` or ``paper``).
        :param gang_label: see the class.
        :returns: the engine.
        :raises ValidationError: on an unknown policy or bad arguments.
        """
        return cls(snapshot, build(name, threshold, seed=seed, mode=mode), gang_label=gang_label)

    def place_batch(self, requests: Sequence[Request], *, keep_order: bool = False) -> list[Decision]:
        """Decide a batch; each placement is reserved before the next request is considered.

        :param requests: the batch, in queue order.
        :param keep_order: decide in the given order even for policies that sort by demand.
        :returns: one decision per request, aligned with ``requests`` (not with decision order).
        """
        order: Sequence[int] = range(len(requests))
        if self.policy.sorts_requests and not keep_order:
            # Alg. 1-3: largest compute demand first; sorted() is stable, so ties keep queue order.
            order = sorted(order, key=lambda k: -requests[k].compute_demand)
        decisions: list[Decision | None] = [None] * len(requests)
        with collector_paused():
            for k in order:
                decisions[k] = self.place(requests[k])
        return [d for d in decisions if d is not None]

    def place(self, req: Request) -> Decision:
        """Decide one request against the current state and reserve it when placed.

        :param req: the request.
        :returns: a placement, or a rejection with its reason.
        """
        state = self.state
        values = req.demand.as_tuple()
        whole = req.whole_gpus
        # Two shortcuts for requests that cannot fit, before the filter: an earlier refusal of a
        # request needing no more, and upper bounds on what any node has left.
        earlier = self._refusals.find(req, values, whole)
        if earlier is not None:
            return self._reject_like(req, earlier, values, whole)
        hopeless = state.hopeless(req, values, whole)
        if hopeless is not None:
            return self._remember(req, whole, self._reject_hopeless(req, hopeless))
        entry = self._shapes.lookup(req, values, whole)
        policy = self.policy
        count = req.nodes
        if entry.suspects and (count != 1 or not policy.confirms_lazily):
            entry.settle()   # everything but a lazily confirmed choice reads the exact mask
        mask = entry.mask
        keyed = entry.keyed if policy.ranked_by_key else None
        if count > 1 and self._gang_groups is not None:
            mask = prefer_one_group(mask, self._gang_groups, count, keyed)
        if count > len(state.nodes):
            chosen = np.zeros(0, dtype=np.int64)
        elif mask is entry.mask:
            # The whole feasible set: the policy reads the entry's block index, not every node.
            if count == 1:
                i = policy.select_one(state.view, entry, req)
                if i >= 0 and req.image and keyed is not None:
                    i = prefer_image_holder(i, keyed, state.nodes, req.image)
                if i >= 0:   # one node: committed without building arrays
                    assignment = state.commit(i, req, values, whole, entry.exact)
                    policy.committed_one(i, len(state.nodes))
                    return new_placement(req.task_id, (assignment,), req.demand, policy.name)
                chosen = np.zeros(0, dtype=np.int64)
            else:
                chosen = policy.select_indexed(state.view, entry, req)
        elif keyed is not None:
            chosen = first_k_keyed(keyed, mask, count)
        else:
            chosen = policy.select(state.view, mask, req)
        if len(chosen) < count:
            entry.settle()
            rejection = self._reject(req, np.array(values, dtype=np.float64), mask)
            state.refresh_bounds()
            return self._remember(req, whole, rejection)
        commit, exact = state.commit, entry.exact
        assignments = tuple([commit(i, req, values, whole, exact) for i in chosen.tolist()])
        policy.committed(chosen, len(state.nodes))
        return new_placement(req.task_id, assignments, req.demand, policy.name)

    def release(self, placement: Placement, gpu_mem_per_gpu_bytes: int) -> None:
        """Give a finished task's reservations back (for simulators and long-lived engines).

        :param placement: what :meth:`place` returned for it.
        :param gpu_mem_per_gpu_bytes: the request's ``gpu_mem_per_gpu_bytes``.
        :raises PlacementError: when a node of the placement is unknown.
        """
        for assignment in placement.assignments:
            self.state.release(assignment, placement.demand, gpu_mem_per_gpu_bytes)
        self._refusals.clear()

    def node_snapshot(self, i: int) -> NodeSnapshot:
        """Node ``i`` (original order) with every reservation made so far."""
        return self.state.node_snapshot(i)

    def snapshot(self) -> ClusterSnapshot:
        """The cluster with every reservation made so far.

        :returns: a new snapshot, nodes in the original order.
        """
        state = self.state
        return ClusterSnapshot(
            nodes=tuple(state.node_snapshot(i) for i in range(len(state.nodes))), taken_at_s=state.taken_at_s
        )

    def _remember(self, req: Request, whole: int, rejection: Rejection) -> Rejection:
        """Note a refusal for later shortcuts and return it."""
        self._refusals.remember(req, whole, rejection)
        return rejection

    def _reject_like(self, req: Request, earlier: Rejection, values: tuple[float, int, float, int, int],
                     whole: int) -> Rejection:
        """A rejection implied by an earlier one (this request needs no less, nothing was freed since).

        The reason names no task: the first task refused changes from cycle to cycle while the queue drains, and
        a reason that changed would replace every waiting task's record each cycle. It is worded once per
        request shape (``values``: the demand's tuple; ``whole``: whole GPUs) in the engine's batch."""
        key = (values, whole, req.gpu_mem_per_gpu_bytes)
        reason = self._like.get(key)
        if reason is None:
            reason = self._like[key] = (
                f"no node with {describe_demand(req)} under threshold {self.policy.threshold:g} "
                "(a task ahead of it, needing no more, was refused and nothing was freed since)")
        return Rejection(task_id=req.task_id, reason=reason, node_reasons=earlier.node_reasons,
                         scale_out=self.policy.scale_out)

    def _reject_hopeless(self, req: Request, why: str) -> Rejection:
        """A rejection decided from the bounds alone, with reasons for the first few nodes."""
        reason = f"no node with {describe_demand(req)} under threshold {self.policy.threshold:g} ({why})"
        sample = range(min(_SAMPLE_REASONS, len(self.state.nodes)))
        node_reasons = tuple((self.state.nodes[i].node_id, self._node_reason(req, i)) for i in sample)
        return Rejection(task_id=req.task_id, reason=reason, node_reasons=node_reasons, scale_out=self.policy.scale_out)

    def _reject(self, req: Request, demand: FloatArray, mask: BoolArray) -> Rejection:
        """Explain why no (or too few) nodes could take a request, with counts per failing step."""
        state = self.state
        n_feasible = int(np.count_nonzero(mask))
        if n_feasible > 0:
            reason = f"gang needs {req.nodes} nodes with {describe_demand(req)}; only {n_feasible} qualify"
        else:
            reason = f"no node with {describe_demand(req)} under threshold {self.policy.threshold:g}"
        ok = state.dimension_ok(req, demand)
        counts = _refusal_counts(state.static_mask(req), ok, state.gpu_ok(req, req.whole_gpus))
        if counts:
            reason += " (" + ", ".join(f"{n} nodes: {why}" for why, n in counts) + ")"
        node_reasons = tuple(
            (state.nodes[i].node_id, self._node_reason(req, i))
            for i in np.flatnonzero(~mask)[:_SAMPLE_REASONS].tolist()
        )
        return Rejection(task_id=req.task_id, reason=reason, node_reasons=node_reasons, scale_out=self.policy.scale_out)

    def _node_reason(self, req: Request, i: int) -> str:
        """The short reason node ``i`` refuses the request now: the scalar filter's answer on the node as it is now."""
        state = self.state
        node = state.nodes[i]
        policy = self.policy
        return (
            constraint_reason(req, node)
            or dimension_reason(req, state.used_of(i), node.capacity.as_tuple(), policy.threshold,
                                policy.threshold_mode)
            or gpu_fit_reason(req, state.slot_mem[i], state.slot_share[i])
            or "gang incomplete"
        )


def _refusal_counts(static: BoolArray | None, ok: BoolArray, gpu: BoolArray | None) -> list[tuple[str, int]]:
    """How many nodes each filter step refused (a node counts once, at its first failing step)."""
    alive = np.ones(ok.shape[1], dtype=np.bool_) if static is None else static.copy()
    counts = [("constraints", int(np.count_nonzero(~alive)))]
    for dim, name in enumerate(DIMENSIONS):
        counts.append((f"{name} over threshold", int(np.count_nonzero(alive & ~ok[dim]))))
        alive &= ok[dim]
    if gpu is not None:
        counts.append(("GPUs not free", int(np.count_nonzero(alive & ~gpu))))
    return [(why, n) for why, n in counts if n > 0]
