"""Task QoS metrics: the names inference servers publish, and where a task may publish them.

Shared by the coordinator (it validates a task spec's ``metrics_*`` fields at submit) and
the agent (it scrapes the endpoint of each running task, and checks it again, since a
StartTask is input too).

A task's metrics endpoint must be plain ``http`` on the task's own host, addressed by a
loopback address: the agent never scrapes another machine on a task's behalf.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from urllib.parse import urlsplit

__all__ = [
    "BUILTIN_MAPPINGS",
    "FLAVOURS",
    "MAX_METRICS_URL",
    "MAX_METRIC_NAME",
    "ROLES",
    "MetricNames",
    "metric_name_problem",
    "metric_names",
    "metrics_url_for_port",
    "metrics_url_problem",
]

MAX_METRICS_URL = 512
"""Longest metrics URL accepted, in characters."""
MAX_METRIC_NAME = 200
"""Longest metric name accepted in a mapping, in characters."""
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")   # the Prometheus data model's metric names


@dataclass(frozen=True, slots=True)
class MetricNames:
    """Which metric plays which role; an empty name means the role is not read.

    :param latency_histogram: end-to-end request latency histogram in seconds (``<name>_bucket`` is read).
    :param ttft_histogram: time-to-first-token histogram in seconds.
    :param tokens_counter: generated tokens so far: a counter (``<name>`` or ``<name>_total``),
        or a histogram's ``_sum`` series named in full.
    :param running_gauge: requests being served now.
    :param waiting_gauge: requests queued now.
    """

    latency_histogram: str = ""
    ttft_histogram: str = ""
    tokens_counter: str = ""
    running_gauge: str = ""
    waiting_gauge: str = ""

    def names(self) -> tuple[str, ...]:
        """The non-empty names, in role order."""
        return tuple(n for n in (getattr(self, r) for r in ROLES) if n)


ROLES = tuple(f.name for f in fields(MetricNames))
"""The roles a mapping names, as in ``gptrm.v1.MetricsMapping``."""

BUILTIN_MAPPINGS: Mapping[str, MetricNames] = MappingProxyType({
    # vLLM's /metrics (vllm/engine/metrics.py, vllm/v1/metrics/loggers.py).
    "vllm": MetricNames(
        latency_histogram="vllm:e2e_request_latency_seconds",
        ttft_histogram="vllm:time_to_first_token_seconds",
        tokens_counter="vllm:generation_tokens_total",
        running_gauge="vllm:num_requests_running",
        waiting_gauge="vllm:num_requests_waiting",
    ),
    # Text Generation Inference's /metrics. TGI publishes no time-to-first-token histogram;
    # generated tokens come from the per-request histogram's running sum.
    "tgi": MetricNames(
        latency_histogram="tgi_request_duration",
        tokens_counter="tgi_request_generated_tokens_sum",
        running_gauge="tgi_batch_current_size",
        waiting_gauge="tgi_queue_size",
    ),
    "custom": MetricNames(),
})
"""Built-in names per server flavour."""

FLAVOURS = tuple(BUILTIN_MAPPINGS)
"""Server flavours a spec may name (``""`` means ``vllm``)."""


def metric_names(flavour: str, overrides: Mapping[str, str]) -> MetricNames:
    """The names to read: the flavour's built-in ones with ``overrides`` on top.

    :param flavour: ``vllm``, ``tgi``, ``custom`` or ``""`` (``vllm``).
    :param overrides: role → metric name; empty names are ignored.
    :returns: the merged names.
    :raises ValueError: on an unknown flavour or role.
    """
    base = BUILTIN_MAPPINGS.get(flavour or "vllm")
    if base is None:
        raise ValueError(f"unknown flavour {flavour!r} (one of {', '.join(FLAVOURS)})")
    unknown = set(overrides) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown role {sorted(unknown)[0]!r} (one of {', '.join(ROLES)})")
    return replace(base, **{k: v for k, v in overrides.items() if v})


def metric_name_problem(name: str) -> str | None:
    """What is wrong with a metric name, or None when it is a valid Prometheus name."""
    if len(name) > MAX_METRIC_NAME:
        return f"longer than {MAX_METRIC_NAME} characters"
    if not _METRIC_NAME.match(name):
        return f"{name!r} is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)"
    return None


def metrics_url_for_port(port: int) -> str:
    """The endpoint a ``metrics_port`` stands for: ``/metrics`` on the IPv4 loopback address."""
    return f"http://127.0.0.1:{port}/metrics"


def metrics_url_problem(url: str) -> str | None:
    """What is wrong with a task's metrics URL, or None when the agent may scrape it.

    Accepted: ``http://HOST[:PORT][/path][?query]`` with HOST ``localhost`` or a loopback
    address (``127.0.0.0/8``, ``[::1]``), no user information, no fragment.
    """
    if len(url) > MAX_METRICS_URL:
        return f"longer than {MAX_METRICS_URL} characters"
    if any(c.isspace() or not c.isprintable() for c in url):
        return "contains whitespace or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return f"not a URL: {e}"
    if parts.scheme != "http":
        return f"scheme {parts.scheme or '(none)'!r}: only http is scraped"
    if parts.username is not None or parts.password is not None:
        return "must not carry user information"
    if parts.fragment:
        return "must not have a fragment"
    host = parts.hostname or ""
    if not host:
        return "has no host"
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            return f"host {host!r} is not localhost or a loopback address"
        if not loopback:
            return f"host {host!r} is not a loopback address: a task's metrics are read on its own host"
    if port == 0:
        return "port 0 is not a port"
    return None
