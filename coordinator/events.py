"""Cluster event log: a bounded backlog plus live subscribers (``gptrmctl events --follow``)."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Event", "EventBus", "EventKind"]

EventKind = str
"""One of node_joined, node_state, task_state, decision, leader, policy, scale_out, etcd, audit, power, preemption,
qos_violation, scale, queues, resize, health, reservation."""

KINDS = ("node_joined", "node_state", "task_state", "decision", "leader", "policy", "scale_out", "etcd", "audit",
         "power", "preemption", "qos_violation", "scale", "queues", "resize", "health", "reservation")


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened in the cluster."""

    seq: int
    time_unix_s: float
    kind: EventKind
    message: str
    node_id: str = ""
    task_id: str = ""
    fields: dict[str, str] = field(default_factory=dict)


class EventBus:
    """Publishes events to a bounded backlog and to every subscriber queue.

    Example::

        bus = EventBus()
        q = bus.subscribe()
        bus.publish("node_joined", "node n1 registered", node_id="n1")
        event = q.get_nowait()
    """

    def __init__(self, backlog: int = 1000, now: Callable[[], float] = time.time) -> None:
        self._backlog: collections.deque[Event] = collections.deque(maxlen=backlog)
        self._subscribers: set[asyncio.Queue[Event]] = set()
        self._seq = 0
        self._now = now

    def publish(self, kind: EventKind, message: str, *, node_id: str = "", task_id: str = "",
                **fields: object) -> Event:
        """Record an event and hand it to every subscriber (slow subscribers lose the oldest)."""
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        self._seq += 1
        event = Event(self._seq, self._now(), kind, message, node_id, task_id, {k: str(v) for k, v in fields.items()})
        self._backlog.append(event)
        for q in self._subscribers:
            if q.full():
                q.get_nowait()
            q.put_nowait(event)
        return event

    def recent(self, n: int) -> list[Event]:
        """The last ``n`` events, oldest first."""
        return list(self._backlog)[-n:] if n > 0 else []

    def subscribe(self, maxsize: int = 10000) -> asyncio.Queue[Event]:
        """A queue that receives every event published from now on."""
        q: asyncio.Queue[Event] = asyncio.Queue(maxsize=maxsize)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[Event]) -> None:
        self._subscribers.discard(q)
