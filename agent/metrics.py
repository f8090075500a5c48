"""The agent's Prometheus endpoint (``--metrics-listen HOST:PORT``, off by default).

Everything is read at scrape time from what the agent already holds: the sampler's latest tick
(:attr:`agent.sampler.Sampler.latest`), the GPU inventory read when the backend opened, and
the task table. A scrape never polls NVML, and no thread updates metrics in the background.

- Per GPU, the fields of dcgm-exporter's default list that the sampler measures, under
  dcgm-exporter's names, labels and types (``DCGM_FI_DEV_GPU_UTIL`` in percent,
  ``DCGM_FI_DEV_FB_USED`` in MiB, ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` a counter in mJ
  named without ``_total``, as dcgm-exporter names it), so its dashboards and alerts work on a
  gptrm node. A field the latest sample lacks (an unhealthy GPU, a value the driver does not
  report) is left out, never filled in.
- Per GPU, its health signals under dcgm-exporter's names too (``DCGM_FI_DEV_XID_ERRORS``, the last XID;
  the volatile ECC totals; remapped rows, pending and failed remaps; the clocks throttle reasons bitmask;
  the PCIe link's generation and width), each where the GPU reports it (docs/gpu-health-signals.md), and
  ``gptrm_agent_gpu_health{state}`` (1 for the state the agent classifies the GPU in, 0 for the others)
  with ``gptrm_agent_gpu_app_xids_total``.
- ``gptrm_agent_*``: the agent itself (``gptrm_agent_info``, whose ``gpu_backend`` and
  ``simulated`` labels say when the GPUs are simulated), each collector's success and
  duration on the latest tick, and which GPUs each task holds.

Tasks on the host cannot read it: a connection from one of the tasks' uids gets 403 (see
:mod:`common.metrics_http`; a Prometheus on another host, or on this one as its own user, is served).

Label values that come from outside the agent (task ids, GPU model names, the node name) are
cut to :data:`MAX_LABEL_CHARS`, and at most :data:`MAX_TASKS` tasks are listed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from agent.collectors import GpuDevice, GpuReading
from agent.sampler import SamplerState
from agent.tasktable import TaskRecord
from common.metrics_http import QuietHandler, serve_wsgi
from common.pb.gptrm.v1 import types_pb2

__all__ = [
    "DCGM_COUNTERS",
    "DCGM_GAUGES",
    "DCGM_HEALTH",
    "MAX_LABEL_CHARS",
    "MAX_TASKS",
    "AgentMetrics",
    "render",
    "serve_metrics",
]

MAX_LABEL_CHARS = 128
"""Longest label value served; longer ones are cut."""
MAX_TASKS = 1024
"""Most tasks listed per scrape (in task id order)."""
MAX_CONCURRENT_SCRAPES = 4
"""Scrapes answered at once; more get 503."""
REQUEST_TIMEOUT_S = 10.0
"""A connection that sends nothing for this long is closed."""

_MIB = 1 << 20
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The classic text format, which :func:`render` writes (and dcgm-exporter serves)."""

# dcgm-exporter's field name, help (its wording), GpuSample field, factor to dcgm's unit.
DCGM_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz", 1.0),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "mem_clock_mhz", 1.0),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_c", 1.0),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w", 1.0),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "util_gpu", 100.0),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "util_mem", 100.0),
)
DCGM_COUNTERS: tuple[tuple[str, str, str, float], ...] = (
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", "energy_j", 1000.0),
)
"""dcgm-exporter's counters: exposed as counters under dcgm's own names (no ``_total``)."""

# GPU health under dcgm-exporter's names: name, help (its wording), type, the value from a reading.
DCGM_HEALTH: tuple[tuple[str, str, str, Callable[[GpuReading], float | None]], ...] = (
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "gauge",
     lambda r: r.xid_last if r.xid_last is not None else (0 if r.signals is not None and not r.signals.lost else None)),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", "counter",
     lambda r: r.ecc_corrected_total),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", "counter",
     lambda r: r.ecc_uncorrected_total),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors", "counter",
     lambda r: r.signals.remapped_correctable if r.signals else None),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors", "counter",
     lambda r: r.signals.remapped_uncorrectable if r.signals else None),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", "gauge",
     lambda r: _flag(r.signals.remap_failure) if r.signals else None),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether remapping of rows is pending (a GPU reset applies it)", "gauge",
     lambda r: _flag(r.signals.remap_pending) if r.signals else None),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*)",
     "gauge", lambda r: r.signals.clocks_event_reasons if r.signals else None),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe current link generation.", "gauge",
     lambda r: r.signals.pcie_gen if r.signals else None),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe current link width.", "gauge",
     lambda r: r.signals.pcie_width if r.signals else None),
)
HEALTH_STATES = ("healthy", "degraded", "unhealthy")

_DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")


def _label(value: str) -> str:
    """A label value from outside the agent, bounded."""
    return value[:MAX_LABEL_CHARS]


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


