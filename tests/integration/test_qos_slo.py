"""End to end: a vLLM-like task's p95 over its --max-latency-ms raises a qos-violation, and clears it when it falls."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

from tests.helpers.ports import free_port
from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until

SERVER = Path(__file__).resolve().parents[1] / "workloads" / "vllm_like_server.py"


def _submit(c: Cluster, *args: str) -> str:
    res = c.ctl("-o", "json", "submit", *ROOT_TASKS_SUBMIT, *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["task_id"]


def _control(port: int, **settings: object) -> None:
    query = "&".join(f"{k}={v}" for k, v in settings.items())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/control?{query}", timeout=5) as resp:
        assert resp.status == 200


def _violations(c: Cluster, task_id: str) -> list[tuple[str, str]]:
    """(violation kind, cleared) of the task's qos-violation events, oldest first."""
    res = c.ctl("-o", "json", "events")
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    return [(e["fields"]["violation"], e["fields"]["cleared"]) for e in events
            if e["kind"] == "qos-violation" and e["task_id"] == task_id]


def _metric(c: Cluster, kind: str) -> float:
    with urllib.request.urlopen(f"http://{c.metrics_address('c1')}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f'gptrm_qos_violations_total{{kind="{kind}"}}'):
                return float(line.split()[-1])
    return 0.0


class TestLatencySlo:
    def test_p95_over_target_raises_then_clears(self, cluster: Cluster) -> None:
        """Load 30 (p95 in (1.5, 2] s) over a 1000 ms bound raises one latency violation; load 2 clears it;
        a hanging endpoint raises nothing."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1", "--qos-window", "2", *ROOT_TASKS_AGENT)
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
        port = free_port()
        tid = _submit(cluster, "--name", "serve", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1",
                      "--metrics-port", str(port), "--max-latency-ms", "1000", "--",
                      sys.executable, str(SERVER), "--port", str(port), "--load", "2")
        wait_until(lambda: (r := json.loads(cluster.ctl("-o", "json", "tasks", tid).stdout)["qos_reading"])
                   and r["latency_p95_s"] is not None, timeout_s=60, interval_s=0.5, what="first reading")
        assert _violations(cluster, tid) == []
        _control(port, load=30)
        wait_until(lambda: _violations(cluster, tid) == [("latency", "false")], timeout_s=60, interval_s=0.5,
                   what="latency violation raised")
        assert _metric(cluster, "latency") == 1.0
        _control(port, load=2)
        wait_until(lambda: _violations(cluster, tid) == [("latency", "false"), ("latency", "true")], timeout_s=60,
                   interval_s=0.5, what="latency violation cleared")
        _control(port, mode="hang")
        wait_until(lambda: (r := json.loads(cluster.ctl("-o", "json", "tasks", tid).stdout)["qos_reading"])
                   and r["metrics_unavailable"], timeout_s=60, interval_s=0.5, what="metrics unavailable")
        assert _violations(cluster, tid) == [("latency", "false"), ("latency", "true")]
        assert _metric(cluster, "latency") == 1.0
        _control(port, mode="normal")
        assert cluster.ctl("cancel", tid).returncode == 0
