"""End to end: a real gptrm-agent on simulated GPUs serves /metrics (dcgm-exporter's names, collector health,
task GPUs) on loopback with --metrics-listen."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.helpers.ports import free_port
from tests.integration.harness import Cluster, wait_until
from tests.unit.agent.test_metrics_endpoint import DCGM_LABELS, DCGM_NAMES, HEALTH_MEASURED, MEASURED


def _scrape(url: str) -> dict[str, list[Sample]]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return {f.name: f.samples for f in text_string_to_metric_families(resp.read().decode())}


class TestAgentMetrics:
    def test_scrape_simulated_agent(self, cluster: Cluster) -> None:
        """Every simulated GPU has the DCGM series, every collector its success, a running task its GPU."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        listen = f"127.0.0.1:{free_port()}"
        cluster.start_agent("n1", "--metrics-listen", listen)
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
        # A sleeping task leaves a simulated GPU idle: this one declares its load (docs/devcluster.md).
        tid = cluster.submit("--name", "held", "--gpus", "1", "--gpu-mem-gib", "10", "--cpu", "0.1",
                             "--env", "GPTRM_SIM_LOAD=0.9", "--", "sleep", "300")
        t = wait_until(lambda: cluster.task_in(tid, "running"), what="task to run")
        [gpu] = t["allocation"][0]["gpu_indices"]
        url = f"http://{listen}/metrics"

        def held_and_sampled() -> dict[str, list[Sample]] | None:
            fams = _scrape(url)
            used = {s.labels["gpu"]: s.value for s in fams.get("DCGM_FI_DEV_FB_USED", [])}
            return fams if fams.get("gptrm_agent_task_gpu") and used.get(str(gpu), 0) > 0 else None

        fams = wait_until(held_and_sampled, what="the task's GPU in the agent's metrics")
        [info] = fams["gptrm_agent_info"]
        assert info.labels["gpu_backend"] == "simulated" and info.labels["simulated"] == "true"
        assert info.labels["node"] == "n1"
        dcgm = {name for name in fams if name.startswith("DCGM_")}
        assert dcgm == MEASURED | HEALTH_MEASURED and dcgm <= set(DCGM_NAMES)
        for name in dcgm:
            assert sorted(s.labels["gpu"] for s in fams[name]) == ["0", "1", "2", "3"], name
            for s in fams[name]:
                assert set(s.labels) == DCGM_LABELS, name
                assert s.labels["modelName"] == "H100-80GB" and s.labels["Hostname"] == "n1"
                assert s.labels["UUID"] == f"GPU-sim-n1-{s.labels['gpu']}"
        util = {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_GPU_UTIL"]}
        assert util[str(gpu)] > 0 and all(v == 0 for g, v in util.items() if g != str(gpu))
        assert {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_FB_USED"]}[str(gpu)] == 10 * 1024
        success = {s.labels["collector"]: s.value for s in fams["gptrm_agent_collector_success"]}
        assert {"simulated", "host", "power"} <= set(success)
        assert success["simulated"] == 1.0 and success["host"] == 1.0
        assert set(success) == {s.labels["collector"] for s in fams["gptrm_agent_collector_duration_seconds"]}
        assert all(s.value >= 0 for s in fams["gptrm_agent_collector_duration_seconds"])
        assert {s.labels["task_id"]: s.value for s in fams["gptrm_agent_task_gpus"]} == {tid: 1.0}
        assert [s.labels for s in fams["gptrm_agent_task_gpu"]] == [
            {"task_id": tid, "gpu": str(gpu), "UUID": f"GPU-sim-n1-{gpu}"}]

    def test_simulated_faults(self, cluster: Cluster, tmp_path: Path) -> None:
        """Lines appended to --simulate-faults reach the running agent: XID 79 makes GPU 2 unhealthy (the
        coordinator sees healthy=false with the reason, /metrics the state), XID 13 is counted on GPU 0, which
        stays healthy, and a bad line is skipped without stopping the agent."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        faults = tmp_path / "faults.jsonl"
        faults.write_text('{"gpu": 1, "throttle": "thermal"}\n')
        listen = f"127.0.0.1:{free_port()}"
        agent = cluster.start_agent("n1", "--metrics-listen", listen, "--simulate-faults", str(faults))
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
        with faults.open("a") as f:
            f.write('{"gpu": 9, "xid": 79}\n{"gpu": 2, "xid": 79}\n{"gpu": 0, "xid": 13}\n')

        def gpu2_unhealthy() -> list[dict[str, Any]] | None:
            gpus: list[dict[str, Any]] = json.loads(cluster.ctl("-o", "json", "nodes", "n1").stdout)["gpus"]
            t = gpus[2]["telemetry"] or {}
            return gpus if t.get("healthy") is False else None

        gpus = wait_until(gpu2_unhealthy, what="GPU 2 unhealthy at the coordinator")
        assert gpus[2]["telemetry"]["health_reason"] == "xid 79 (simulated)"
        health = {g["index"]: g["health"] for g in gpus}
        assert (health[2]["state"], health[2]["reason"], health[2]["evidence"], health[2]["simulated"]) == (
            "unhealthy", "xid 79", "xid=79 (simulated)", True)
        assert (health[1]["state"], health[1]["reason"]) == ("degraded", "thermal slowdown")
        assert health[0]["state"] == health[3]["state"] == "healthy"
        fams = _scrape(f"http://{listen}/metrics")
        health = {(s.labels["gpu"], s.labels["state"]) for s in fams["gptrm_agent_gpu_health"] if s.value == 1.0}
        assert health == {("0", "healthy"), ("1", "degraded"), ("2", "unhealthy"), ("3", "healthy")}
        assert {s.labels["gpu"]: s.value for s in fams["gptrm_agent_gpu_app_xids"]}["0"] == 1.0
        assert {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_XID_ERRORS"]}["2"] == 79.0
        assert agent.proc.poll() is None
        assert "simulated_fault_skipped" in (cluster.tmp / "agent-n1.log").read_text()
