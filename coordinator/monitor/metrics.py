"""Prometheus metrics of the coordinator (names ``gptrm_<subsystem>_<name>_<unit>``).

Per-GPU and per-node gauges are produced at scrape time from the Resource Monitor's
latest samples, so the telemetry hot path pays nothing for them however many GPUs report.
Counters and histograms that the code updates live in :class:`Metrics`, built once per
process on its own registry (no global state).

The per-GPU gauges are most of a large cluster's answer (9 per GPU: 144,000 lines at 2,000
8-GPU nodes). prometheus-client would build a sample object and re-escape the labels for
each; instead they are written straight as exposition lines, labels escaped once per GPU and
values formatted by prometheus-client's own ``floatToGoString``, and appended to what
prometheus-client renders for everything else. The HTTP endpoint keeps prometheus-client's
behaviour: text or OpenMetrics by the Accept header, gzip when accepted, ``name[]`` filters.
"""

from __future__ import annotations

import gzip
import math
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer, choose_encoder, gzip_accepted
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from common.metrics_http import serve_wsgi

if TYPE_CHECKING:
    from coordinator.monitor.nodes import NodeRegistry
    from coordinator.monitor.resources import ResourceMonitor

__all__ = ["GpuHealthMetrics", "Metrics", "serve_metrics"]

# (metric suffix, help, GpuSample field, scale)
_GPU_GAUGES = (
    ("power_watts", "GPU power draw", "power_w", 1.0),
    ("power_limit_watts", "GPU enforced power limit", "power_limit_w", 1.0),
    ("utilization_ratio", "GPU compute utilization (0..1)", "util_gpu", 1.0),
    ("memory_utilization_ratio", "GPU memory controller utilization (0..1)", "util_mem", 1.0),
    ("memory_used_bytes", "GPU memory used", "mem_used_bytes", 1.0),
    ("memory_total_bytes", "GPU memory total", "mem_total_bytes", 1.0),
    ("temperature_celsius", "GPU temperature", "temperature_c", 1.0),
    ("sm_clock_hertz", "GPU SM clock", "sm_clock_mhz", 1e6),
    ("energy_joules", "GPU energy counter since driver load", "energy_j", 1.0),
)
_GPU_COUNTERS = frozenset({"energy_joules"})
"""Suffixes of the per-GPU series that only grow (a driver reload restarts them, as a counter may):
exposed as counters, their samples named ``..._total``."""


