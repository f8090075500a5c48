"""End to end: a task's energy share on its agent is stored with the task when it ends, shown and exported."""

from __future__ import annotations

import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import Cluster, wait_until


def _task(c: Cluster, task_id: str) -> dict:
    res = c.ctl("-o", "json", "tasks", task_id)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


class TestTaskEnergy:
    def test_energy_stored_shown_and_exported(self, cluster: Cluster) -> None:
        """A 1-GPU training task on simulated GPUs ends with joules in JSON, kWh in text, and its kind metric."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
        res = cluster.ctl("-o", "json", "submit", "--name", "train", "--kind", "training", "--gpus", "1",
                          "--gpu-mem-gib", "10", "--cpu", "0.1", "--", "sleep", "4")
        assert res.returncode == 0, res.stderr
        tid = json.loads(res.stdout)["task_id"]
        t = wait_until(lambda: (x := _task(cluster, tid))["state"] in ("succeeded", "failed") and x,
                       what="task to finish")
        assert t["state"] == "succeeded" and t["energy_j"] > 0
        text = cluster.ctl("tasks", tid).stdout
        assert f"energy        {t['energy_j'] / 3.6e6:.4f} kWh\n" in text
        url = f"http://{cluster.metrics_address('c1')}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            fams = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
        by_kind = {s.labels["kind"]: s.value for s in fams["gptrm_task_energy_joules"].samples
                   if s.name == "gptrm_task_energy_joules_total"}
        assert by_kind["training"] == t["energy_j"] and by_kind["inference"] == 0.0
