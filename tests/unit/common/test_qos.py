"""Metric names per server flavour and the metrics URLs an agent may scrape."""

from __future__ import annotations

import pytest

from common.qos import BUILTIN_MAPPINGS, MetricNames, metric_name_problem, metric_names, metrics_url_problem


class TestMetricNames:
    """Built-in flavours with overrides on top."""

    def test_flavours(self) -> None:
        """"" means vLLM; overrides replace one role; custom starts empty."""
        assert metric_names("", {}) == BUILTIN_MAPPINGS["vllm"]
        tgi = metric_names("tgi", {"waiting_gauge": "my_queue", "running_gauge": ""})
        assert tgi.waiting_gauge == "my_queue" and tgi.running_gauge == "tgi_batch_current_size"
        assert metric_names("custom", {"tokens_counter": "t"}) == MetricNames(tokens_counter="t")
        assert BUILTIN_MAPPINGS["vllm"].names()[0] == "vllm:e2e_request_latency_seconds"

    def test_unknown_flavour_or_role(self) -> None:
        """An unknown flavour or role is a ValueError."""
        with pytest.raises(ValueError, match="flavour"):
            metric_names("triton", {})
        with pytest.raises(ValueError, match="role"):
            metric_names("vllm", {"p99": "x"})

    @pytest.mark.parametrize(("name", "ok"), [("vllm:num_requests_running", True), ("_x1", True),
                                              ("1abc", False), ("a-b", False), ("a b", False), ("a" * 201, False)])
    def test_metric_name_problem(self, name: str, ok: bool) -> None:
        """Prometheus metric names, at most 200 characters."""
        assert (metric_name_problem(name) is None) is ok


class TestMetricsUrlProblem:
    """Plain http on a loopback address of the task's own host only."""

    @pytest.mark.parametrize("url", ["http://127.0.0.1:8000/metrics", "http://localhost:8000/metrics",
                                     "http://127.1.2.3/metrics?x=1", "http://[::1]:9000/"])
    def test_accepted(self, url: str) -> None:
        """Loopback addresses and localhost, any path and query."""
        assert metrics_url_problem(url) is None

    @pytest.mark.parametrize(("url", "needle"), [
        ("https://127.0.0.1/metrics", "only http"),
        ("ftp://127.0.0.1/metrics", "only http"),
        ("127.0.0.1:8000/metrics", "only http"),
        ("http://10.0.0.1:8000/metrics", "not a loopback"),
        ("http://[::ffff:8.8.8.8]/metrics", "not a loopback"),
        ("http://gpu-host-7:8000/metrics", "not localhost"),
        ("http://u@127.0.0.1/metrics", "user information"),
        ("http://127.0.0.1/metrics#top", "fragment"),
        ("http://127.0.0.1:70000/metrics", "not a URL"),
        ("http://127.0.0.1:0/metrics", "port 0"),
        ("http:///metrics", "no host"),
        ("http://127.0.0.1/me trics", "whitespace"),
        ("http://127.0.0.1/" + "a" * 600, "longer than"),
    ])
    def test_refused(self, url: str, needle: str) -> None:
        """Other schemes, hosts off the machine, credentials, fragments, bad ports and junk are refused."""
        problem = metrics_url_problem(url)
        assert problem is not None and needle in problem
