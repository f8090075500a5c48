"""A placement state kept from one scheduling cycle to the next, updated from what changed.

Building :class:`~coordinator.scheduler.placement.state.PlacementState` from a snapshot costs a few
Python objects per node and GPU: a third of a second at 30,000 nodes, more than deciding a whole
queue. The cluster changes little between two cycles, so :class:`LivePlacement` keeps the state (and
the shape cache, whose entries re-check only the nodes logged as changed) and, each cycle, applies
only the nodes whose snapshot differs from what the state holds:

* nodes whose snapshot object is not the one applied last time (the snapshot builder hands the
  same object for a node nothing changed on), and
* nodes the previous cycle's engine committed to or released on (its reservations were tentative),

each skipped when it already matches (:meth:`PlacementState.matches`: the usual case for a node the
last batch committed to, once the leader stored that placement). A new or removed node, a node with
more GPUs than before, or another threshold or mode builds the state again. Each cycle gets a fresh
policy (a round-robin cursor, the random generator and time-aware's memory start as they would on a
new engine), which the kept shape cache is bound to (entries whose key read the last policy's
memory are not reused: its shape variants name the policy), and a fresh refusal memo; the choices
are those of an engine built from the snapshot (``tests/unit/coordinator/scheduler/test_live_state.py``).
"""

from __future__ import annotations

import operator

import numpy as np

from coordinator.domain import ClusterSnapshot, NodeSnapshot
from coordinator.scheduler.placement.engine import PlacementEngine, collector_paused
from coordinator.scheduler.placement.gang_topology import label_groups
from coordinator.scheduler.placement.shape_cache import ShapeCache
from coordinator.scheduler.placement.state import PlacementState
from coordinator.scheduler.policies import DEFAULT_THRESHOLD, DEFAULT_THRESHOLD_MODE, build
from coordinator.scheduler.policies.base import IntArray

__all__ = ["LivePlacement"]


class LivePlacement:
    """The leader's placement state across cycles; :meth:`engine` gives each cycle its engine."""

    def __init__(self) -> None:
        self.state: PlacementState | None = None
        self._nodes: tuple[NodeSnapshot, ...] = ()
        self._settings: tuple[float, str] | None = None
        self._shapes: tuple[str, ShapeCache] | None = None   # the policy's name, its shape cache
        self._groups: tuple[str, IntArray | None] | None = None
        self.builds = 0      # full builds so far
        self.compared = 0    # nodes compared with the state by the last update
        self.applied = 0     # nodes applied by the last update

    def engine(self, snapshot: ClusterSnapshot, name: str, threshold: float = DEFAULT_THRESHOLD, *,
               seed: int | None = None, mode: str = DEFAULT_THRESHOLD_MODE, gang_label: str = "") -> PlacementEngine:
        """An engine on the cluster as ``snapshot`` shows it (see :meth:`PlacementEngine.from_name`).

        :param snapshot: this cycle's snapshot, nodes in the usual (node-id) order.
        :param name: the policy's name.
        :param threshold: its threshold.
        :param seed: RNG seed for ``random``.
        :param mode: the threshold mode.
        :param gang_label: the node label gangs prefer to share.
        :returns: the engine; its reservations are this cycle's, undone by the next call where they differ.
        :raises ValidationError: on an unknown policy or bad arguments.
        """
        policy = build(name, threshold, seed=seed, mode=mode)
        settings = (policy.threshold, policy.threshold_mode)
        state = self.state
        if state is None or settings != self._settings or not self._update(state, snapshot.nodes):
            with collector_paused():
                state = self.state = PlacementState(snapshot, policy.threshold, policy.threshold_mode)
            self._settings = settings
            self._shapes = None
            self._groups = None
            self.builds += 1
            self.compared = self.applied = len(snapshot.nodes)
        self._nodes = snapshot.nodes
        state.taken_at_s = snapshot.taken_at_s
        state.mark_applied()
        state.refresh_bounds()   # the last batch's commits left them loose (upper bounds still)
        # One cache at a time: caches share the state's change log, which one of them may cut.
        if self._shapes is None or self._shapes[0] != name:
            self._shapes = (name, ShapeCache(state, policy))
        shapes = self._shapes[1]
        shapes.bind(policy)
        if self._groups is None or self._groups[0] != gang_label:
            self._groups = (gang_label, label_groups(state.nodes, gang_label))
        return PlacementEngine.on_state(state, policy, shapes, self._groups[1])

    def _update(self, state: PlacementState, nodes: tuple[NodeSnapshot, ...]) -> bool:
        """Apply what changed since the last cycle; False when only a new state will do."""
        last = self._nodes
        if len(nodes) != len(last):
            return False
        # The suspects in node order: an identity test per node in C (map), then the touched ones marked.
        suspect = np.fromiter(map(operator.is_not, nodes, last), dtype=np.bool_, count=len(nodes))
        suspect[state.touched_nodes()] = True
        suspects = np.flatnonzero(suspect).tolist()
        changed = []
        for i in suspects:
            node = nodes[i]
            if node.node_id != state.nodes[i].node_id:
                return False   # a node came or went
            if not state.matches(i, node):
                changed.append(node)
            else:
                state.nodes[i] = node   # equal in everything placement reads; keep the newest object
        labels = any(node.labels != state.nodes[state.index[node.node_id]].labels for node in changed)
        if not state.apply(changed):
            return False
        if labels:
            self._groups = None
        self.compared, self.applied = len(suspects), len(changed)
        return True
