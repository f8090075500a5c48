"""Scale-out requests: the paper's ``createNewNode()`` when Alg. 1 or Alg. 2 finds no node for a task.

On bare metal nobody can create a node, so a request is an event and a log line an operator (or a
node provider) acts on; the task keeps waiting. Alg. 3 never asks for a node: it waits.
"""

from __future__ import annotations

from common.logging import get_logger
from coordinator.events import EventBus

__all__ = ["SCALE_OUT_POLICIES", "ScaleOutRequests"]

SCALE_OUT_POLICIES = ("max-utilization", "load-balancing")
"""Policies that request a new node when a task fits nowhere (paper Alg. 1 and 2)."""


class ScaleOutRequests:
    """One scale-out request per waiting task, until it is placed or ends.

    Example::

        scale_out.request("t-1", "no node with 8 free GPUs", policy="max-utilization")   # event published
        scale_out.request("t-1", "no node with 8 free GPUs", policy="max-utilization")   # already asked: nothing
        scale_out.forget("t-1")                                                           # the task ended

    :param events: the cluster event log.
    """

    def __init__(self, events: EventBus) -> None:
        self._events = events
        self._sent: set[str] = set()
        self._log = get_logger("adaptor")

    def request(self, task_id: str, reason: str, *, policy: str) -> bool:
        """Ask for a node for ``task_id`` under ``policy``; True when a new request went out."""
        if policy not in SCALE_OUT_POLICIES or task_id in self._sent:
            return False
        self._sent.add(task_id)
        self._events.publish("scale_out", f"scale-out requested for task {task_id}: {reason}", task_id=task_id,
                             reason=reason)
        self._log.info("scale_out_requested", task_id=task_id, reason=reason, policy=policy)
        return True

    def forget(self, task_id: str) -> None:
        """The task was placed or ended: a later wait may ask again."""
        self._sent.discard(task_id)

    @property
    def outstanding(self) -> int:
        """Tasks with a request out."""
        return len(self._sent)
