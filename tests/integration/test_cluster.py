"""End to end with real etcd, a real coordinator process and real agent processes."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from tests.integration.harness import BIN, Cluster, wait_until


def _node_state(c: Cluster, node_id: str) -> str:
    res = c.ctl("-o", "json", "nodes", node_id)
    return json.loads(res.stdout)["state"] if res.returncode == 0 else f"rc={res.returncode}"


class TestRegistration:
    def test_agent_registers_and_gptrmctl_lists_it(self, cluster: Cluster) -> None:
        """A real agent registers and gptrmctl status/nodes show it, labelled simulated."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("gpu-node-1")
        stub = cluster.admin()
        nodes = wait_until(lambda: stub.ListNodes(admin_pb2.ListNodesRequest(), timeout=2).nodes, what="node")
        inv = nodes[0].record.inventory
        assert inv.node_id == "gpu-node-1" and inv.simulated and len(inv.gpus) == 4
        assert inv.gpus[0].model.startswith("H100")
        res = cluster.ctl("nodes")
        assert res.returncode == 0 and "gpu-node-1" in res.stdout and "simulated" in res.stdout
        doc = json.loads(cluster.ctl("-o", "json", "status").stdout)
        assert doc["is_leader"] and doc["leader_id"] == "c1" and doc["nodes_by_state"] == {"ready": 1}
        wait_until(lambda: stub.GetNode(admin_pb2.GetNodeRequest(node_id="gpu-node-1"), timeout=2).has_latest,
                   what="telemetry")
        curve = json.loads(cluster.ctl("-o", "json", "nodes", "gpu-node-1").stdout)["power_curve"]
        assert curve["source"] in ("datasheet", "fitted") and 0 < curve["idle_w"] < curve["max_w"]
        assert curve["samples"] > 0   # the leader's power model is fed from this node's telemetry
        assert "power curve   GPUs" in cluster.ctl("nodes", "gpu-node-1").stdout

    def test_states_ready_not_ready_lost_ready(self, cluster: Cluster) -> None:
        """A stopped agent's node goes NOT_READY then LOST, and READY again when it comes back."""
        cluster.start_coordinator("c1", "--lost-grace", "3", "--heartbeat-interval", "0.5")
        cluster.wait_leader("c1")
        agent = cluster.start_agent("n1")
        wait_until(lambda: _node_state(cluster, "n1") == "ready", what="ready")
        agent.signal(signal.SIGSTOP)   # alive but silent: heartbeats stop, stream stays open
        wait_until(lambda: _node_state(cluster, "n1") == "not-ready", what="not-ready")
        agent.signal(signal.SIGCONT)
        wait_until(lambda: _node_state(cluster, "n1") == "ready", what="ready after SIGCONT")
        agent.stop()
        wait_until(lambda: _node_state(cluster, "n1") == "lost", timeout_s=20, what="lost")
        cluster.start_agent("n1")
        wait_until(lambda: _node_state(cluster, "n1") == "ready", what="ready after restart")

    def test_metrics_exposition(self, cluster: Cluster) -> None:
        """The metrics port serves valid Prometheus text with per-GPU power and the three objectives."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        url = f"http://{cluster.metrics_address('c1')}/metrics"

        def families() -> dict[str, object]:
            text = urllib.request.urlopen(url, timeout=2).read().decode()
            fams = {f.name: f for f in text_string_to_metric_families(text)}
            return fams if fams.get("gptrm_gpu_power_watts") and fams["gptrm_gpu_power_watts"].samples else {}

        fams = wait_until(families, what="per-GPU power in /metrics")
        power = fams["gptrm_gpu_power_watts"].samples
        assert {s.labels["gpu"] for s in power} == {"0", "1", "2", "3"}
        assert all(s.labels["node"] == "n1" and s.labels["simulated"] == "true" and s.value > 0 for s in power)
        for name in ("gptrm_cluster_utilization_mean_ratio", "gptrm_cluster_utilization_stddev_ratio",
                     "gptrm_cluster_power_watts"):
            assert name in fams, name
        assert fams["gptrm_cluster_power_watts"].samples[0].value > 0


class TestBadInput:
    def test_bad_config_is_one_line(self, tmp_path) -> None:
        """Unknown key, wrong type and unreachable etcd each exit non-zero with one line, no traceback."""
        bad = tmp_path / "c.toml"
        cases = [('bogus = 1\n', "unknown key 'bogus'"), ('lease_ttl = "x"\n', "lease_ttl: expected a number")]
        for text, needle in cases:
            bad.write_text(text)
            res = subprocess.run([str(BIN / "gptrm-coordinator"), "--config", str(bad)], capture_output=True,
                                 text=True, timeout=30)
            assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr
            assert len(res.stderr.strip().splitlines()) == 1
        res = subprocess.run([str(BIN / "gptrm-coordinator"), "--etcd", "http://127.0.0.1:1", "--etcd-timeout", "1",
                              "--insecure", "--metrics-listen", "", "--listen", "127.0.0.1:0"],
                             capture_output=True, text=True, timeout=60)
        err_lines = [line for line in res.stderr.splitlines() if "error" in line]
        assert res.returncode == 1 and "etcd" in res.stderr and "Traceback" not in res.stderr, res.stderr
        assert len(err_lines) == 1
        res = subprocess.run([str(BIN / "gptrm-agent"), "--interval", "0"], capture_output=True, text=True, timeout=30)
        assert res.returncode == 2 and "interval" in res.stderr and "Traceback" not in res.stderr

    def test_invalid_admin_requests(self, cluster: Cluster) -> None:
        """Malformed admin requests get INVALID_ARGUMENT/NOT_FOUND naming the field; the coordinator lives on."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        res = cluster.ctl("nodes", "no-such-node")
        assert res.returncode == 1 and "no-such-node" in res.stderr
        res = cluster.ctl("policy", "set", "fastest")
        assert res.returncode == 1 and "unknown policy" in res.stderr
        res = cluster.ctl("policy", "set", "load-balancing", "--threshold", "1.5")
        assert res.returncode == 1 and "threshold" in res.stderr
        stub = cluster.admin()
        try:
            stub.SubmitTask(admin_pb2.SubmitTaskRequest(spec=types_pb2.TaskSpec(
                name="x", kind=types_pb2.TASK_KIND_INFERENCE)), timeout=5)
            raise AssertionError("empty argv accepted")
        except Exception as e:  # grpc.RpcError
            assert "argv" in e.details()  # type: ignore[attr-defined]
        assert cluster.ctl("status").returncode == 0
        assert cluster.ctl("--coordinator", "127.0.0.1:1", "status").returncode == 3
        assert cluster.ctl("frobnicate").returncode == 2
