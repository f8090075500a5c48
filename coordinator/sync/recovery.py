"""A new leader's view, rebuilt from etcd: node records, tasks and the policy, read at one revision."""

from __future__ import annotations

from collections.abc import Mapping

from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES
from coordinator.monitor.nodes import NodeRegistry
from coordinator.sync.store import StoredState

__all__ = ["adopt_nodes", "task_ids_by_node"]


def adopt_nodes(state: StoredState, registry: NodeRegistry) -> None:
    """Merge etcd's node records into the node table.

    Reservations and admin state (cordon, drain) come from etcd, which the previous leader kept;
    a node whose agent already streams to us keeps the inventory of that live stream.
    """
    for rec in state.nodes.values():
        entry = registry.get(rec.inventory.node_id)
        if entry is None:
            registry.load(rec)
            continue
        inventory = types_pb2.NodeInventory()
        inventory.CopyFrom(entry.record.inventory)
        entry.record.CopyFrom(rec)
        entry.record.inventory.CopyFrom(inventory)


def task_ids_by_node(tasks: Mapping[str, types_pb2.Task], registry: NodeRegistry) -> None:
    """Rebuild each node's set of unfinished task ids from the tasks' allocations."""
    for entry in registry:
        entry.task_ids.clear()
    for task in tasks.values():
        if task.state in TERMINAL_STATES:
            continue
        for na in task.allocation.nodes:
            node = registry.get(na.node_id)
            if node is not None:
                node.task_ids.add(task.id)
