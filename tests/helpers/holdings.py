"""What nodes hold, as a new leader derives it from what etcd stores (for tests of the stored layout)."""

from __future__ import annotations

from coordinator.monitor.nodes import NodeRegistry
from coordinator.state import LeaderState
from coordinator.sync import Store

__all__ = ["held_gpus"]


def held_gpus(store: Store) -> dict[str, list[int]]:
    """node id → the GPU indices held there (sorted multiset), as ``LeaderState.adopt`` of ``Store.load_all``
    derives them from the stored allocations; nodes holding nothing are left out."""
    loaded = store.load_all()
    state = LeaderState(NodeRegistry(1.0, 10.0))
    state.adopt(loaded.tasks, loaded.nodes, loaded.allocations)
    nodes = {na.node_id for a in loaded.allocations.values() for na in a.nodes}
    return {n: list(state.holdings.reservation_on(n).gpu_indices) for n in sorted(nodes)}
