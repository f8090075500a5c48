"""Scraping a real vLLM-like server process over loopback: latency follows load; failures are reasons."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.collectors.task_metrics import (
    MalformedMetrics,
    MetricsTarget,
    MetricsUnavailable,
    TaskMetricsCollector,
    fetch_exposition,
    parse_metrics,
)
from common.qos import BUILTIN_MAPPINGS
from tests.helpers.ports import free_port
from tests.integration.harness import Proc, wait_until
from tests.workloads.vllm_like_server import e2e_latency_s

SERVER = Path(__file__).resolve().parents[1] / "workloads" / "vllm_like_server.py"
VLLM = BUILTIN_MAPPINGS["vllm"]


class Server:
    """The workload server process and its control endpoint."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.proc = Proc([sys.executable, str(SERVER), "--port", str(self.port), "--load", "2"],
                         tmp / "vllm_like_server.log").start()
        wait_until(lambda: self.control(), timeout_s=20, what="workload server")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def control(self, **settings: object) -> dict[str, object]:
        query = "&".join(f"{k}={v}" for k, v in settings.items())
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/control?{query}", timeout=5) as resp:
                return json.loads(resp.read())
        except OSError:
            return {}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    yield s
    s.proc.stop()


class TestFetchExposition:
    """fetch_exposition against the real server in each of its modes."""

    def test_normal_exposition_parses(self, server: Server) -> None:
        """The server's vLLM-named metrics are fetched and every role is found."""
        snap = parse_metrics(fetch_exposition(server.url, timeout_s=5), VLLM, 0.0)
        assert snap.latency is not None and snap.ttft is not None
        assert snap.tokens is not None and snap.running is not None and snap.waiting is not None

    def test_hanging_endpoint_times_out(self, server: Server) -> None:
        """An endpoint that accepts and never answers is given up after the timeout, with that reason."""
        server.control(mode="hang")
        with pytest.raises(MetricsUnavailable, match=r"within 0\.5s"):
            fetch_exposition(server.url, timeout_s=0.5)

    def test_trickling_endpoint_hits_the_deadline(self, server: Server) -> None:
        """A body sent a line every 0.2 s is cut at the request's deadline, not read for a minute."""
        server.control(mode="trickle")
        with pytest.raises(MetricsUnavailable, match="within 1s"):
            fetch_exposition(server.url, timeout_s=1.0)
        # the client hung up while the server was still trickling (the trickle alone lasts 60 s)
        wait_until(lambda: server.control().get("trickles_cut") == 1, timeout_s=20, what="the trickle to be cut")

    def test_huge_response_is_refused(self, server: Server) -> None:
        """A body over the size limit is refused."""
        server.control(mode="huge")
        with pytest.raises(MetricsUnavailable, match="byte limit"):
            fetch_exposition(server.url, timeout_s=10, max_bytes=1024 * 1024)

    def test_garbage_is_malformed(self, server: Server) -> None:
        """Garbage served with HTTP 200 is fetched, then refused by the parser."""
        server.control(mode="garbage")
        with pytest.raises(MalformedMetrics):
            parse_metrics(fetch_exposition(server.url, timeout_s=5), VLLM, 0.0)

    def test_http_error_and_refused_connection(self, server: Server) -> None:
        """A 404 and a closed port are reported with their reasons."""
        with pytest.raises(MetricsUnavailable, match="HTTP 404"):
            fetch_exposition(f"http://127.0.0.1:{server.port}/nothing", timeout_s=5)
        with pytest.raises(MetricsUnavailable, match="connection refused"):
            fetch_exposition(f"http://127.0.0.1:{free_port()}/metrics", timeout_s=5)

    def test_off_host_url_is_not_contacted(self) -> None:
        """A URL that is not on a loopback address is refused before any connection."""
        with pytest.raises(MetricsUnavailable, match="invalid metrics URL"):
            fetch_exposition("http://192.0.2.1:8000/metrics", timeout_s=5)


class TestCollectorAgainstServer:
    """The collector's p95 over its window follows the server's offered load."""

    def test_latency_rises_with_load_and_hang_is_reported(self, server: Server) -> None:
        """Low load reads in the low bucket, high load in a higher one; a hang becomes a reason, not a value."""
        c = TaskMetricsCollector(lambda: {"t1": MetricsTarget(server.url, VLLM)}, window_s=1.5, timeout_s=1.0)

        def p95_between(low: float, high: float) -> bool:
            [r] = c.collect() or [None]
            return r is not None and r.latency_p95_s is not None and low < r.latency_p95_s <= high

        try:
            # load 2: every request takes 0.35 s, in vLLM's bucket (0.3, 0.5].
            assert 0.3 < e2e_latency_s(2) <= 0.5
            wait_until(lambda: p95_between(0.3, 0.5), timeout_s=20, interval_s=0.2, what="low-load p95")
            # load 30: 1.75 s, in (1.5, 2.0]; once the window holds only those requests the p95 follows.
            server.control(load=30)
            assert 1.5 < e2e_latency_s(30) <= 2.0
            wait_until(lambda: p95_between(1.5, 2.0), timeout_s=20, interval_s=0.2, what="high-load p95")
            [r] = c.collect()
            assert r.tokens_per_s is not None and r.tokens_per_s > 0 and r.requests_waiting is not None
            server.control(mode="hang")
            r = wait_until(lambda: [x for x in c.collect() if x.metrics_unavailable], timeout_s=20,
                           interval_s=0.2, what="hang reported")[0]
            assert r.latency_p95_s is None and ("within 1s" in r.metrics_unavailable
                                                or "still running" in r.metrics_unavailable)
        finally:
            server.control(mode="normal")
            c.close()