def _escape(value: str) -> str:
    """A label value as the exposition formats quote it (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _GpuGauges:
    """The per-GPU gauges (and the energy counter) of every node's latest sample, rendered as exposition text.

    :param monitor: the latest samples.
    :param registry: GPU models from the inventories.
    """

    families = tuple(f"gptrm_gpu_{suffix}" for suffix, _, _, _ in _GPU_GAUGES)

    def __init__(self, monitor: ResourceMonitor, registry: NodeRegistry) -> None:
        self._monitor = monitor
        self._registry = registry

    def render(self, names: Collection[str] | None = None, openmetrics: bool = False) -> str:
        """The families in ``names`` (all when None), each with its HELP and TYPE lines.

        :param names: metric names asked for (a ``name[]`` filter; a counter by its family or sample name), or None.
        :param openmetrics: OpenMetrics (a counter's HELP and TYPE name the family, without ``_total``) rather
            than the text format (they name the samples, as prometheus-client writes them).
        :returns: exposition lines.
        """
        wanted = []
        heads = []
        for name, (suffix, help_text, field, scale) in zip(self.families, _GPU_GAUGES, strict=True):
            counter = suffix in _GPU_COUNTERS
            series = f"{name}_total" if counter else name
            if names is not None and name not in names and series not in names:
                continue
            wanted.append((series, help_text, field, scale))
            head = name if openmetrics else series
            heads.append(f"# HELP {head} {help_text}\n# TYPE {head} {'counter' if counter else 'gauge'}\n")
        if not wanted:
            return ""
        outs: list[list[str]] = [[head] for head in heads]
        for node_id, sample in list(self._monitor.latest.items()):
            entry = self._registry.get(node_id)
            models = {g.index: g.model for g in entry.inventory.gpus} if entry else {}
            node = _escape(node_id)
            for g in sample.gpus:
                # Labels in name order, as prometheus-client writes them.
                labels = (f'{{gpu="{g.index}",model="{_escape(models.get(g.index, ""))}",node="{node}",'
                          f'simulated="{"true" if g.simulated else "false"}"}} ')
                for out, (name, _, field, scale) in zip(outs, wanted, strict=True):
                    if g.HasField(field):
                        out.append(f"{name}{labels}{floatToGoString(getattr(g, field) * scale)}\n")
        return "".join(line for out in outs for line in out)


class _TelemetryCollector(Collector):
    """Turns the monitor's latest samples and the registry into node and cluster gauges (and the cluster's
    energy counter) at scrape time."""

    counters = frozenset({"gptrm_cluster_energy_joules"})
    names = (
        "gptrm_node_utilization_ratio", "gptrm_node_power_watts", "gptrm_node_cpu_utilization_ratio",
        "gptrm_node_cpu_power_watts", "gptrm_node_memory_used_bytes", "gptrm_cluster_utilization_mean_ratio",
        "gptrm_cluster_utilization_stddev_ratio", "gptrm_cluster_power_watts",
        "gptrm_cluster_gpu_memory_utilization_ratio", "gptrm_cluster_energy_joules", "gptrm_tasks", "gptrm_nodes",
    )

    def __init__(self, monitor: ResourceMonitor, registry: NodeRegistry,
                 task_counts: Callable[[], dict[str, int]]) -> None:
        self._monitor = monitor
        self._registry = registry
        self._task_counts = task_counts

    def describe(self) -> list[Metric]:
        """The families :meth:`collect` yields (so that a ``name[]`` filter finds this collector)."""
        return [CounterMetricFamily(name, "") if name in self.counters else GaugeMetricFamily(name, "")
                for name in self.names]

    def collect(self) -> Iterator[Metric]:
        yield from self._node_families()
        obj = self._monitor.objectives
        for name, help_text, value in (
            ("gptrm_cluster_utilization_mean_ratio", "Eq. 1: mean compute utilization across nodes", obj.util_mean),
            ("gptrm_cluster_utilization_stddev_ratio", "Eq. 2: std-dev of compute utilization across nodes",
             obj.util_std),
            ("gptrm_cluster_power_watts", "Eq. 3: total power of the cluster", obj.power_w),
            ("gptrm_cluster_gpu_memory_utilization_ratio", "GPU memory used / total", obj.gpu_mem_util),
        ):
            yield GaugeMetricFamily(name, help_text, value=value)
        # Only grows (the sum of every node's energy since this replica started): a counter, gptrm_..._total.
        yield CounterMetricFamily("gptrm_cluster_energy_joules", "energy since the coordinator started",
                                  value=obj.energy_j)
        tasks = GaugeMetricFamily("gptrm_tasks", "tasks by state", labels=["state"])
        for state, count in sorted(self._task_counts().items()):
            tasks.add_metric([state], count)
        yield tasks
        nodes = GaugeMetricFamily("gptrm_nodes", "nodes by state", labels=["state"])
        for state, count in sorted(self._registry.counts().items()):
            nodes.add_metric([state], count)
        yield nodes

    def _node_families(self) -> Iterator[GaugeMetricFamily]:
        util = GaugeMetricFamily("gptrm_node_utilization_ratio", "node compute utilization (mean over GPUs)",
                                 labels=["node"])
        power = GaugeMetricFamily("gptrm_node_power_watts", "node power (GPUs + CPU package)", labels=["node"])
        cpu = GaugeMetricFamily("gptrm_node_cpu_utilization_ratio", "host CPU utilization", labels=["node"])
        cpu_power = GaugeMetricFamily("gptrm_node_cpu_power_watts", "CPU package power (RAPL)", labels=["node"])
        mem = GaugeMetricFamily("gptrm_node_memory_used_bytes", "host memory used", labels=["node"])
        for node_id, sample in list(self._monitor.latest.items()):
            current = self._monitor.node_current(node_id)
            if current is None:
                continue
            util.add_metric([node_id], current[0])
            power.add_metric([node_id], current[1])
            cpu.add_metric([node_id], sample.host.cpu_util)
            mem.add_metric([node_id], sample.host.mem_used_bytes)
            if sample.host.HasField("cpu_power_w") and math.isfinite(sample.host.cpu_power_w):
                cpu_power.add_metric([node_id], sample.host.cpu_power_w)
        yield from (util, power, cpu, cpu_power, mem)


# (metric name, help, TaskQos field)
_TASK_QOS_GAUGES = (
    ("gptrm_task_latency_p95_seconds", "p95 end-to-end request latency from the task's own metrics",
     "latency_p95_s"),
    ("gptrm_task_ttft_p95_seconds", "p95 time to first token from the task's own metrics", "ttft_p95_s"),
    ("gptrm_task_tokens_per_second", "generated tokens per second from the task's own metrics", "tokens_per_s"),
    ("gptrm_task_requests_running", "requests the task is serving, from its own metrics", "requests_running"),
    ("gptrm_task_requests_waiting", "requests queued in the task, from its own metrics", "requests_waiting"),
)
MAX_TASK_SERIES = 1000
"""Tasks exported per QoS gauge (the most recently updated); bounds the label cardinality."""
TASK_QOS_FRESH_S = 60.0
"""Readings older than this are left out: the task ended or its agent stopped reporting."""


class GpuHealthMetrics(Collector):
    """``gptrm_gpu_health{state}``: GPUs by health (``healthy``, ``degraded``, ``unhealthy`` = fenced), read at
    scrape time from the leader's GPU health watch.

    :param counts: ``{state: GPUs}`` (``coordinator.health.GpuHealthWatch.counts``).
    """

    name = "gptrm_gpu_health"
    states = ("healthy", "degraded", "unhealthy")

    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily(self.name, "")]

    def collect(self) -> Iterator[Metric]:
        counts = self._counts()
        family = GaugeMetricFamily(self.name, "GPUs by health: healthy, degraded (in service, ranked last), "
                                   "unhealthy (fenced: never placed on)", labels=["state"])
        for state in self.states:
            family.add_metric([state], counts.get(state, 0))
        yield family


class _TaskQosCollector(Collector):
    """Per-task gauges from the tasks' own metrics, labelled by task id only, bounded in number.

    :param monitor: holds the readings.
    :param now: wall clock, to leave out stale readings.
    """

    names = (*(name for name, _, _ in _TASK_QOS_GAUGES), "gptrm_task_metrics_available")

    def __init__(self, monitor: ResourceMonitor, now: Callable[[], float] = time.time) -> None:
        self._monitor = monitor
        self._now = now

    def describe(self) -> list[GaugeMetricFamily]:
        """The families :meth:`collect` yields."""
        return [GaugeMetricFamily(name, "") for name in self.names]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        horizon = self._now() - TASK_QOS_FRESH_S
        readings = [r for r in self._monitor.task_qos_readings() if r.received_unix_s >= horizon]
        readings = readings[-MAX_TASK_SERIES:]
        for name, help_text, field in _TASK_QOS_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=["task"])
            for r in readings:
                value = getattr(r, field)
                if value is not None:
                    family.add_metric([r.task_id], value)
            yield family
        available = GaugeMetricFamily("gptrm_task_metrics_available",
                                      "1 when the agent could read the task's metrics endpoint, 0 when not",
                                      labels=["task"])
        for r in readings:
            available.add_metric([r.task_id], 1.0 if r.available else 0.0)
        yield available


class _TaskEnergyCollector(Collector):
    """Energy of ended tasks by kind (task ids never become labels: cardinality stays at the kinds).

    :param monitor: holds the per-kind totals.
    """

    names = ("gptrm_task_energy_joules",)

    def __init__(self, monitor: ResourceMonitor) -> None:
        self._monitor = monitor

    def describe(self) -> list[CounterMetricFamily]:
        """The family :meth:`collect` yields."""
        return [CounterMetricFamily("gptrm_task_energy_joules", "")]

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("gptrm_task_energy_joules",
                                     "energy drawn by tasks that ended, from the agents' per-task shares",
                                     labels=["kind"])
        for kind, joules in sorted(self._monitor.task_energy.by_kind.items()):
            family.add_metric([kind], joules)
        yield family


class Metrics:
    """Counters and histograms the coordinator updates, on a private registry, and the scrape answer.

    :param monitor: source of per-GPU/per-node gauges and cluster objectives.
    :param registry: node registry (node counts by state, GPU models).
    :param task_counts: callable returning {state label: count}.
    :param leading: whether this replica leads (``gptrm_coordinator_leader``).
    :param etcd_up: whether etcd answers (``gptrm_etcd_up``).
    """

    def __init__(self, monitor: ResourceMonitor, registry: NodeRegistry,
                 task_counts: Callable[[], dict[str, int]], *, leading: Callable[[], bool] = lambda: False,
                 etcd_up: Callable[[], bool] = lambda: True) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_TelemetryCollector(monitor, registry, task_counts))
        self.registry.register(_TaskQosCollector(monitor))
        self.registry.register(_TaskEnergyCollector(monitor))
        self._gpus = _GpuGauges(monitor, registry)
        r = self.registry
        self.streams = Gauge("gptrm_agent_streams", "open agent streams", registry=r)
        self.samples = Counter("gptrm_telemetry_samples_total", "telemetry samples ingested", registry=r)
        self.quarantined = Counter("gptrm_etcd_quarantined_total",
                                   "etcd values the leader read that did not parse or validate, moved under "
                                   "quarantine/, by key collection (tasks, nodes, services, ...)", ["prefix"],
                                   registry=r)
        self.rejected_samples = Counter("gptrm_telemetry_rejected_samples_total",
                                        "telemetry samples refused for an impossible value (NaN, inf, negative, "
                                        "out of range)", ["node_id"], registry=r)
        self.dropped = Counter("gptrm_telemetry_dropped_samples_total",
                               "telemetry samples agents dropped while disconnected (as reported)", registry=r)
        self.ingest_lag = Histogram("gptrm_telemetry_ingest_lag_seconds", "sample time to ingestion",
                                    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.sched_latency = Histogram("gptrm_scheduler_cycle_duration_seconds", "one scheduling cycle",
                                       registry=r)
        self.decision_latency = Histogram("gptrm_scheduler_decision_duration_seconds",
                                          "time to place one task within a cycle",
                                          buckets=(1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5),
                                          registry=r)
        self.decisions = Counter("gptrm_scheduler_decisions_total", "placement decisions", ["outcome"], registry=r)
        self.preemptions = Counter("gptrm_preemptions_total", "running tasks preempted by higher-priority work",
                                   registry=r)
        self.resizes = Counter("gptrm_elastic_resizes_total", "elastic tasks resized, by direction (grow, shrink)",
                               ["direction"], registry=r)
        self.elastic_gpus = Gauge("gptrm_elastic_gpus", "GPUs held by running elastic tasks, by part (minimum: "
                                  "what their ranges guarantee; extra: what they took beyond it)", ["part"],
                                  registry=r)
        self.elastic_tasks = Gauge("gptrm_elastic_tasks", "elastic tasks placed or running", registry=r)
        self.qos_violations = Counter("gptrm_qos_violations_total", "QoS violations raised, by kind "
                                      "(deadline, latency, throughput)", ["kind"], registry=r)
        self.commit_latency = Histogram("gptrm_sync_commit_duration_seconds", "etcd commit of a placement batch",
                                        registry=r)
        self.missing_resources = Gauge("gptrm_adaptor_missing_resources",
                                       "resources a static node provider recommends adding (latest scale-out)",
                                       ["resource"], registry=r)
        self.provider_failures = Counter("gptrm_adaptor_provider_failures_total",
                                         "node provider requests that failed", ["action"], registry=r)
        self.power_off_ignored = Counter("gptrm_adaptor_power_off_ignored_total",
                                         "power-offs the provider accepted while the node went on streaming "
                                         "past --power-off-grace", registry=r)
        self.power_cap_changes = Counter("gptrm_adaptor_power_cap_changes_total",
                                         "GPU power-limit changes by the capping loop, by direction (down, up)",
                                         ["direction"], registry=r)
        self.leader_duty_failures = Counter("gptrm_leader_duty_failures_total",
                                            "unexpected exceptions that ended a leader duty (then restarted)",
                                            ["duty"], registry=r)
        self.is_leader = Gauge("gptrm_coordinator_leader", "1 while this replica leads", registry=r)
        self.is_leader.set_function(lambda: 1.0 if leading() else 0.0)
        self.etcd_up = Gauge("gptrm_etcd_up", "1 while etcd answers (the coordinator starts only once it does)",
                             registry=r)
        self.etcd_up.set_function(lambda: 1.0 if etcd_up() else 0.0)

    def exposition(self, accept: str = "", names: Iterable[str] | None = None) -> tuple[bytes, str]:
        """One scrape's answer: every metric (or those in ``names``), in the format ``accept`` asks for.

        :param accept: the request's Accept header (OpenMetrics when it asks for it, else text 0.0.4).
        :param names: a ``name[]`` filter, or None for everything.
        :returns: ``(body, content type)``.
        """
        encoder, content_type = choose_encoder(accept)
        wanted = None if names is None else set(names)
        output = encoder(self.registry if wanted is None else self.registry.restricted_registry(wanted))
        gpus = self._gpus.render(wanted, openmetrics=content_type.startswith("application/openmetrics")).encode()
        if gpus:
            eof = b"# EOF\n"   # OpenMetrics ends with it; the GPU families go before
            output = output[: -len(eof)] + gpus + eof if output.endswith(eof) else output + gpus
        return output, content_type


def _wsgi_app(metrics: Metrics) -> Callable[..., list[bytes]]:
    """The /metrics endpoint: GET (any path), OPTIONS; gzip when the client accepts it."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        method = environ["REQUEST_METHOD"]
        if method == "OPTIONS":
            start_response("200 OK", [("Allow", "OPTIONS,GET")])
            return [b""]
        if method != "GET":
            start_response("405 Method Not Allowed", [("Allow", "OPTIONS,GET")])
            return [f"# HTTP 405: {method}; use OPTIONS or GET\n".encode()]
        params = parse_qs(environ.get("QUERY_STRING", ""))
        body, content_type = metrics.exposition(environ.get("HTTP_ACCEPT", ""), params.get("name[]"))
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body, compresslevel=1)   # a fraction of level 9's CPU; still ~25x smaller
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [body]

    return app


def serve_metrics(metrics: Metrics, listen: str) -> ThreadingWSGIServer:
    """Start the HTTP exposition server on ``HOST:PORT`` in a daemon thread.

    :param metrics: what to serve.
    :param listen: ``HOST:PORT`` (``[::]:PORT`` for IPv6; port 0 picks a free one).
    :returns: the server (``server_address`` says where it listens; ``shutdown()`` stops it).
    """
    return serve_wsgi(listen, _wsgi_app(metrics), component="coordinator")
