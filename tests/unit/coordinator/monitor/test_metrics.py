"""Prometheus exposition (coordinator/metrics.py): the per-GPU fast path against prometheus-client's own rendering."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from common.pb.gptrm.v1 import types_pb2
from coordinator.monitor.metrics import Metrics, _TelemetryCollector, serve_metrics
from coordinator.monitor.nodes import NodeRegistry
from coordinator.monitor.resources import ResourceMonitor
from tests.helpers.metrics_reference import ClientRendered

MODELS = ("NVIDIA H100 80GB HBM3", 'odd "model" \\ with\na newline', "")


def cluster(n_nodes: int = 3) -> tuple[ResourceMonitor, NodeRegistry]:
    """Nodes with 2 GPUs each, one model per node (one of them awkward to quote), some fields unset."""
    monitor, registry = ResourceMonitor(history_s=10, interval_s=1), NodeRegistry(1.0, 5.0)
    for n in range(n_nodes):
        node_id = f"node-{n}" if n else 'n"0\\'
        model = MODELS[n % len(MODELS)]
        inventory = types_pb2.NodeInventory(node_id=node_id, gpus=[types_pb2.GpuInfo(index=i, model=model)
                                                                   for i in range(2)])
        registry.connect(inventory, outbox=None)
        sample = types_pb2.TelemetrySample(time_unix_s=1.0)
        for i in range(2):
            g = sample.gpus.add(index=i, util_gpu=0.25 * (i + n), power_w=100.5 + n, mem_used_bytes=2**33 + i,
                                mem_total_bytes=80 * 2**30, temperature_c=40.0, sm_clock_mhz=1980,
                                simulated=n % 2 == 0)
            if i == 0:
                g.energy_j = 1e12 + n   # large enough for an exponent
        monitor.ingest(node_id, 2, [sample])
    return monitor, registry


def gpu_lines(text: str) -> list[str]:
    """The lines of the per-GPU families, in order."""
    return [line for line in text.splitlines() if "gptrm_gpu_" in line]


class TestExposition:
    def test_gpu_lines_equal_prometheus_client_rendering(self) -> None:
        """Byte for byte the lines prometheus-client writes for the same gauges, escaping included."""
        monitor, registry = cluster()
        body, content_type = Metrics(monitor, registry, dict).exposition()
        reference = CollectorRegistry()
        reference.register(ClientRendered(monitor, registry))
        assert content_type.startswith("text/plain")
        assert gpu_lines(body.decode()) == gpu_lines(generate_latest(reference).decode())
        fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
        power = fams["gptrm_gpu_power_watts"].samples
        assert {s.labels["model"] for s in power} == set(MODELS)
        assert {s.labels["node"] for s in power} == {'n"0\\', "node-1", "node-2"}
        assert len(fams["gptrm_gpu_energy_joules"].samples) == 3   # unset fields are left out
        assert "gptrm_cluster_power_watts" in fams and "gptrm_node_power_watts" in fams

    @pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"])
    def test_energy_series_that_only_grow_are_counters(self, accept: str) -> None:
        """The per-GPU energy counter and the cluster's energy since start are counters (samples ``..._total``),
        in the text format and in OpenMetrics, and a name[] filter finds them by either name."""
        metrics = Metrics(*cluster(), dict)
        text = metrics.exposition(accept)[0].decode()
        parse = parse_openmetrics if accept else text_string_to_metric_families
        fams = {f.name: f for f in parse(text)}
        for name in ("gptrm_gpu_energy_joules", "gptrm_cluster_energy_joules"):
            assert fams[name].type == "counter", name
            assert {s.name for s in fams[name].samples} == {f"{name}_total"}
        assert fams["gptrm_gpu_power_watts"].type == "gauge"
        for name in ("gptrm_gpu_energy_joules_total", "gptrm_cluster_energy_joules_total"):
            assert f"\n{name}" in metrics.exposition(accept, names=[name])[0].decode()

    def test_openmetrics_keeps_eof_last(self) -> None:
        """Asked for OpenMetrics, the GPU families come before the closing # EOF and the whole parses."""
        body, content_type = Metrics(*cluster(), dict).exposition("application/openmetrics-text; version=1.0.0")
        text = body.decode()
        assert content_type.startswith("application/openmetrics-text")
        assert text.endswith("# EOF\n") and text.count("# EOF") == 1
        fams = {f.name: f for f in parse_openmetrics(text)}
        assert len(fams["gptrm_gpu_temperature_celsius"].samples) == 6

    def test_collector_describes_what_it_collects(self) -> None:
        """describe() (which name[] filters rely on) names exactly the families collect() yields."""
        collector = _TelemetryCollector(*cluster(), dict)
        assert [f.name for f in collector.describe()] == [f.name for f in collector.collect()]

    def test_name_filter(self) -> None:
        """name[] selects families on both paths; an unrelated filter renders no GPU line."""
        metrics = Metrics(*cluster(), dict)
        text = metrics.exposition(names=["gptrm_telemetry_samples_total"])[0].decode()
        assert "gptrm_telemetry_samples_total" in text and not gpu_lines(text)
        text = metrics.exposition(names=["gptrm_gpu_sm_clock_hertz", "gptrm_nodes"])[0].decode()
        names = {f.name for f in text_string_to_metric_families(text)}
        assert names == {"gptrm_gpu_sm_clock_hertz", "gptrm_nodes"}
        assert 'gpu="1"' in text and "1.98e+09" in text


class TestServer:
    @pytest.fixture
    def url(self) -> Iterator[str]:
        server = serve_metrics(Metrics(*cluster(), dict), "127.0.0.1:0")
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
        server.shutdown()
        server.server_close()

    def test_plain_and_gzip(self, url: str) -> None:
        """The same body plain and gzip-compressed (when the client accepts it), with its length."""
        with urllib.request.urlopen(url, timeout=5) as r:
            plain = r.read()
            assert r.headers["Content-Length"] == str(len(plain))
        request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=5) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            assert gzip.decompress(r.read()) == plain
        assert len(gpu_lines(plain.decode())) == 2 * 9 + 6 * 6 + 3   # HELP+TYPE × 9, 6 fields × 6 GPUs, 3 energies

    def test_other_methods_refused(self, url: str) -> None:
        """POST is 405 with the allowed methods; the server keeps answering GETs."""
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=5)
        assert e.value.code == 405 and e.value.headers["Allow"] == "OPTIONS,GET"
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.status == 200
