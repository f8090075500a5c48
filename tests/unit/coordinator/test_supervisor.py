"""The leader duties' supervisor: restart with backoff, failure counter, giving up, cancellation, progress."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from common.sdnotify import SystemdNotifier, watchdog_loop
from coordinator.supervisor import Beat, InjectedFault, Supervisor, parse_faults
from tests.helpers.clock import FakeClock


class Harness:
    """A supervisor with a fresh registry, a manual clock and a sleep that only records its delay."""

    def __init__(self, **kw: object) -> None:
        self.registry = CollectorRegistry()
        self.clock = FakeClock(1000.0)
        self.delays: list[float] = []
        self.gave_up: list[tuple[str, str]] = []
        counter = Counter("gptrm_leader_duty_failures_total", "x", ["duty"], registry=self.registry)
        kw.setdefault("faults", {})
        self.sup = Supervisor(counter, lambda d, r: self.gave_up.append((d, r)), now=self.clock,
                              sleep=self._sleep, **kw)  # type: ignore[arg-type]
        self.advance_per_sleep = 0.0

    async def _sleep(self, delay: float) -> None:
        self.delays.append(delay)
        self.clock.t += self.advance_per_sleep
        await asyncio.sleep(0)

    def failures(self, duty: str) -> float:
        return self.registry.get_sample_value("gptrm_leader_duty_failures_total", {"duty": duty}) or 0.0


async def _until(cond: Callable[[], bool]) -> None:
    while not cond():
        await asyncio.sleep(0)


def _failing(times: int, calls: list[int]) -> Callable[[Beat], Awaitable[None]]:
    """A duty that raises on its first ``times`` runs, then beats forever."""

    async def run(beat: Beat) -> None:
        calls.append(1)
        if len(calls) <= times:
            raise ValueError(f"boom {len(calls)}")
        while True:
            beat()
            await asyncio.sleep(0.001)

    return run


def test_failed_duty_is_restarted_with_doubling_backoff_and_counted() -> None:
    async def main() -> Harness:
        h = Harness(max_failures=100)
        calls: list[int] = []
        h.sup.add("cycle", _failing(8, calls), interval_s=1.0)
        h.sup.start()
        await _until(lambda: len(calls) == 9 and h.sup.views()[0].last_pass_age_s is not None)
        view = h.sup.views()[0]
        assert (view.state, view.failures, view.last_error) == ("running", 8, "ValueError: boom 8")
        h.sup.stop()
        await h.sup.wait_stopped()
        return h

    h = asyncio.run(main())
    assert h.delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert h.failures("cycle") == 8
    assert h.gave_up == []


def test_backoff_starts_over_after_a_healthy_run() -> None:
    async def main() -> Harness:
        h = Harness(max_failures=100, healthy_s=60.0)
        calls: list[int] = []

        async def run(beat: Beat) -> None:
            calls.append(1)
            if len(calls) == 4:
                h.clock.t += 61.0   # this run lasts longer than healthy_s before it fails
            if len(calls) <= 5:
                raise ValueError("boom")
            await asyncio.Event().wait()

        h.sup.add("power", run, interval_s=1.0)
        h.sup.start()
        await _until(lambda: len(calls) == 6)
        h.sup.stop()
        await h.sup.wait_stopped()
        return h

    h = asyncio.run(main())
    assert h.delays == [0.5, 1.0, 2.0, 0.5, 1.0]


def test_repeated_failures_within_the_window_give_up() -> None:
    async def main() -> Harness:
        h = Harness(max_failures=3, window_s=300.0)
        calls: list[int] = []
        h.sup.add("qos", _failing(1000, calls), interval_s=1.0)
        h.sup.add("other", _failing(0, []), interval_s=1.0)
        h.sup.start()
        await _until(lambda: bool(h.gave_up))
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(calls) == 3   # not restarted after giving up
        views = {v.name: v for v in h.sup.views()}
        assert (views["qos"].state, views["qos"].failures) == ("stopped", 3)
        assert views["other"].state == "running"
        h.sup.stop()
        await h.sup.wait_stopped()
        return h

    h = asyncio.run(main())
    assert [d for d, _ in h.gave_up] == ["qos"]
    assert "qos failed 3 times" in h.gave_up[0][1]
    assert h.failures("qos") == 3
    assert h.delays == [0.5, 1.0]


def test_failures_spread_beyond_the_window_do_not_give_up() -> None:
    async def main() -> Harness:
        h = Harness(max_failures=3, window_s=100.0)
        h.advance_per_sleep = 60.0   # each restart comes a minute later: never 3 failures within 100 s
        calls: list[int] = []
        h.sup.add("retention", _failing(6, calls), interval_s=1.0)
        h.sup.start()
        await _until(lambda: len(calls) == 7)
        h.sup.stop()
        await h.sup.wait_stopped()
        return h

    h = asyncio.run(main())
    assert h.gave_up == []
    assert h.failures("retention") == 6


def test_cancellation_and_normal_return_are_not_failures() -> None:
    async def main() -> Harness:
        h = Harness()
        started = asyncio.Event()

        async def forever(beat: Beat) -> None:
            started.set()
            await asyncio.Event().wait()

        async def once(beat: Beat) -> None:
            beat()

        h.sup.add("cycle", forever, interval_s=1.0)
        h.sup.add("reconcile", once, interval_s=1.0)
        h.sup.start()
        await started.wait()
        await _until(lambda: h.sup.views()[1].state == "done")   # a duty that returned completed its work
        assert h.sup.views()[0].state == "running"
        h.sup.stop()   # leadership ends
        await h.sup.wait_stopped()
        assert [(v.name, v.state, v.failures) for v in h.sup.views()] == [("cycle", "stopped", 0),
                                                                         ("reconcile", "done", 0)]
        return h

    h = asyncio.run(main())
    assert h.failures("cycle") == 0 and h.failures("reconcile") == 0
    assert h.delays == [] and h.gave_up == []


def test_stuck_names_a_running_duty_without_a_recent_pass() -> None:
    async def main() -> None:
        h = Harness(stuck_floor_s=30.0)
        beats: dict[str, Beat] = {}

        async def idle(name: str, beat: Beat) -> None:
            beats[name] = beat
            await asyncio.Event().wait()

        h.sup.add("cycle", lambda b: idle("cycle", b), interval_s=1.0)
        h.sup.add("services", lambda b: idle("services", b), interval_s=20.0)
        h.sup.start()
        await _until(lambda: len(beats) == 2)
        assert h.sup.stuck() == ""
        h.clock.t += 31.0   # no pass yet: counted from the start
        assert h.sup.stuck() == "cycle (no pass for 31s)"   # services may take 3 × 20 s
        beats["cycle"]()
        assert h.sup.stuck() == ""
        assert h.sup.views()[0].last_pass_age_s == 0.0
        h.clock.t += 61.0
        assert h.sup.stuck() == "cycle (no pass for 61s), services (no pass for 92s)"
        h.sup.stop()
        assert h.sup.stuck() == ""   # a replica that does not lead has no duties to wait for
        await h.sup.wait_stopped()

    asyncio.run(main())


def test_injected_faults_once_and_always() -> None:
    assert parse_faults(" cycle:once, qos:always ") == {"cycle": "once", "qos": "always"}
    assert parse_faults("") == {}
    with pytest.raises(ValueError, match="NAME:once"):
        parse_faults("cycle:sometimes")

    async def main() -> Harness:
        h = Harness(faults={"cycle": "once", "qos": "always"}, max_failures=3)
        passes: dict[str, int] = {"cycle": 0, "qos": 0}

        def looping(name: str) -> Callable[[Beat], Awaitable[None]]:
            async def run(beat: Beat) -> None:
                while True:
                    passes[name] += 1
                    beat()
                    await asyncio.sleep(0.001)
            return run

        h.sup.add("cycle", looping("cycle"), interval_s=1.0)
        h.sup.add("qos", looping("qos"), interval_s=1.0)
        h.sup.start()
        await _until(lambda: passes["cycle"] >= 5 and bool(h.gave_up))
        views = {v.name: v for v in h.sup.views()}
        assert (views["cycle"].state, views["cycle"].failures) == ("running", 1)
        assert views["cycle"].last_error.startswith(InjectedFault.__name__)
        assert (views["qos"].state, views["qos"].failures) == ("stopped", 3)
        h.sup.stop()
        await h.sup.wait_stopped()
        return h

    h = asyncio.run(main())
    assert h.failures("cycle") == 1 and h.failures("qos") == 3


def test_watchdog_is_not_fed_while_something_is_stuck(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(5)
        notifier = SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000"})
        stuck = [""]

        async def main() -> list[str]:
            task = asyncio.create_task(watchdog_loop(notifier, lambda: "leader", stuck=lambda: stuck[0]))
            got: list[str] = []
            for _ in range(2):
                got.append((await asyncio.to_thread(sock.recv, 4096)).decode())
            stuck[0] = "cycle (no pass for 40s)"
            while not got[-1].startswith("STATUS=leader: stuck"):
                got.append((await asyncio.to_thread(sock.recv, 4096)).decode())
            after = [(await asyncio.to_thread(sock.recv, 4096)).decode() for _ in range(3)]
            task.cancel()
            return [*got[:2], *after]

        got = asyncio.run(main())
    assert got[:2] == ["WATCHDOG=1", "STATUS=leader"]
    assert got[2:] == ["STATUS=leader: stuck: cycle (no pass for 40s)"] * 3   # no WATCHDOG=1 while stuck
