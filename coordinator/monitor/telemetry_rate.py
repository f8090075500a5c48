"""Telemetry rate: keep the leader's ingest within its budget as nodes grow.

Every agent samples at the sampling interval (1 s). While the nodes with an open stream would
send more samples a second than ``--ingest-budget``, the leader asks every agent for one summary
per *report interval* instead (mean, max and last of its own samples: ``agent/summary.py``):

    report interval = max(sampling interval, nodes / budget), rounded up to one of STEPS_S

(nodes: those connected, and those not LOST that may reconnect any moment), so ingest stays at or
under the budget up to ``budget × 15`` nodes (beyond that the interval stays at 15 s and ingest grows
again; the status shows it). Registrations draw on the same budget: each costs the leader about
:data:`REGISTRATION_COST` samples' work, so while agents register faster than the budget leaves room
for (a whole fleet after a leader change, or a cold start), the interval goes up and the
registrations get the time the telemetry of the agents already back would have taken; once none
came for :data:`STORM_QUIET_S`, the interval returns to what the nodes alone need (below
:data:`STORM_MIN_PER_S` registrations a second they are ordinary churn and change nothing).
Hysteresis: the interval goes up at once (over budget is the failure this prevents), and down only
when the lower interval would load at most :data:`DOWN_MARGIN` of the budget and the current one
has held :data:`HOLD_S`, so a reconnect storm or a few nodes coming and going does not flap 30,000
agents between intervals.

A change is pushed to every connected agent (``CoordinatorMessage.telemetry_rate``); an agent that
(re)connects reads the interval in force in its ``Welcome``. An older agent ignores the push and
keeps sending every sample, which the leader ingests as before. The node registry's liveness
window follows the interval (:meth:`NodeRegistry.set_report_interval`): the agents' heartbeats do
too, so a node reporting every 10 s stays READY.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2
from common.types import NodeState
from coordinator.monitor.nodes import NodeRegistry

__all__ = ["DOWN_MARGIN", "HOLD_S", "REGISTRATION_COST", "STEPS_S", "STORM_MIN_PER_S", "STORM_QUIET_S",
           "RateMetrics", "TelemetryRate",
           "interval_for"]

STEPS_S = (1.0, 2.0, 5.0, 10.0, 15.0)
"""The report intervals the leader chooses from (a small set: agents change interval rarely)."""
DOWN_MARGIN = 0.8
"""A shorter interval is taken only when it would load at most this fraction of the budget."""
HOLD_S = 30.0
"""Least seconds an interval is kept before a shorter one is taken."""
_RATE_WINDOW_S = 10.0
REGISTRATION_COST = 5.0
"""Samples' worth of the leader's work one registration costs (a Connect with its inventory checks, the node
record's batched write and reconcile: about 1 ms of its event loop, against about 0.2 ms for a sample)."""
STORM_QUIET_S = 10.0
"""Seconds without a registration storm after which an interval a storm raised returns to what the nodes need."""
STORM_MIN_PER_S = 50.0
"""Registrations a second below which they are ordinary churn (agents restarting, a rack rebooting) and leave
the interval alone; at or above it they are a fleet arriving at once and draw on the budget."""


def interval_for(nodes: int, budget_per_s: float, sampling_interval_s: float) -> float:
    """The shortest step that keeps ``nodes`` summaries a report interval within the budget (the longest
    step when none does); never below the sampling interval."""
    need = nodes / budget_per_s if budget_per_s > 0 else 0.0
    if need <= sampling_interval_s + 1e-9:
        return sampling_interval_s
    for step in STEPS_S:
        if step >= need - 1e-9:
            return step
    return max(STEPS_S[-1], sampling_interval_s)


class TelemetryRate:
    """The report interval in force, decided from the connected node count and pushed to the agents.

    :param registry: the node table (connected nodes, their stream queues, the liveness window).
    :param budget_per_s: ``--ingest-budget``: samples a second this process is sized to ingest.
    :param sampling_interval_s: the agents' sampling interval.
    :param samples_total: the samples ingested so far (the monitor's counter), for the measured rate.
    :param on_change: called with each new interval (after the registry and the push).
    :param now: monotonic clock (injected in tests).
    """

    def __init__(self, registry: NodeRegistry, budget_per_s: float, sampling_interval_s: float,
                 samples_total: Callable[[], int] = lambda: 0,
                 on_change: Callable[[float], None] | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        self._registry = registry
        self.budget_per_s = budget_per_s
        self.sampling_interval_s = sampling_interval_s
        self._samples_total = samples_total
        self._on_change = on_change
        self._now = now
        self.report_interval_s = sampling_interval_s   # every sample until nodes say otherwise
        registry.set_report_interval(sampling_interval_s)
        self._changed_at = now()
        self.nodes = 0
        self.changes_total = 0
        self._counts: collections.deque[tuple[float, int]] = collections.deque()
        self._storm_seen = 0.0         # when registrations last came at STORM_MIN_PER_S or more
        self._storm_raised = False     # the interval in force is longer than the nodes alone need, for a storm
        self._connects = (now(), registry.connects_total)   # (time, registrations) at the last tick
        self._log = get_logger("coordinator").bind(component="telemetry_rate")

    def decide(self, nodes: int, registrations_per_s: float = 0.0) -> float:
        """The interval for ``nodes`` connected nodes while agents register at ``registrations_per_s``, with
        hysteresis (see the module); records it."""
        self.nodes = nodes
        current = self.report_interval_s
        now = self._now()
        steady = interval_for(nodes, self.budget_per_s, self.sampling_interval_s)   # the nodes alone
        up = steady
        if registrations_per_s >= STORM_MIN_PER_S:
            self._storm_seen = now
            budget = self.budget_per_s - REGISTRATION_COST * registrations_per_s   # what telemetry may use now
            up = interval_for(nodes, budget, self.sampling_interval_s) if budget > 0 else max(
                STEPS_S[-1], self.sampling_interval_s)
        if up > current:
            self._set(up)
            self._storm_raised = up > steady
        elif self._storm_raised and now - self._storm_seen >= STORM_QUIET_S:
            # The storm is over: back to what the nodes alone need, without the margin (the nodes did not change).
            self._storm_raised = False
            if steady < current:
                self._set(steady)
        elif up < current and now - self._changed_at >= HOLD_S:
            down = interval_for(math.ceil(nodes / DOWN_MARGIN), self.budget_per_s, self.sampling_interval_s)
            if down < current:
                self._set(down)
        return self.report_interval_s

    def _set(self, interval_s: float) -> None:
        old, self.report_interval_s = self.report_interval_s, interval_s
        self._changed_at = self._now()
        self.changes_total += 1
        self._registry.set_report_interval(interval_s)
        msg = agent_pb2.CoordinatorMessage(telemetry_rate=agent_pb2.TelemetryRate(report_interval_s=interval_s))
        pushed = 0
        for entry in self._registry:
            if entry.connected and entry.outbox is not None:
                entry.outbox.put_nowait(msg)
                pushed += 1
        self._log.info("telemetry_rate_changed", old_s=old, new_s=interval_s, nodes=self.nodes, agents=pushed,
                       budget_per_s=self.budget_per_s)
        if self._on_change is not None:
            self._on_change(interval_s)

    def tick(self) -> float:
        """One pass: count the nodes (connected or not LOST), decide, and measure the ingest rate."""
        # Connected nodes, and those that may reconnect any moment (not LOST): a leader that just took over
        # knows every node from etcd before their agents reconnect, and welcomes them at the interval they need.
        nodes = sum(1 for e in self._registry if e.connected or e.state != NodeState.LOST)
        now = self._now()
        connects = self._registry.connects_total
        # Registrations since the last tick: a storm starts at once and must count at once.
        registrations_per_s = ((connects - self._connects[1]) / (now - self._connects[0])
                               if now > self._connects[0] else 0.0)
        self._connects = (now, connects)
        self._counts.append((now, self._samples_total()))
        while len(self._counts) > 2 and now - self._counts[0][0] > _RATE_WINDOW_S:
            self._counts.popleft()
        return self.decide(nodes, registrations_per_s)

    @property
    def ingest_per_s(self) -> float:
        """Samples (plain or summaries) ingested a second over about the last ten seconds."""
        if len(self._counts) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._counts[0], self._counts[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    async def run(self, period_s: float = 1.0) -> None:
        """Decide once per ``period_s``, on every replica (a standby has no agents and stays at its shortest)."""
        while True:
            self.tick()
            await asyncio.sleep(period_s)


class RateMetrics(Collector):
    """``gptrm_telemetry_report_interval_seconds`` (the interval in force), ``…_ingest_budget_samples_per_second``
    and ``…_ingest_samples_per_second`` (measured), read at scrape time."""

    def __init__(self, rate: TelemetryRate) -> None:
        self._rate = rate

    def collect(self) -> Iterator[GaugeMetricFamily]:
        r = self._rate
        yield GaugeMetricFamily("gptrm_telemetry_report_interval_seconds",
                                "Seconds between two telemetry reports asked of every agent", value=r.report_interval_s)
        yield GaugeMetricFamily("gptrm_telemetry_ingest_budget_samples_per_second",
                                "Telemetry samples a second this coordinator is sized to ingest (--ingest-budget)",
                                value=r.budget_per_s)
        yield GaugeMetricFamily("gptrm_telemetry_ingest_samples_per_second",
                                "Telemetry samples (or summaries) ingested a second, over the last ten seconds",
                                value=r.ingest_per_s)