class AgentMetrics(Collector):
    """The custom collector behind the agent's ``/metrics``, on a registry of its own.

    :param latest: the sampler's latest tick (``lambda: sampler.latest``); None before the first.
    :param devices: the GPU inventory (model names and PCI bus ids; read once here).
    :param tasks: the task table's records (``lambda: runtime.table.tasks``).
    :param node: the node name (dcgm-exporter's ``Hostname`` label).
    :param gpu_backend: ``nvml`` or ``simulated``. :param simulated: the GPUs are simulated.
    :param host_simulated: the host's cores and memory are simulated. :param version: the agent's version.
    """

    def __init__(self, *, latest: Callable[[], SamplerState | None], devices: Sequence[GpuDevice],
                 tasks: Callable[[], Mapping[str, TaskRecord]], node: str, gpu_backend: str, simulated: bool,
                 host_simulated: bool = False, version: str = "") -> None:
        self._latest = latest
        self._tasks = tasks
        self._node = _label(node)
        self._devices = {d.index: d for d in devices}
        self._info = {"node": self._node, "version": _label(version), "gpu_backend": _label(gpu_backend),
                      "simulated": _bool(simulated), "host_simulated": _bool(host_simulated)}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """One scrape's metric families."""
        info = GaugeMetricFamily("gptrm_agent_info", "1; the agent's version and GPU backend "
                                 "(simulated=\"true\": the GPUs are simulated, not real hardware)",
                                 labels=list(self._info))
        info.add_metric(list(self._info.values()), 1.0)
        yield info
        state = self._latest()
        if state is not None:
            yield from self._dcgm(state.sample)
            yield from self._health(state)
            yield from self._collectors(state)
        yield from self._task_gpus(state)

    def _gpu_labels(self, gpu: types_pb2.GpuSample) -> list[str]:
        device = self._devices.get(gpu.index)
        model = device.model if device is not None else ""
        pci = device.pci_bus_id if device is not None else ""
        return [str(gpu.index), _label(gpu.uuid), _label(pci), f"nvidia{gpu.index}", _label(model), self._node]

    def _dcgm(self, sample: types_pb2.TelemetrySample) -> Iterator[Metric]:
        labels = [(g, self._gpu_labels(g)) for g in sample.gpus]
        for name, doc, field, scale in DCGM_GAUGES:
            fam = GaugeMetricFamily(name, doc, labels=_DCGM_LABELS)
            for gpu, values in labels:
                if gpu.HasField(field):
                    fam.add_metric(values, getattr(gpu, field) * scale)
            yield fam
        used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=_DCGM_LABELS)
        free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=_DCGM_LABELS)
        # NVML's memory info (v1) has total = used + free, so free is what used leaves of total.
        for gpu, values in labels:
            if gpu.HasField("mem_used_bytes"):
                used.add_metric(values, gpu.mem_used_bytes // _MIB)
                if gpu.HasField("mem_total_bytes"):
                    free.add_metric(values, max(0, gpu.mem_total_bytes - gpu.mem_used_bytes) // _MIB)
        yield used
        yield free
        for name, doc, field, scale in DCGM_COUNTERS:
            # A plain Metric keeps dcgm's sample name; render() gives its HELP and TYPE lines the same name.
            counter = Metric(name, doc, "counter")
            for gpu, values in labels:
                if gpu.HasField(field):
                    counter.add_sample(name, dict(zip(_DCGM_LABELS, values, strict=True)),
                                       getattr(gpu, field) * scale)
            yield counter

    def _health(self, state: SamplerState) -> Iterator[Metric]:
        labels = {g.index: self._gpu_labels(g) for g in state.sample.gpus}
        readings = [(r, labels[r.index]) for r in state.gpus if r.index in labels]
        for name, doc, kind, value in DCGM_HEALTH:
            metric = Metric(name, doc, kind)
            for reading, values in readings:
                v = value(reading)
                if v is not None:
                    metric.add_sample(name, dict(zip(_DCGM_LABELS, values, strict=True)), float(v))
            yield metric
        health = GaugeMetricFamily("gptrm_agent_gpu_health", "1 for the GPU's health state as the agent classifies "
                                   "it (healthy, degraded, unhealthy), 0 for the others",
                                   labels=["gpu", "UUID", "state"])
        app_xids = CounterMetricFamily("gptrm_agent_gpu_app_xids", "application XIDs (the task's fault, the GPU "
                                       "stays healthy) the GPU raised since the agent started", labels=["gpu", "UUID"])
        for reading, values in readings:
            if reading.health is None:
                continue
            for s in HEALTH_STATES:
                health.add_metric([values[0], values[1], s], 1.0 if reading.health.state == s else 0.0)
            app_xids.add_metric([values[0], values[1]], reading.health.app_xid_count)
        yield health
        yield app_xids

    def _collectors(self, state: SamplerState) -> Iterator[Metric]:
        success = GaugeMetricFamily("gptrm_agent_collector_success",
                                    "1 when the collector read its source on the latest tick, 0 when it failed",
                                    labels=["collector"])
        duration = GaugeMetricFamily("gptrm_agent_collector_duration_seconds",
                                     "time the collector took on the latest tick", labels=["collector"])
        failures = CounterMetricFamily("gptrm_agent_collector_failures",
                                       "ticks on which the collector failed, since the agent started",
                                       labels=["collector"])
        for run in state.collectors:
            success.add_metric([run.name], 1.0 if run.ok else 0.0)
            duration.add_metric([run.name], run.duration_s)
            failures.add_metric([run.name], state.failures_total.get(run.name, 0))
        yield success
        yield duration
        yield failures
        samples = CounterMetricFamily("gptrm_agent_samples", "telemetry ticks sampled since the agent started")
        samples.add_metric([], state.samples_total)
        yield samples
        last = GaugeMetricFamily("gptrm_agent_last_sample_timestamp_seconds",
                                 "wall-clock time of the latest tick, which every other value here comes from")
        last.add_metric([], state.sample.time_unix_s)
        yield last

    def _task_gpus(self, state: SamplerState | None) -> Iterator[Metric]:
        records = dict(self._tasks())   # one copy: the runtime changes the table on another thread
        shown = sorted(records)[:MAX_TASKS]
        count = GaugeMetricFamily("gptrm_agent_tasks", "tasks in the agent's task table")
        count.add_metric([], len(records))
        yield count
        gpus = GaugeMetricFamily("gptrm_agent_task_gpus", "GPUs a task holds on this node", labels=["task_id"])
        held = GaugeMetricFamily("gptrm_agent_task_gpu",
                                 "1 for every GPU a task holds (join with DCGM_* on gpu or UUID)",
                                 labels=["task_id", "gpu", "UUID"])
        for task_id in shown:
            record = records[task_id]
            tid = _label(task_id)
            gpus.add_metric([tid], len(record.gpu_indices))
            for i, index in enumerate(record.gpu_indices):
                uuid = record.gpu_uuids[i] if i < len(record.gpu_uuids) else ""
                held.add_metric([tid, str(index), _label(uuid)], 1.0)
        yield gpus
        yield held
        if state is None or not state.sample.HasField("host"):
            return
        wanted = set(shown)
        usage = [t for t in state.sample.host.tasks if t.task_id in wanted]
        for name, doc, field in (
            ("gptrm_agent_task_gpu_memory_used_bytes", "GPU memory the task's processes use", "gpu_mem_bytes"),
            ("gptrm_agent_task_gpu_utilization_ratio",
             "GPUs' worth of compute attributed to the task's processes (by their share of GPU memory)",
             "gpu_util_share"),
            ("gptrm_agent_task_gpu_power_watts", "GPU power attributed to the task's processes", "power_share_w"),
        ):
            fam = GaugeMetricFamily(name, doc, labels=["task_id"])
            for t in usage:
                fam.add_metric([_label(t.task_id)], getattr(t, field))
            yield fam


def render(metrics: AgentMetrics) -> bytes:
    """One scrape's answer in the Prometheus text format (0.0.4).

    prometheus-client names a counter's HELP and TYPE lines ``NAME_total``; dcgm-exporter's
    counters keep dcgm's names on every line, so those two lines are renamed back.
    """
    text = generate_latest(metrics.registry)
    counters = [name for name, _, _, _ in DCGM_COUNTERS]
    counters += [name for name, _, kind, _ in DCGM_HEALTH if kind == "counter"]
    for name in counters:
        text = text.replace(f"# HELP {name}_total ".encode(), f"# HELP {name} ".encode(), 1)
        text = text.replace(f"# TYPE {name}_total counter\n".encode(), f"# TYPE {name} counter\n".encode(), 1)
    return text


class _Handler(QuietHandler):
    """Closes idle connections; logs no access lines (scrapes come every few seconds)."""

    timeout = REQUEST_TIMEOUT_S


def _wsgi_app(metrics: AgentMetrics) -> Callable[..., list[bytes]]:
    """GET /metrics only; nothing of the request but its method and path is read."""
    slots = threading.BoundedSemaphore(MAX_CONCURRENT_SCRAPES)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        method = environ.get("REQUEST_METHOD", "")
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"only /metrics is served\n"]
        if method != "GET":
            start_response("405 Method Not Allowed", [("Allow", "GET"), ("Content-Type", "text/plain; charset=utf-8")])
            return [b"only GET is served\n"]
        if not slots.acquire(blocking=False):
            start_response("503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"too many scrapes at once\n"]
        try:
            body = render(metrics)
        finally:
            slots.release()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve_metrics(metrics: AgentMetrics, listen: str, *,
                  refuse: Callable[[int], bool] | None = None) -> ThreadingWSGIServer:
    """Serve ``/metrics`` on ``HOST:PORT`` from a daemon thread.

    :param listen: ``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 picks a free one).
    :param refuse: uids (the tasks') whose connections from this host get 403: the task ids, GPUs and power of
        other tenants' tasks are not theirs to read (see :mod:`common.metrics_http`).
    :returns: the server (``server_address`` says where it listens; ``shutdown()`` stops it).
    :raises OSError: the address cannot be bound.
    """
    return serve_wsgi(listen, _wsgi_app(metrics), _Handler, component="agent", refuse=refuse)
