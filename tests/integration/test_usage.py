"""End to end: `gptrmctl usage` agrees with the tasks' own GPU-seconds (their state histories × GPUs) and energy,
in JSON, CSV and Prometheus, and keeps agreeing after a leader change."""

from __future__ import annotations

import csv
import io
import itertools
import json
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.ctl_schema import validate
from tests.integration.harness import Cluster, wait_until

HOLDING = ("scheduled", "starting", "running", "paused")
FINAL = ("succeeded", "failed", "cancelled")


def gpu_seconds(task: dict[str, Any]) -> float:
    """GPUs of the allocation × the seconds the history says the task held it."""
    gpus = sum(len(a["gpu_indices"]) * (a["gpu_share"] or 1.0) for a in task["allocation"])
    history = task["history"]
    held = sum(nxt["time_unix_s"] - h["time_unix_s"] for h, nxt in itertools.pairwise(history)
               if h["state"] in HOLDING)
    return gpus * held


def run_tasks(c: Cluster, *gpus: int) -> list[dict[str, Any]]:
    ids = [c.submit("--name", f"u{i}", "--kind", "training", "--gpus", str(n), "--gpu-mem-gib", "10", "--cpu", "1",
                    "--", "sleep", "3") for i, n in enumerate(gpus)]
    return [wait_until(lambda tid=tid: c.task_in(tid, *FINAL), 60, 0.2, f"{tid} to end") for tid in ids]


def matches(c: Cluster, tasks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The usage document when its totals agree with ``tasks`` within 1 % (and every task is counted)."""
    res = c.ctl("-o", "json", "usage", "--since", "1h")
    if res.returncode != 0:   # no leader for a moment
        return None
    d = json.loads(res.stdout)
    t = d["total"]
    want_gpu = sum(gpu_seconds(x) for x in tasks)
    want_j = sum(x["energy_j"] for x in tasks)
    ok = (t["tasks"] == len(tasks) and t["gpu_hours"] * 3600 == pytest.approx(want_gpu, rel=0.01)
          and t["energy_kwh"] * 3.6e6 == pytest.approx(want_j, rel=0.01))
    return d if ok else None


def node_ready(c: Cluster) -> bool:
    res = c.ctl("-o", "json", "nodes")
    return res.returncode == 0 and any(n["state"] == "ready" for n in json.loads(res.stdout)["nodes"])


def counters(c: Cluster, name: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{c.metrics_address(name)}/metrics", timeout=5) as resp:
        fams = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
    out = {}
    for family in ("gptrm_queue_gpu_seconds", "gptrm_queue_energy_joules"):
        for s in fams[family].samples if family in fams else ():
            if s.name.endswith("_total"):
                out[f"{family}:{s.labels['queue']}"] = s.value
    return out


class TestUsage:
    def test_usage_matches_the_tasks_and_survives_a_leader_change(self, cluster: Cluster) -> None:
        """Two tasks (1 and 2 simulated GPUs) end on leader c1: `usage -o json` has their GPU-seconds and
        energy within 1 % under the default queue, with the H100 price; CSV says the same. c1 stops, c2 leads
        and runs a third task: the report covers all three, each once."""
        prices = ("--usage-interval", "1", "--price-gpu-hour", "H100=2.5", "--price-kwh", "0.2")
        cluster.start_coordinator("c1", *prices)
        cluster.wait_leader("c1")
        cluster.start_coordinator("c2", *prices)
        cluster.start_agent("n1")
        wait_until(lambda: node_ready(cluster), 30, 0.2, "node")
        tasks = run_tasks(cluster, 1, 2)
        assert all(t["state"] == "succeeded" and t["energy_j"] > 0 for t in tasks), tasks
        d = wait_until(lambda: matches(cluster, tasks), 30, 0.5, "usage to match the tasks")
        validate(d, "usage")
        assert [r["key"] for r in d["rows"]] == ["default"]
        row = d["rows"][0]
        (model, hours), = row["gpu_hours_by_model"].items()
        assert "H100" in model and hours == pytest.approx(row["gpu_hours"])
        assert row["cost"] == pytest.approx(row["gpu_hours"] * 2.5 + row["energy_kwh"] * 0.2)
        assert d["prices"] == {"gpu_hour": {"H100": 2.5}, "kwh": 0.2}
        assert [r["key"] for r in cluster.ctl_json("usage", "--since", "1h", "--by", "model")["rows"]] == [model]
        res = cluster.ctl("-o", "csv", "usage", "--since", "1h")
        assert res.returncode == 0, res.stderr
        lines = list(csv.reader(io.StringIO(res.stdout)))
        assert lines[0][0] == "key" and lines[1][0] == "default" and float(lines[1][1]) == pytest.approx(
            row["gpu_hours"], rel=1e-6)
        table = cluster.ctl("usage", "--since", "1h")
        assert table.returncode == 0 and "TOTAL" in table.stdout, table.stderr
        metrics = wait_until(lambda: (m := counters(cluster, "c1")).get("gptrm_queue_gpu_seconds:default", 0)
                             >= 0.99 * sum(gpu_seconds(t) for t in tasks) and m, 30, 0.5, "queue counters")
        assert metrics["gptrm_queue_energy_joules:default"] > 0

        cluster.proc("c1").stop()
        cluster.wait_leader("c2")
        wait_until(lambda: node_ready(cluster), 30, 0.2, "node on c2")
        tasks += run_tasks(cluster, 1)
        wait_until(lambda: matches(cluster, tasks), 30, 0.5, "usage after the leader change")

    def test_a_preempted_tasks_hours_go_to_the_gpu_model_that_ran_them(self, cluster: Cluster) -> None:
        """A 4-GPU priority-0 task runs, is preempted by a 4-GPU priority-10 task and waits in the queue with no
        allocation: the hours it ran are accounted to the node's H100s, none to ``unknown``."""
        cluster.start_coordinator("c1", "--usage-interval", "1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        wait_until(lambda: node_ready(cluster), 30, 0.2, "node")
        low = cluster.submit("--name", "low", "--priority", "0", "--gpus", "4", "--gpu-mem-gib", "10", "--cpu", "1",
                             "--stop-grace-s", "1", "--", "sleep", "600")
        wait_until(lambda: cluster.task_in(low, "running"), 30, 0.2, "low running")
        high = cluster.submit("--name", "high", "--priority", "10", "--gpus", "4", "--gpu-mem-gib", "10", "--cpu",
                              "1", "--", "sleep", "600")
        wait_until(lambda: cluster.task_in(high, "running"), 30, 0.2, "high running")
        requeued = wait_until(lambda: (t := cluster.task(low))["state"] == "pending" and "preempted" in
                              [h["state"] for h in t["history"]] and t, 30, 0.2, "low preempted and pending")
        assert not requeued["allocation"]
        ran = requeued["history"][-1]["time_unix_s"]

        def by_model() -> dict[str, float] | None:
            d = cluster.ctl_json("usage", "--since", "1h", "--by", "model")
            return {r["key"]: r["gpu_hours"] for r in d["rows"]} if d["accounted_until_unix_s"] > ran + 1 else None

        rows = wait_until(by_model, 30, 0.5, "the usage accounted past low's preemption")
        assert "unknown" not in rows and any("H100" in m for m in rows), rows
        assert sum(rows.values()) * 3600 >= gpu_seconds({**requeued, "allocation": [{"gpu_indices": [0, 1, 2, 3],
                                                                                   "gpu_share": 1.0}]}) * 0.99
        for tid in (low, high):
            cluster.ctl("cancel", tid)
