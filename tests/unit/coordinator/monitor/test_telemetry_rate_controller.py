"""The telemetry rate controller: the report interval steps with the node count, with hysteresis, and the
registry's liveness window follows it."""

from __future__ import annotations

import asyncio

import pytest

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import NodeState
from coordinator.monitor.nodes import NodeRegistry
from coordinator.monitor.telemetry_rate import (
    HOLD_S,
    REGISTRATION_COST,
    STORM_MIN_PER_S,
    STORM_QUIET_S,
    RateMetrics,
    TelemetryRate,
    interval_for,
)
from tests.helpers.clock import FakeClock


def _connect(registry: NodeRegistry, n: int, start: int = 0) -> list[asyncio.Queue]:
    queues = []
    for i in range(start, start + n):
        q: asyncio.Queue = asyncio.Queue()
        registry.connect(types_pb2.NodeInventory(node_id=f"n{i}"), q)
        queues.append(q)
    return queues


class TestIntervalFor:
    @pytest.mark.parametrize(("nodes", "expected"), [
        (0, 1.0), (100, 1.0), (101, 2.0), (200, 2.0), (201, 5.0), (500, 5.0), (501, 10.0), (1000, 10.0),
        (1001, 15.0), (1500, 15.0), (100_000, 15.0),
    ])
    def test_steps(self, nodes: int, expected: float) -> None:
        """nodes / budget rounded up to 1, 2, 5, 10 or 15 s; the longest step when none fits."""
        assert interval_for(nodes, 100.0, 1.0) == expected

    def test_never_below_sampling(self) -> None:
        assert interval_for(10, 100.0, 3.0) == 3.0
        assert interval_for(400, 100.0, 3.0) == 5.0
        assert interval_for(10, 100.0, 0.5) == 0.5

    def test_thirty_thousand_nodes_at_the_default_budget(self) -> None:
        assert interval_for(30_000, 3000.0, 1.0) == 10.0


