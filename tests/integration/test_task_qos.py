"""End to end: a task declares its metrics port; its agent streams the p95 the coordinator shows."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

from common.pb.gptrm.v1 import admin_pb2
from tests.helpers.ports import free_port
from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until

SERVER = Path(__file__).resolve().parents[1] / "workloads" / "vllm_like_server.py"


def _submit(c: Cluster, *args: str) -> str:
    res = c.ctl("-o", "json", "submit", *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["task_id"]


def _reading(c: Cluster, task_id: str) -> dict | None:
    res = c.ctl("-o", "json", "tasks", task_id)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["qos_reading"]


def _p95_between(c: Cluster, task_id: str, low: float, high: float) -> dict | None:
    r = _reading(c, task_id)
    # One JSON dialect: a value the reading does not have is null, never missing.
    return r if r and r["latency_p95_s"] is not None and low < r["latency_p95_s"] <= high else None


def _control(port: int, **settings: object) -> None:
    query = "&".join(f"{k}={v}" for k, v in settings.items())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/control?{query}", timeout=5) as resp:
        assert resp.status == 200


class TestTaskQosStreaming:
    def test_agent_streams_p95_to_the_coordinator(self, cluster: Cluster) -> None:
        """The p95 of a vLLM-like task reaches GetTask, GetNode and /metrics, follows load, and a hang is a reason."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1", "--qos-window", "2", *ROOT_TASKS_AGENT)
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
        port = free_port()
        tid = _submit(cluster, "--name", "serve", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1",
                      *ROOT_TASKS_SUBMIT,
                      "--metrics-port", str(port), "--max-latency-ms", "1000", "--",
                      sys.executable, str(SERVER), "--port", str(port), "--load", "2")
        # Load 2: every request takes 0.35 s, in vLLM's bucket (0.3, 0.5].
        r = wait_until(lambda: _p95_between(cluster, tid, 0.3, 0.5), timeout_s=60, interval_s=0.5,
                       what="low-load p95 in GetTask")
        assert r["metrics_unavailable"] == "" and r["requests_running"] > 0 and r["tokens_per_s"] > 0
        node = cluster.admin().GetNode(admin_pb2.GetNodeRequest(node_id="n1"), timeout=5)
        assert [q.task_id for q in node.latest.task_qos] == [tid]
        res = cluster.ctl("tasks", tid)
        assert "qos           p95 " in res.stdout, res.stdout

        # Load 30: 1.75 s per request, in (1.5, 2.0], once the 2 s window holds only those.
        _control(port, load=30)
        wait_until(lambda: _p95_between(cluster, tid, 1.5, 2.0), timeout_s=60, interval_s=0.5,
                   what="high-load p95 in GetTask")
        metrics_url = f"http://{cluster.metrics_address('c1')}/metrics"

        def gauge() -> str:
            with urllib.request.urlopen(metrics_url, timeout=5) as resp:
                lines = resp.read().decode().splitlines()
            return next((x for x in lines if x.startswith(f'gptrm_task_latency_p95_seconds{{task="{tid}"}}')), "")

        assert float(wait_until(gauge, timeout_s=20, what="p95 gauge").split()[-1]) > 1.5

        # A hanging endpoint: reported on the task, values gone, telemetry keeps flowing.
        _control(port, mode="hang")
        r = wait_until(lambda: (x := _reading(cluster, tid)) and x["metrics_unavailable"] and x, timeout_s=60,
                       interval_s=0.5, what="metrics unavailable")
        assert r["latency_p95_s"] is None
        t0 = cluster.admin().GetNode(admin_pb2.GetNodeRequest(node_id="n1"), timeout=5).latest.time_unix_s
        wait_until(lambda: cluster.admin().GetNode(admin_pb2.GetNodeRequest(node_id="n1"),
                                                   timeout=5).latest.time_unix_s > t0 + 1.0,
                   timeout_s=30, what="telemetry to keep coming while the endpoint hangs")
        assert "metrics unavailable: " in cluster.ctl("tasks", tid).stdout
        _control(port, mode="normal")
        assert cluster.ctl("cancel", tid).returncode == 0
