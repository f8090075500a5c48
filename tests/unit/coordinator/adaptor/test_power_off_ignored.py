"""A power-off the node provider accepted while the node's agent goes on streaming (coordinator/adaptor/power.py).

The power manager on a fake clock, with in-memory stand-ins for etcd, the leader's fencing and the node
locks (as the simulator drives it), and a provider that accepts every power_off and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from common.pb.gptrm.v1 import types_pb2
from coordinator.adaptor.power import PowerManager
from coordinator.adaptor.providers import ProviderResult
from coordinator.events import EventBus
from coordinator.monitor.nodes import NodeRegistry
from coordinator.power_states import power_label
from coordinator.state import LeaderState
from tests.helpers.clock import FakeClock

GRACE, RETRY, RETRY_MAX, AFTER = 120.0, 600.0, 1800.0, 30.0


class _Store:
    def __init__(self) -> None:
        self.writes: list[types_pb2.NodeRecord] = []

    def put_node(self, record: types_pb2.NodeRecord) -> types_pb2.NodeRecord:
        stored = types_pb2.NodeRecord()
        stored.CopyFrom(record)
        self.writes.append(stored)
        return stored


class _Leader:
    async def write(self, fn: Callable[..., Any], *args: object, **kwargs: object) -> Any:
        return fn(*args, **kwargs)


class _Locks:
    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        yield


class _AcceptingProvider:
    """Says yes to everything; the node it is asked to power off does not go down."""

    name, can_power, can_create = "accepting", True, False

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.requests: list[tuple[float, str, str]] = []

    async def request(self, action: str, node_id: str, reason: str,
                      demand: dict[str, float] | None = None) -> ProviderResult:
        self.requests.append((self.clock(), action, node_id))
        return ProviderResult(ok=True)


async def _no_wait(seconds: float) -> None:
    return None


class Rig:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.registry = NodeRegistry(heartbeat_interval_s=5.0, lost_grace_s=float("inf"), now=self.clock)
        self.state = LeaderState(self.registry)
        self.store = _Store()
        self.provider = _AcceptingProvider(self.clock)
        self.events = EventBus(now=self.clock)
        self.ignored = 0
        self.manager = PowerManager(
            self.registry, self.state, self.store, _Leader(), _Locks(), self.provider, self.events,
            power_down_after_s=AFTER, spare_nodes=0, wake_timeout_s=300.0, fit=lambda: lambda task: lambda e: False,
            period_s=0.0, power_off_grace_s=GRACE, power_off_retry_s=RETRY, power_off_retry_max_s=RETRY_MAX,
            on_power_off_ignored=self._count, now=self.clock, wall=self.clock, sleep=_no_wait)
        inv = types_pb2.NodeInventory(node_id="n1", gpus=[types_pb2.GpuInfo(index=0, model="H100")])
        self.entry, _ = self.registry.connect(inv, outbox=None)   # type: ignore[arg-type]

    def _count(self) -> None:
        self.ignored += 1

    def run_for(self, seconds: float, period_s: float = 5.0) -> None:
        """Step every ``period_s`` for ``seconds`` of the fake clock (the node keeps streaming throughout)."""
        async def go() -> None:
            end = self.clock() + seconds
            while self.clock() < end:
                if self.entry.connected:
                    self.registry.heartbeat(self.entry)   # its telemetry keeps coming
                    self.registry.rederive(self.entry)
                await self.manager.step()
                self.clock.advance(period_s)
        asyncio.run(go())

    def power(self) -> str:
        return power_label(self.entry.record.power_state)

    def power_off_times(self) -> list[float]:
        return [t for t, action, _ in self.provider.requests if action == "power_off"]


def _reports(rig: Rig) -> list[Any]:
    return [e for e in rig.events.recent(1000) if e.fields.get("outcome") == "power_off_ignored"]


def _never_off(stored: list[types_pb2.NodeRecord]) -> bool:
    return all(power_label(r.power_state) != "off" for r in stored)


def test_accepted_power_off_of_a_node_that_keeps_streaming() -> None:
    """One report and one count per ignored power-off, the node back to ready (and schedulable) through a stored
    write, never shown off, and the next power-off only after the backoff: 600 s, then 1200 s."""
    rig = Rig()
    start = rig.clock()
    rig.run_for(AFTER + 10)
    assert len(rig.power_off_times()) == 1 and rig.power() == "powering-off"
    accepted = rig.power_off_times()[0]
    rig.run_for(GRACE - 20)       # within the grace: the node may still be shutting down
    assert rig.power() == "powering-off" and rig.ignored == 0 and len(rig.power_off_times()) == 1
    rig.run_for(30)
    assert rig.power() == "ready" and rig.registry.schedulable(rig.entry)
    assert rig.ignored == 1 and len(_reports(rig)) == 1 and _reports(rig)[0].node_id == "n1"
    assert rig.store.writes[-1].power_state == types_pb2.NODE_POWER_STATE_READY   # what etcd stored, applied
    assert "still streams" in rig.entry.record.power_reason
    ignored_at = max(e.time_unix_s for e in _reports(rig))
    assert ignored_at - accepted >= GRACE
    rig.run_for(RETRY + AFTER + 30)   # the backoff, then idle long enough again
    offs = rig.power_off_times()
    assert len(offs) == 2 and offs[1] - ignored_at >= RETRY
    rig.run_for(GRACE + 10)
    assert rig.ignored == 2 and len(_reports(rig)) == 2 and rig.power() == "ready"
    second_ignored = max(e.time_unix_s for e in _reports(rig))
    rig.run_for(second_ignored + 2 * RETRY - 10 - rig.clock())
    assert len(rig.power_off_times()) == 2   # the wait doubled
    rig.run_for(AFTER + 40)
    offs = rig.power_off_times()
    assert len(offs) == 3 and offs[2] - second_ignored >= 2 * RETRY
    assert _never_off(rig.store.writes) and rig.clock() - start > 2 * RETRY


def test_the_wait_stops_doubling_at_its_cap() -> None:
    """A node that never goes down: the wait before the next power-off doubles up to its cap, one report each."""
    rig = Rig()
    rig.run_for(RETRY + 2 * RETRY + 2 * RETRY_MAX + 5 * (AFTER + GRACE + 20))
    waits = [float(e.fields["retry_after_s"]) for e in sorted(_reports(rig), key=lambda e: e.seq)]
    assert waits[:4] == [RETRY, 2 * RETRY, RETRY_MAX, RETRY_MAX]   # 600, 1200, then 1800 (not 2400)
    assert rig.ignored == len(waits)


def test_a_node_that_falls_silent_is_off_and_its_backoff_forgotten() -> None:
    """Once a power-off takes effect (the stream ends), the node is off and its next power-off waits for nothing."""
    rig = Rig()
    rig.run_for(AFTER + 10 + GRACE + 10)          # ignored once: a backoff
    assert rig.ignored == 1
    rig.run_for(RETRY + AFTER + 20)               # asked again; this time it goes down
    assert rig.power() == "powering-off"
    rig.registry.disconnect("n1", rig.entry.stream_id)
    rig.run_for(5)
    assert rig.power() == "off" and rig.ignored == 1
    assert "n1" not in rig.manager._off_backoff


def test_a_node_a_reservation_needs_is_kept_on_and_woken_when_off() -> None:
    """A node holding GPUs of a reservation that is active or starts within the wake time is never powered down;
    once off, it is asked to power on for the reservation."""
    rig = Rig()
    needed: dict[str, str] = {"n1": "demo"}
    asked: list[float] = []

    def reserved(within_s: float) -> dict[str, str]:
        asked.append(within_s)
        return needed

    rig.manager.reserved = reserved
    rig.run_for(AFTER + 60)
    assert rig.power_off_times() == [] and rig.power() == "ready" and asked[-1] == 300.0
    needed = {}
    rig.run_for(AFTER + 10)
    assert len(rig.power_off_times()) == 1
    rig.registry.disconnect("n1", rig.entry.stream_id)   # it goes down
    rig.run_for(5)
    assert rig.power() == "off"
    needed = {"n1": "demo"}
    asyncio.run(rig.manager.step())
    assert rig.provider.requests[-1][1:] == ("power_on", "n1") and rig.power() == "powering-on"
