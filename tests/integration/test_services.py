"""End to end with real processes: a service of 1..3 replicas on a simulated node, pinned, unpinned, and a
killed replica replaced."""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request

from tests.helpers.ctl_schema import validate
from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until

SLEEPER = "import os, time; print('replica', os.environ['GPTRM_REPLICA'], flush=True); time.sleep(600)"


def _service(c: Cluster, service_id: str) -> dict:
    res = c.ctl("-o", "json", "tasks", service_id)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _running(c: Cluster, service_id: str, n: int) -> dict | None:
    d = _service(c, service_id)
    running = [r for r in d["replicas"] if r["state"] == "running"]
    return d if len(running) == n and len(d["replicas"]) == n else None


def _metrics(c: Cluster) -> str:
    with urllib.request.urlopen(f"http://{c.metrics_address()}/metrics", timeout=5) as resp:
        return resp.read().decode()


class TestServiceReplicas:
    def test_pin_unpin_and_replace_a_killed_replica(self, cluster: Cluster) -> None:
        """submit --replicas 1:3 runs one replica; scale 2 pins two (indices 0 and 1, each its own process and
        GPU); a replica killed with SIGKILL is replaced under the same index; scale auto unpins."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1", *ROOT_TASKS_AGENT)
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
        res = cluster.ctl("-o", "json", "submit", "--name", "llm", "--replicas", "1:3", "--target-util", "0.6",
                          "--metrics-port", "19100", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1",
                          *ROOT_TASKS_SUBMIT, "--", sys.executable, "-c", SLEEPER)
        assert res.returncode == 0, res.stderr
        sid = json.loads(res.stdout)["service_id"]
        assert sid.startswith("s-")
        wait_until(lambda: _running(cluster, sid, 1), timeout_s=60, what="one replica running")

        res = cluster.ctl("scale", sid, "2")
        assert res.returncode == 0 and "pinned at 2" in res.stdout, res.stderr
        d = wait_until(lambda: _running(cluster, sid, 2), timeout_s=60, what="two replicas running")
        assert d["pinned"] and d["desired"] == 2
        assert sorted(r["replica"] for r in d["replicas"]) == [0, 1]
        assert all(r["node"] == "n1" for r in d["replicas"])
        first = {r["replica"]: r["task_id"] for r in d["replicas"]}
        gpus = [json.loads(cluster.ctl("-o", "json", "tasks", t).stdout)["allocation"][0]["gpu_indices"]
                for t in first.values()]
        assert gpus[0] != gpus[1]                                    # each replica its own GPU

        victim = json.loads(cluster.ctl("-o", "json", "tasks", first[1]).stdout)
        assert victim["spec"]["env"]["GPTRM_REPLICA"] == "1" and victim["spec"]["metrics_port"] == 19101
        os.kill(victim["pids"][0], signal.SIGKILL)
        d = wait_until(lambda: (x := _running(cluster, sid, 2)) and
                       {r["replica"]: r["task_id"] for r in x["replicas"]}[1] != first[1] and x,
                       timeout_s=60, what="replica 1 replaced")
        assert {r["replica"]: r["task_id"] for r in d["replicas"]}[0] == first[0]
        gone = json.loads(cluster.ctl("-o", "json", "tasks", first[1]).stdout)
        assert gone["state"] == "failed"

        validate(d, "service")
        wanted = [f'gptrm_service_replicas_desired{{service="{sid}"}} 2.0',
                  f'gptrm_service_replicas_running{{service="{sid}"}} 2.0']
        wait_until(lambda: all(w in _metrics(cluster) for w in wanted), timeout_s=20, what="service metrics")
        res = cluster.ctl("scale", sid, "auto")
        assert res.returncode == 0 and "autoscaling" in res.stdout, res.stderr
        d = _service(cluster, sid)
        assert not d["pinned"] and 1 <= d["desired"] <= 3
        table = cluster.ctl("tasks", sid)
        assert "REPLICA" in table.stdout and "forecast" in table.stdout, table.stdout
        events = cluster.ctl("events").stdout
        assert "pinned at 2 by an admin" in events

    def test_bad_service_input_names_the_field(self, cluster: Cluster) -> None:
        """MIN > MAX, a malformed range and a target out of range are refused with the field named."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        base = ("submit", "--gpus", "1", "--metrics-port", "19200")
        res = cluster.ctl(*base, "--replicas", "3:2", "--target-util", "0.5", "--", "true")
        assert res.returncode != 0 and "spec.service.max_replicas" in res.stderr, res.stderr
        res = cluster.ctl(*base, "--replicas", "1:x", "--target-util", "0.5", "--", "true")
        assert res.returncode == 2 and "--replicas" in res.stderr, res.stderr
        res = cluster.ctl(*base, "--replicas", "1:2", "--target-util", "2", "--", "true")
        assert res.returncode != 0 and "spec.service.target_util" in res.stderr, res.stderr
        res = cluster.ctl(*base, "--replicas", "1:2", "--", "true")
        assert res.returncode != 0 and "signal to scale on" in res.stderr, res.stderr
        res = cluster.ctl("scale", "s-nothere", "2")
        assert res.returncode != 0 and "not found" in res.stderr, res.stderr
