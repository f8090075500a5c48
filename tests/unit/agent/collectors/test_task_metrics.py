"""The task-metrics collector: scrapes off the sampler's thread, reports failures on the task."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping

import pytest
import structlog

from agent.collectors import TaskQosReading
from agent.collectors.simulated import SimulatedGpus
from agent.collectors.task_metrics import MetricsTarget, MetricsUnavailable, TaskMetricsCollector
from agent.sampler import Sampler
from common.qos import BUILTIN_MAPPINGS, MetricNames
from tests.helpers.clock import FakeClock

VLLM = BUILTIN_MAPPINGS["vllm"]
URL = "http://127.0.0.1:9/metrics"   # never contacted: the tests pass their own fetch
TEXT = """\
vllm:e2e_request_latency_seconds_bucket{le="0.5"} %d
vllm:e2e_request_latency_seconds_bucket{le="+Inf"} %d
vllm:generation_tokens_total %d
vllm:num_requests_running 2
vllm:num_requests_waiting 5
"""


def text(requests: int) -> str:
    return TEXT % (requests, requests, 64 * requests)


class HangingFetch:
    """A fetch that blocks until released, counting its calls."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, url: str) -> str:
        self.calls += 1
        self.release.wait(60)
        return text(1)


def targets(**by_task: MetricsTarget) -> Callable[[], Mapping[str, MetricsTarget]]:
    return lambda: dict(by_task)


def collect_until(collector: TaskMetricsCollector, done: Callable[[list[TaskQosReading]], bool],
                  clock: FakeClock | None = None) -> list[TaskQosReading]:
    """Call collect() (advancing the fake clock a tick each time) until ``done`` holds; 5 s at most."""
    end = time.monotonic() + 5
    while time.monotonic() < end:
        readings = collector.collect()
        if done(readings):
            return readings
        if clock is not None:
            clock.advance(1.0)
        time.sleep(0.01)
    raise AssertionError("collector never produced the expected readings")