class TestController:
    def test_up_at_once_down_with_margin_and_hold(self) -> None:
        """Up as soon as the budget is exceeded; down only after HOLD_S and when the shorter step would
        load at most 80 % of the budget."""
        clock = FakeClock()
        rate = TelemetryRate(NodeRegistry(1.0, 30.0, now=clock), 100.0, 1.0, now=clock)
        assert rate.decide(150) == 2.0
        assert rate.decide(201) == 5.0                 # up again at once
        assert rate.decide(190) == 5.0                 # below 200, but not held long enough
        clock.advance(HOLD_S)
        assert rate.decide(190) == 5.0                 # 190 would load 2 s at 95 % of the budget: stays
        assert rate.decide(160) == 2.0                 # 80 %: down
        clock.advance(HOLD_S)
        assert rate.decide(81) == 2.0                  # 1 s at 81 %: stays
        assert rate.decide(80) == 1.0
        assert rate.changes_total == 4

    def test_no_flapping_around_a_step(self) -> None:
        """Nodes going 199 ↔ 201 every second change the interval once."""
        clock = FakeClock()
        rate = TelemetryRate(NodeRegistry(1.0, 30.0, now=clock), 100.0, 1.0, now=clock)
        for i in range(120):
            rate.decide(201 if i % 2 else 199)
            clock.advance(1.0)
        assert rate.report_interval_s == 5.0 and rate.changes_total == 2   # 1 → 2 → 5, never back

    def test_change_is_pushed_to_every_connected_agent(self) -> None:
        """A change goes to each connected node's stream; the registry's liveness window widens at once."""
        clock = FakeClock()
        registry = NodeRegistry(1.0, 30.0, now=clock)
        queues = _connect(registry, 3)
        registry.disconnect("n2", registry.get("n2").stream_id)
        seen: list[float] = []
        rate = TelemetryRate(registry, 1.0, 1.0, on_change=seen.append, now=clock)
        # n2 is disconnected but not LOST (it may come back any moment): it counts, but is not pushed to.
        assert rate.tick() == 5.0 and rate.nodes == 3 and seen == [5.0]
        for q in queues[:2]:
            msg = q.get_nowait()
            assert msg.WhichOneof("body") == "telemetry_rate" and msg.telemetry_rate.report_interval_s == 5.0
        assert queues[2].empty()
        assert registry.silence_limit_s == 15.0
        clock.advance(31.0)   # n2 LOST (30 s grace), and 30 s held: 2 nodes at 1/s fit 2 s at 100 %, not 80 %
        registry.refresh()
        assert rate.tick() == 5.0 and rate.nodes == 2

    def test_a_new_leader_counts_the_nodes_it_loaded(self) -> None:
        """Nodes known from etcd, not yet reconnected, size the interval the first agents are welcomed at."""
        clock = FakeClock()
        registry = NodeRegistry(1.0, 30.0, now=clock)
        for i in range(300):
            registry.load(types_pb2.NodeRecord(inventory=types_pb2.NodeInventory(node_id=f"n{i}")))
        assert TelemetryRate(registry, 100.0, 1.0, now=clock).tick() == 5.0

    def test_a_registration_storm_draws_on_the_budget(self) -> None:
        """Agents registering faster than the budget leaves room for push the interval up at once (each
        registration costs REGISTRATION_COST samples); once they stop, it comes back down after the hold."""
        clock = FakeClock()
        registry = NodeRegistry(1.0, 30.0, now=clock)
        rate = TelemetryRate(registry, 100.0, 1.0, now=clock)
        _connect(registry, 50)
        clock.advance(1.0)
        assert rate.tick() == 15.0                 # 50 registrations/s × 5 = 250 > the budget of 100
        clock.advance(1.0)
        _connect(registry, 5, start=50)
        assert rate.tick() == 15.0                 # a trickle: no way down before the hold
        clock.advance(HOLD_S)
        assert rate.tick() == 1.0                  # 55 nodes, no registrations: 1 s
        assert rate.decide(55, registrations_per_s=5.0) == 1.0   # churn below STORM_MIN_PER_S: no change
        assert rate.decide(55, registrations_per_s=STORM_MIN_PER_S) == 15.0   # 55 + 250 > 100
        assert REGISTRATION_COST == 5.0

    def test_after_a_storm_the_interval_returns_to_what_the_nodes_need(self) -> None:
        """Once registrations stopped for STORM_QUIET_S, a storm's interval goes back to the nodes' own step at
        once, without the margin a node count needs to come down (190 nodes at 100/s: 2 s, though 2 s loads
        95 % of the budget and the margin alone would keep 5 s)."""
        clock = FakeClock()
        rate = TelemetryRate(NodeRegistry(1.0, 30.0, now=clock), 100.0, 1.0, now=clock)
        assert rate.decide(190) == 2.0
        assert rate.decide(190, registrations_per_s=60.0) == 15.0
        clock.advance(STORM_QUIET_S - 1)
        assert rate.decide(190) == 15.0                     # not quiet long enough
        clock.advance(1)
        assert rate.decide(190) == 2.0
        clock.advance(HOLD_S)
        assert rate.decide(190) == 2.0                      # and it stays

    def test_ingest_rate_and_metrics(self) -> None:
        clock = FakeClock()
        total = [0]
        rate = TelemetryRate(NodeRegistry(1.0, 30.0, now=clock), 3000.0, 1.0, samples_total=lambda: total[0],
                             now=clock)
        for _ in range(5):
            rate.tick()
            total[0] += 250
            clock.advance(1.0)
        rate.tick()
        assert rate.ingest_per_s == pytest.approx(250.0)
        values = {m.name: m.samples[0].value for m in RateMetrics(rate).collect()}
        assert values == {"gptrm_telemetry_report_interval_seconds": 1.0,
                          "gptrm_telemetry_ingest_budget_samples_per_second": 3000.0,
                          "gptrm_telemetry_ingest_samples_per_second": pytest.approx(250.0)}


class TestLiveness:
    def test_a_node_reporting_every_ten_seconds_stays_ready(self) -> None:
        """At a 10 s interval 25 s of silence is fine; 31 s is not."""
        clock = FakeClock()
        registry = NodeRegistry(1.0, 30.0, now=clock)
        _connect(registry, 1)
        registry.set_report_interval(10.0)
        entry = registry.get("n0")
        clock.advance(25.0)
        registry.refresh()
        assert entry.state == NodeState.READY
        clock.advance(6.0)
        registry.refresh()
        assert entry.state == NodeState.NOT_READY

    def test_shorter_interval_keeps_the_longer_window_for_a_while(self) -> None:
        """After 10 s → 1 s an agent still on 10 s is not NOT_READY until three old intervals have passed."""
        clock = FakeClock()
        registry = NodeRegistry(1.0, 30.0, now=clock)
        _connect(registry, 1)
        registry.set_report_interval(10.0)
        registry.set_report_interval(1.0)
        clock.advance(9.0)
        registry.refresh()
        assert registry.get("n0").state == NodeState.READY and registry.silence_limit_s == 30.0
        clock.advance(30.0)
        assert registry.silence_limit_s == 3.0


def test_welcome_carries_the_field() -> None:
    """An agent reads the interval in force from its Welcome (0 from an older coordinator)."""
    assert agent_pb2.Welcome().report_interval_s == 0.0
    assert agent_pb2.Welcome(report_interval_s=10.0).report_interval_s == 10.0
