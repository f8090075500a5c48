"""The agent's /metrics: dcgm-exporter's names and labels from the latest tick, collector health, task GPUs."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from agent.collectors import HostReading, PowerReading, TaskUsage
from agent.collectors import Sample as Reading
from agent.collectors.simulated import SimulatedGpus
from agent.config import load
from agent.metrics import MAX_LABEL_CHARS, AgentMetrics, render, serve_metrics
from agent.sampler import Sampler, open_gpu_backend
from agent.tasktable import TaskRecord
from common.errors import CollectorError, ConfigError
from tests.helpers.clock import FakeClock
from tests.helpers.fake_pynvml import FakeNvml, make_gpus

Log = structlog.typing.FilteringBoundLogger
GIB = 1 << 30
MIB = 1 << 20

# Every field of dcgm-exporter's default counters list (the uncommented lines of its
# etc/default-counters.csv), with the Prometheus type it gives each. The agent exposes the ones
# the sampler measures (SM/memory clocks, GPU temperature, power, energy, GPU and memory-copy
# utilization, framebuffer used/free) under these names and types, and no other DCGM name.
DCGM_DEFAULT_COUNTERS = {
    "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEMORY_TEMP": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": "counter",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": "counter",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge",
    "DCGM_FI_DEV_ENC_UTIL": "gauge",
    "DCGM_FI_DEV_DEC_UTIL": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "counter",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "gauge",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
}
# Fields of dcgm-exporter's full field list (outside its default list) the agent serves for GPU health.
DCGM_HEALTH_FIELDS = {
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "gauge",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "gauge",
    "DCGM_FI_DEV_PCIE_LINK_GEN": "gauge",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": "gauge",
}
DCGM_NAMES = DCGM_DEFAULT_COUNTERS | DCGM_HEALTH_FIELDS
MEASURED = {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
            "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"}
HEALTH_MEASURED = {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                   "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE", *DCGM_HEALTH_FIELDS}
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}


class StubCollector:
    """A collector returning fixed readings, or raising when given an exception."""

    def __init__(self, name: str, readings: Sequence[Reading] = (), error: Exception | None = None) -> None:
        self.name = name
        self._readings = readings
        self.error = error

    def collect(self) -> Sequence[Reading]:
        if self.error is not None:
            raise self.error
        return self._readings


def record(task_id: str, indices: list[int], uuids: list[str]) -> TaskRecord:
    return TaskRecord(task_id=task_id, decision_id="d", pid=1, create_time=0.0, gpu_indices=indices,
                      gpu_uuids=uuids, log_path="", exit_file="", stop_grace_s=1.0, state=0, started_unix_s=0.0)


class Node:
    """Two jitter-free simulated GPUs, a host with one task on GPU 1 and a power collector, on a fake clock."""

    def __init__(self, clock: FakeClock, log: Log) -> None:
        self.clock = clock
        self.gpus = SimulatedGpus("2xH100-80GB", "n1", clock=clock, jitter=0.0)
        self.gpus.place("t-1", [1], 0.5, 10 * GIB, pids=[4242])
        host = HostReading(cpu_util=0.5, load1=1.0, load5=1.0, load15=1.0, mem_used_bytes=1, mem_total_bytes=2,
                           tasks=(TaskUsage("t-1", cpu_util=1.0, rss_bytes=MIB, pids=(4242,)),))
        self.power = StubCollector("power", [PowerReading(cpu_power_w=88.0)])
        self.sampler = Sampler(self.gpus, [StubCollector("host", [host]), self.power], interval_s=1.0, log=log,
                               now=clock, clock=clock, sleep=clock.sleep)
        self.tasks = {"t-1": record("t-1", [1], ["GPU-sim-n1-1"])}
        self.metrics = AgentMetrics(latest=lambda: self.sampler.latest, devices=self.gpus.devices(),
                                    tasks=lambda: self.tasks, node="n1", gpu_backend=self.gpus.backend,
                                    simulated=self.gpus.simulated, version="0.1.0")

    def tick(self) -> None:
        self.sampler.sample_once()
        self.clock.advance(1.0)

    def families(self) -> dict[str, list[Sample]]:
        return {f.name: f.samples for f in text_string_to_metric_families(render(self.metrics).decode())}


@pytest.fixture
def node(clock: FakeClock, log: Log) -> Node:
    return Node(clock, log)


def by_gpu(samples: list[Sample]) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for s in samples}


class TestExposition:
    """What one scrape says, parsed back with prometheus-client's own parser."""

    def test_dcgm_names_labels_and_values(self, node: Node) -> None:
        """Only dcgm-exporter's names (its default list, and its health fields), with its labels, one series per
        GPU, values in its units."""
        node.tick()
        node.tick()
        families = {f.name: f for f in text_string_to_metric_families(render(node.metrics).decode())}
        dcgm = {name for name in families if name.startswith("DCGM_")}
        assert dcgm <= set(DCGM_NAMES), dcgm - set(DCGM_NAMES)
        assert dcgm == MEASURED | HEALTH_MEASURED
        for name in dcgm:
            fam = families[name]
            assert fam.type == DCGM_NAMES[name], name
            assert len(fam.samples) == 2, name
            for s in fam.samples:
                assert set(s.labels) == DCGM_LABELS, (name, s.labels)
                gpu = s.labels["gpu"]
                assert s.labels["UUID"] == f"GPU-sim-n1-{gpu}" and s.labels["device"] == f"nvidia{gpu}"
                assert s.labels["modelName"] == "H100-80GB" and s.labels["Hostname"] == "n1"
        readings = {g.index: g for g in node.gpus.collect()}   # one more tick: only energy moves without time
        assert by_gpu(families["DCGM_FI_DEV_GPU_UTIL"].samples) == {"0": 0.0, "1": 50.0}
        assert by_gpu(families["DCGM_FI_DEV_MEM_COPY_UTIL"].samples) == {"0": 0.0, "1": 25.0}
        assert by_gpu(families["DCGM_FI_DEV_FB_USED"].samples) == {"0": 0.0, "1": 10 * 1024}
        total_mib = readings[1].mem_total_bytes // MIB
        assert by_gpu(families["DCGM_FI_DEV_FB_FREE"].samples) == {"0": total_mib, "1": total_mib - 10 * 1024}
        assert by_gpu(families["DCGM_FI_DEV_POWER_USAGE"].samples) == {
            str(i): pytest.approx(r.power_w) for i, r in readings.items()}
        assert by_gpu(families["DCGM_FI_DEV_GPU_TEMP"].samples) == {
            str(i): pytest.approx(r.temperature_c) for i, r in readings.items()}
        energy = by_gpu(families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].samples)
        assert energy == {str(i): pytest.approx(r.power_w * 1000) for i, r in readings.items()}

    def test_exposition_rules(self, node: Node) -> None:
        """Every family has HELP and TYPE; counters end in _total except dcgm-exporter's, which keep dcgm's name."""
        node.tick()
        text = render(node.metrics).decode()
        helps = re.findall(r"^# HELP (\S+) \S", text, re.M)
        types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
        assert len(helps) == len(set(helps)) == len(types)
        assert set(helps) == set(types)
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            name = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line)
            assert name is not None and name.group(0) in types, line
        for name, kind in types.items():
            assert kind in ("gauge", "counter"), name
            if kind == "counter" and not name.startswith("DCGM_"):
                assert name.endswith("_total"), name
            if name.startswith("DCGM_"):
                assert kind == DCGM_NAMES[name], name
            else:
                assert name.startswith("gptrm_agent_"), name
        assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
        assert re.search(r"^DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\{", text, re.M)

    def test_simulated_backend_labelled(self, node: Node) -> None:
        """gptrm_agent_info says the GPUs are simulated."""
        [info] = node.families()["gptrm_agent_info"]
        assert info.value == 1.0
        assert info.labels == {"node": "n1", "version": "0.1.0", "gpu_backend": "simulated", "simulated": "true",
                               "host_simulated": "false"}

    def test_nvml_backend(self, clock: FakeClock, log: Log) -> None:
        """Real (here: fake NVML) GPUs are labelled nvml and not simulated, with the same DCGM names and labels."""
        gpus = open_gpu_backend("nvml", "", log, nvml_module=FakeNvml(make_gpus(2)))
        sampler = Sampler(gpus, [], interval_s=1.0, log=log, now=clock, clock=clock, sleep=clock.sleep)
        sampler.sample_once()
        metrics = AgentMetrics(latest=lambda: sampler.latest, devices=gpus.devices(), tasks=dict, node="gpu01",
                               gpu_backend=gpus.backend, simulated=gpus.simulated)
        families = {f.name: f for f in text_string_to_metric_families(render(metrics).decode())}
        [info] = families["gptrm_agent_info"].samples
        assert info.labels["gpu_backend"] == "nvml" and info.labels["simulated"] == "false"
        dcgm = {name for name in families if name.startswith("DCGM_")}
        assert dcgm and dcgm <= set(DCGM_NAMES)
        models = {d.index: d.model for d in gpus.devices()}
        for s in families["DCGM_FI_DEV_GPU_UTIL"].samples:
            assert set(s.labels) == DCGM_LABELS and s.labels["modelName"] == models[int(s.labels["gpu"])]

    def test_collectors_succeeding(self, node: Node) -> None:
        """Every collector the sampler ran has success 1 and its duration."""
        node.tick()
        fams = node.families()
        success = {s.labels["collector"]: s.value for s in fams["gptrm_agent_collector_success"]}
        assert success == {"simulated": 1.0, "host": 1.0, "power": 1.0}
        duration = {s.labels["collector"]: s.value for s in fams["gptrm_agent_collector_duration_seconds"]}
        assert duration == {"simulated": 0.0, "host": 0.0, "power": 0.0}   # the fake clock stands still
        assert [s.value for s in fams["gptrm_agent_samples"]] == [1.0]
        assert [s.value for s in fams["gptrm_agent_last_sample_timestamp_seconds"]] == [1000.0]

    def test_failing_collector_shows_zero(self, node: Node) -> None:
        """A collector that raised shows success 0 and counts a failure; it shows 1 again once it recovers."""
        node.power.error = CollectorError("sensor unreadable")
        node.tick()
        node.tick()
        fams = node.families()
        success = {s.labels["collector"]: s.value for s in fams["gptrm_agent_collector_success"]}
        assert success == {"simulated": 1.0, "host": 1.0, "power": 0.0}
        failures = {s.labels["collector"]: s.value for s in fams["gptrm_agent_collector_failures"]}
        assert failures == {"simulated": 0.0, "host": 0.0, "power": 2.0}
        node.power.error = None
        node.tick()
        success = {s.labels["collector"]: s.value for s in node.families()["gptrm_agent_collector_success"]}
        assert success["power"] == 1.0

    def test_gpu_without_readings_left_out(self, node: Node) -> None:
        """A lost GPU reports no values, so it has no DCGM series; nothing is filled in."""
        node.gpus.set_healthy(0, False)
        node.tick()
        fams = node.families()
        for name in MEASURED | HEALTH_MEASURED:
            assert [s.labels["gpu"] for s in fams[name]] == ["1"], name

    def test_gpu_health(self, node: Node) -> None:
        """The health signals under dcgm-exporter's names and the agent's health state per GPU."""
        node.tick()
        fams = node.families()
        assert by_gpu(fams["DCGM_FI_DEV_XID_ERRORS"]) == {"0": 0.0, "1": 0.0}
        node.gpus.inject({"gpu": 0, "xid": 48, "ecc_dbe": 2, "row_remap": "pending", "throttle": "thermal"})
        node.gpus.inject({"gpu": 1, "xid": 13})
        node.tick()
        fams = node.families()
        assert by_gpu(fams["DCGM_FI_DEV_XID_ERRORS"]) == {"0": 48.0, "1": 13.0}
        assert by_gpu(fams["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]) == {"0": 2.0, "1": 0.0}
        assert by_gpu(fams["DCGM_FI_DEV_ROW_REMAP_PENDING"]) == {"0": 1.0, "1": 0.0}
        assert by_gpu(fams["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"]) == {"0": 1.0, "1": 0.0}
        assert by_gpu(fams["DCGM_FI_DEV_ROW_REMAP_FAILURE"]) == {"0": 0.0, "1": 0.0}
        assert by_gpu(fams["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]) == {"0": 0x48, "1": 0.0}
        assert by_gpu(fams["DCGM_FI_DEV_PCIE_LINK_WIDTH"]) == {"0": 16.0, "1": 16.0}
        health = {(s.labels["gpu"], s.labels["state"]): s.value for s in fams["gptrm_agent_gpu_health"]}
        assert health == {("0", "healthy"): 0.0, ("0", "degraded"): 0.0, ("0", "unhealthy"): 1.0,
                          ("1", "healthy"): 1.0, ("1", "degraded"): 0.0, ("1", "unhealthy"): 0.0}
        assert by_gpu(fams["gptrm_agent_gpu_app_xids"]) == {"0": 0.0, "1": 1.0}

    def test_before_the_first_tick(self, node: Node) -> None:
        """With no sample yet only the agent's info and task table are served."""
        fams = node.families()
        assert not [n for n in fams if n.startswith("DCGM_")]
        assert "gptrm_agent_collector_success" not in fams and "gptrm_agent_info" in fams

    def test_task_gpus(self, node: Node) -> None:
        """Each task's GPUs from the task table, and the GPU usage the sampler attributed to it."""
        node.tasks["t-2"] = record("t-2", [], [])
        node.tick()
        fams = node.families()
        assert {s.labels["task_id"]: s.value for s in fams["gptrm_agent_task_gpus"]} == {"t-1": 1.0, "t-2": 0.0}
        assert [s.labels for s in fams["gptrm_agent_task_gpu"]] == [
            {"task_id": "t-1", "gpu": "1", "UUID": "GPU-sim-n1-1"}]
        assert [s.value for s in fams["gptrm_agent_tasks"]] == [2.0]
        [mem] = fams["gptrm_agent_task_gpu_memory_used_bytes"]
        assert mem.labels == {"task_id": "t-1"} and mem.value == 10 * GIB
        [util] = fams["gptrm_agent_task_gpu_utilization_ratio"]
        assert util.value == 0.5

    def test_label_values_bounded(self, node: Node) -> None:
        """A long task id or node name is cut; at most MAX_TASKS tasks are listed."""
        long_id = "t-" + "x" * 500
        node.tasks = {long_id: record(long_id, [0], ["GPU-sim-n1-0"])}
        node.tick()
        [s] = node.families()["gptrm_agent_task_gpus"]
        assert len(s.labels["task_id"]) == MAX_LABEL_CHARS
        node.tasks = {f"t-{i:05d}": record(f"t-{i:05d}", [], []) for i in range(3000)}
        fams = node.families()
        assert len(fams["gptrm_agent_task_gpus"]) == 1024
        assert [s.value for s in fams["gptrm_agent_tasks"]] == [3000.0]


@pytest.fixture
def served(node: Node) -> Iterator[str]:
    server = serve_metrics(node.metrics, "127.0.0.1:0")
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class TestEndpoint:
    """GET /metrics over loopback; nothing else is served."""

    def test_get_metrics(self, node: Node, served: str) -> None:
        node.tick()
        with urllib.request.urlopen(f"{served}/metrics", timeout=10) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = resp.read().decode()
        assert "DCGM_FI_DEV_GPU_UTIL{" in body

    @pytest.mark.parametrize("path", ["/", "/metrics/", "/other", "/metrics/../x"])
    def test_other_paths_not_found(self, served: str, path: str) -> None:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{served}{path}", timeout=10)
        assert e.value.code == 404

    def test_only_get(self, served: str) -> None:
        req = urllib.request.Request(f"{served}/metrics", data=b"x" * 100, method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 405


class TestConfig:
    """--metrics-listen: off by default, HOST:PORT checked like the coordinator's."""

    def test_off_by_default(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("GPTRM_CONFIG", raising=False)
        monkeypatch.delenv("GPTRM_METRICS_LISTEN", raising=False)
        assert load(["--insecure"]).metrics_listen == ""

    def test_host_port(self) -> None:
        assert load(["--insecure", "--metrics-listen", "127.0.0.1:9471"]).metrics_listen == "127.0.0.1:9471"
        with pytest.raises(ConfigError, match="metrics"):
            load(["--insecure", "--metrics-listen", "localhost"])
