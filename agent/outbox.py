"""What the agent still has to tell the coordinator.

Two queues with different guarantees:

- task-status events are never dropped: each gets a sequence number and stays until the
  coordinator acknowledges it (``EventAck``), and is re-sent after every reconnect;
- telemetry is bounded: beyond ``max_samples`` the oldest sample is dropped and counted,
  and the count travels with the next batch so the coordinator can report the gap.

Samples pass through a :class:`~agent.summary.Summariser` first: while the coordinator asks for a
report interval longer than the sampling interval, one summary per report interval is queued
instead of every sample.
"""

from __future__ import annotations

import asyncio
import collections
import random

from agent.summary import Summariser
from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2, types_pb2

__all__ = ["Outbox"]


class Outbox:
    """Bounded telemetry buffer plus an acknowledged status-event log.

    Adding a sample or an event sets :attr:`wakeup`, which the stream waits on to send at once.

    :param max_samples: telemetry samples (or summaries) kept while they cannot be sent.
    :param sampling_interval_s: the agent's sampling interval (what a report interval is compared with).
    :param rng: spreads the agents' reports after a change of interval (see :mod:`agent.summary`).
    """

    def __init__(self, max_samples: int, sampling_interval_s: float = 1.0, rng: random.Random | None = None) -> None:
        self.wakeup = asyncio.Event()
        self.summary = Summariser(sampling_interval_s, rng if rng is not None else random.Random())
        self._samples: collections.deque[types_pb2.TelemetrySample] = collections.deque(maxlen=max_samples)
        self._events: collections.OrderedDict[int, agent_pb2.TaskStatus] = collections.OrderedDict()
        self._seq = 0
        self.dropped_total = 0
        self._dropping = False   # a sample was dropped since samples were last taken to be sent
        self._log = get_logger("agent_outbox")

    def _dropped(self) -> None:
        """Count a dropped sample; the first one since samples were last sent is logged (``telemetry_dropped``)."""
        self.dropped_total += 1
        if not self._dropping:
            self._dropping = True
            self._log.warning("telemetry_dropped", max_samples=self._samples.maxlen, dropped_total=self.dropped_total)

    def add_sample(self, sample: types_pb2.TelemetrySample) -> None:
        """A new sample: queued at once, or summarised (queued when its report interval is complete)."""
        out = self.summary.add(sample)
        if out is not None:
            self._queue(out)

    def set_report_interval(self, report_interval_s: float) -> None:
        """The coordinator's report interval (Welcome, TelemetryRate); back to every sample at or below
        the sampling interval, with what was being summarised sent first."""
        out = self.summary.set_report_interval(report_interval_s)
        if out is not None:
            self._queue(out)

    @property
    def report_interval_s(self) -> float:
        return self.summary.report_interval_s

    @property
    def quiet_s(self) -> float:
        """How long the stream may be silent before a heartbeat is due on account of telemetry: the report
        interval plus one sampling interval while summarising (a summary a little late is not doubled by a
        heartbeat), else 0 (the heartbeat interval alone decides)."""
        s = self.summary
        return s.report_interval_s + s.sampling_interval_s if s.summarising else 0.0

    def _queue(self, sample: types_pb2.TelemetrySample) -> None:
        if len(self._samples) == self._samples.maxlen:
            self._dropped()
        self._samples.append(sample)
        self.wakeup.set()

    def take_samples(self, limit: int) -> list[types_pb2.TelemetrySample]:
        """Remove and return up to ``limit`` samples, oldest first."""
        n = min(limit, len(self._samples))
        self._dropping = False
        return [self._samples.popleft() for _ in range(n)]

    def requeue_samples(self, samples: list[types_pb2.TelemetrySample]) -> None:
        """Put back samples that could not be written, ahead of newer ones (still bounded)."""
        for s in reversed(samples):
            if len(self._samples) == self._samples.maxlen:
                self._dropped()
                continue
            self._samples.appendleft(s)

    @property
    def pending_samples(self) -> int:
        return len(self._samples)

    def add_event(self, status: agent_pb2.TaskStatus) -> int:
        """Queue a status event; returns its sequence number."""
        self._seq += 1
        status.event_seq = self._seq
        self._events[self._seq] = status
        self.wakeup.set()
        return self._seq

    def ack(self, up_to_seq: int) -> None:
        """The coordinator has durably applied every event ≤ ``up_to_seq``."""
        while self._events:
            seq = next(iter(self._events))
            if seq > up_to_seq:
                break
            del self._events[seq]

    def events_after(self, seq: int) -> list[agent_pb2.TaskStatus]:
        """Unacknowledged events with a sequence number above ``seq``, oldest first."""
        return [e for s, e in self._events.items() if s > seq]

    @property
    def pending_events(self) -> int:
        return len(self._events)
