"""Following the Admin API's pages: every node or task, however many, one bounded response at a time."""

from __future__ import annotations

from typing import Any

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from common.pbenum import pb_enum
from coordinator.ctl.transport import Transport

__all__ = ["all_nodes", "all_tasks"]

_MAX_PAGES = 100_000   # a server that never ends its token chain cannot hang gptrmctl


def _follow(t: Transport, method: str, request: Any, field: str) -> tuple[list[Any], bool]:
    items: list[Any] = []
    stale = False
    for _ in range(_MAX_PAGES):
        resp = t.call(method, request)
        items.extend(getattr(resp, field))
        stale = stale or resp.stale
        if not resp.next_page_token:
            break
        request.page_token = resp.next_page_token
    return items, stale


def all_tasks(t: Transport, states: list[int] | None = None,
              page_size: int = 0, task_filter: admin_pb2.TaskFilter | None = None) -> tuple[list[types_pb2.Task], bool]:
    """Every task (in the given states, of those ``task_filter`` names), following pages; returns (tasks, any
    page was stale)."""
    request = admin_pb2.ListTasksRequest(states=[pb_enum(types_pb2.TaskState, s) for s in states or []],
                                         page_size=page_size, filter=task_filter)
    return _follow(t, "ListTasks", request, "tasks")


def all_nodes(t: Transport, states: list[int] | None = None,
              page_size: int = 0) -> tuple[list[admin_pb2.NodeView], bool]:
    """Every node (in the given states), following pages; returns (nodes, any page was stale)."""
    request = admin_pb2.ListNodesRequest(states=[pb_enum(types_pb2.NodeState, s) for s in states or []],
                                         page_size=page_size)
    return _follow(t, "ListNodes", request, "nodes")