class TestTaskMetricsCollector:
    """One scrape per task at a time, on a worker thread; the newest finished result each tick."""

    def test_collect_never_waits_for_a_hanging_endpoint(self, clock: FakeClock) -> None:
        """collect() returns while the scrape hangs, starts no second scrape, and reports it once overdue."""
        fetch = HangingFetch()
        c = TaskMetricsCollector(targets(t1=MetricsTarget(URL, VLLM)), fetch=fetch, timeout_s=2.0,
                                 now=clock, clock=clock)
        try:
            results: list[list[TaskQosReading]] = []
            worker = threading.Thread(target=lambda: results.extend(c.collect() for _ in range(3)))
            worker.start()
            worker.join(10)
            assert not worker.is_alive() and results == [[], [], []]
            clock.advance(2.5)
            [reading] = c.collect()
            assert reading.metrics_unavailable == "scrape still running after 2.5s"
            assert reading.latency_p95_s is None and reading.requests_running is None
            assert fetch.calls == 1
        finally:
            fetch.release.set()
            c.close()

    def test_figures_from_successive_scrapes(self, clock: FakeClock) -> None:
        """Scrapes one tick apart give the p95 of the requests in between and the token rate."""
        served = iter([text(10), text(30), text(50), text(70)])
        c = TaskMetricsCollector(targets(t1=MetricsTarget(URL, VLLM)), fetch=lambda url: next(served),
                                 window_s=30.0, now=clock, clock=clock)
        try:
            readings = collect_until(c, lambda r: bool(r) and r[0].latency_p95_s is not None, clock)
        finally:
            c.close()
        [r] = readings
        # All requests fall in (0, 0.5]; the window's new ones give rank 0.95 n → 0.5 × 0.95 = 0.475.
        assert r.task_id == "t1" and r.latency_p95_s == pytest.approx(0.475)
        assert r.tokens_per_s is not None and r.tokens_per_s > 0
        assert (r.requests_running, r.requests_waiting, r.metrics_unavailable) == (2, 5, "")
        assert r.window_s > 0 and r.scraped_unix_s == pytest.approx(clock(), abs=10)

    @pytest.mark.parametrize(("fetch_result", "reason"), [
        (MetricsUnavailable("connection refused"), "connection refused"),
        ("this is { not an exposition\n", "malformed exposition"),
        ("some_other_metric 1\n", "none of vllm:e2e_request_latency_seconds"),
        (RuntimeError("bug in a fetch"), "RuntimeError: bug in a fetch"),
    ])
    def test_unreadable_endpoint_is_reported(self, clock: FakeClock, fetch_result: object, reason: str) -> None:
        """A refused, garbled, unmapped or crashing scrape is a reading with the reason and no values."""
        def fetch(url: str) -> str:
            if isinstance(fetch_result, Exception):
                raise fetch_result
            return str(fetch_result)

        c = TaskMetricsCollector(targets(t1=MetricsTarget(URL, VLLM)), fetch=fetch, now=clock, clock=clock)
        try:
            [r] = collect_until(c, bool, clock)
        finally:
            c.close()
        assert r.metrics_unavailable.startswith(reason)
        assert (r.latency_p95_s, r.tokens_per_s, r.requests_running) == (None, None, None)

    def test_recovers_after_a_failure(self, clock: FakeClock) -> None:
        """A failure between good scrapes keeps the window: the next good scrape has figures again."""
        served = iter([text(10), MetricsUnavailable("connection refused"), text(20)] + [text(20)] * 100)

        def fetch(url: str) -> str:
            item = next(served)
            if isinstance(item, Exception):
                raise item
            return item

        c = TaskMetricsCollector(targets(t1=MetricsTarget(URL, VLLM)), fetch=fetch, now=clock, clock=clock)
        try:
            collect_until(c, lambda r: bool(r) and r[0].metrics_unavailable == "connection refused", clock)
            [r] = collect_until(c, lambda r: bool(r) and not r[0].metrics_unavailable, clock)
        finally:
            c.close()
        assert r.latency_p95_s == pytest.approx(0.475)

    def test_invalid_declared_endpoint_is_never_fetched(self, clock: FakeClock) -> None:
        """A StartTask URL off the host or a bad mapping is reported as unavailable without a request."""
        calls: list[str] = []
        c = TaskMetricsCollector(
            targets(off_host=MetricsTarget.declared("http://10.1.2.3:8000/metrics", "vllm", {}),
                    bad_flavour=MetricsTarget.declared(URL, "triton", {})),
            fetch=lambda url: calls.append(url) or "", now=clock, clock=clock)
        try:
            readings = {r.task_id: r for r in c.collect()}
        finally:
            c.close()
        assert readings["off_host"].metrics_unavailable.startswith("invalid metrics URL: host '10.1.2.3'")
        assert readings["bad_flavour"].metrics_unavailable.startswith("invalid metrics mapping: unknown flavour")
        assert calls == []

    def test_ended_task_is_forgotten(self, clock: FakeClock) -> None:
        """A task that leaves the targets gets no more readings."""
        current = {"t1": MetricsTarget(URL, VLLM), "t2": MetricsTarget(URL, VLLM)}
        c = TaskMetricsCollector(lambda: dict(current), fetch=lambda url: text(1), now=clock, clock=clock)
        try:
            collect_until(c, lambda r: len(r) == 2, clock)
            del current["t1"]
            assert [r.task_id for r in c.collect()] == ["t2"]
        finally:
            c.close()

    def test_declared_uses_builtin_and_override_names(self) -> None:
        """A declared target merges the flavour's names with the overrides."""
        t = MetricsTarget.declared(URL, "tgi", {"ttft_histogram": "my_ttft_seconds"})
        assert t.problem == "" and t.names.ttft_histogram == "my_ttft_seconds"
        assert t.names.latency_histogram == "tgi_request_duration"
        assert MetricsTarget.declared(URL, "custom", {}).names == MetricNames()


class TestSamplerWithTaskMetrics:
    """The sampler keeps its interval and carries the task readings in each sample."""

    def test_hanging_endpoint_does_not_delay_ticks(self, clock: FakeClock) -> None:
        """With the endpoint hanging, every tick is emitted on schedule, and the task reads as unavailable."""
        fetch = HangingFetch()
        metrics = TaskMetricsCollector(targets(t1=MetricsTarget(URL, VLLM)), fetch=fetch, timeout_s=2.0,
                                       now=clock, clock=clock)
        gpus = SimulatedGpus("1xH100-80GB", "n1", clock=clock, jitter=0.0)
        sampler = Sampler(gpus, [metrics], interval_s=1.0, log=structlog.get_logger(), now=clock, clock=clock,
                          sleep=clock.sleep)
        samples = []
        stop = threading.Event()

        def emit(sample: object) -> None:
            samples.append(sample)
            if len(samples) == 6:
                stop.set()

        worker = threading.Thread(target=sampler.run, args=(emit, stop))
        try:
            worker.start()
            worker.join(10)
            assert not worker.is_alive()
        finally:
            stop.set()
            fetch.release.set()
            sampler.close()
        times = [s.time_unix_s for s in samples]
        assert [b - a for a, b in itertools.pairwise(times)] == [1.0] * 5
        assert [len(s.task_qos) for s in samples[:3]] == [0, 0, 0]
        last = samples[-1].task_qos[0]
        assert last.task_id == "t1" and last.metrics_unavailable.startswith("scrape still running")
        assert not last.HasField("latency_p95_s") and fetch.calls == 1
