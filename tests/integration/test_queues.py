"""Team queues end to end: real coordinator, agent and task processes; quotas, borrowing, reclaim, access.

Queues ``a`` and ``b``, 4 GPUs of quota each on one 8-GPU node, both lending all of it: ``b`` fills
the node (4 of its own, 4 borrowed from ``a``), then ``a`` submits four tasks and takes its quota
back: four of ``b``'s newest tasks get their checkpoint signal and wait, ``a``'s four run, and ``a``
never holds more than its quota.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from common.pb.gptrm.v1 import types_pb2
from coordinator.tokens import new_token, token_line
from tests.helpers.ctl_schema import validate
from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, assert_gpus_held_once, wait_until

QUEUES = """
half_life_h = 1
[[queue]]
name = "a"
gpus = { "*" = 4 }
members = ["*"]
default_for = ["alice"]
[[queue]]
name = "b"
gpus = { "*" = 4 }
members = ["*"]
default_for = ["*"]
"""


def _queues_file(tmp_path: Path) -> Path:
    path = tmp_path / "queues.toml"
    path.write_text(QUEUES)
    return path


def _loop_task(c: Cluster, queue: str, name: str, marker: Path, *ctl: str) -> str:
    """A preemptible one-GPU task in ``queue`` that appends to ``marker`` and exits on SIGUSR1."""
    res = c.ctl(*ctl, "-o", "json", "submit", *ROOT_TASKS_SUBMIT, "--queue", queue, "--name", name, "--gpus", "1",
                "--gpu-mem-gib", "10", "--cpu", "0.1", "--stop-grace-s", "2", "--",
                "sh", "-c", f"trap 'echo checkpoint >> {marker}; exit 0' USR1; while true; do sleep 0.1; done")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["task_id"]


def _queue_views(c: Cluster) -> dict[str, dict[str, Any]] | None:
    res = c.ctl("-o", "json", "queues")
    if res.returncode != 0:   # no leader for a moment
        return None
    d = json.loads(res.stdout)
    validate(d, "queues")
    return {q["name"]: q for q in d["queues"]}


def _states(c: Cluster, ids: list[str]) -> list[str]:
    return [c.task(t)["state"] for t in ids]


def _held(view: dict[str, Any]) -> tuple[int, int]:
    return sum(h["own"] for h in view["held"]), sum(h["borrowed"] for h in view["held"])


def _b_fills_the_node(c: Cluster, tmp_path: Path) -> tuple[list[str], list[Path]]:
    c.start_agent("n1", "--simulate-gpus", "8xH100-80GB", *ROOT_TASKS_AGENT)
    wait_until(lambda: any(n["state"] == "ready" for n in c.ctl_json("nodes")["nodes"]), what="node ready")
    markers = [tmp_path / f"b{i}.ckpt" for i in range(8)]
    b_ids = [_loop_task(c, "b", f"b{i}", m) for i, m in enumerate(markers)]
    wait_until(lambda: _states(c, b_ids).count("running") == 8, timeout_s=30, what="b's eight tasks running")
    views = wait_until(lambda: _queue_views(c), what="queues")
    assert _held(views["b"]) == (4, 4) and _held(views["a"]) == (0, 0)
    assert sorted(c.task(t)["borrowed_gpus"] for t in b_ids) == [0] * 4 + [1] * 4
    return b_ids, markers


def _a_takes_its_quota_back(c: Cluster, tmp_path: Path, b_ids: list[str], markers: list[Path],
                            during: Any = None) -> list[str]:
    a_ids = [_loop_task(c, "a", f"a{i}", tmp_path / f"a{i}.ckpt") for i in range(4)]
    if during is not None:
        during()
    most_a = 0

    def settled() -> bool:
        nonlocal most_a
        views = _queue_views(c)
        if views is None:
            return False
        own, borrowed = _held(views["a"])
        assert borrowed == 0, views["a"]          # a never borrows while b does
        most_a = max(most_a, own)
        return _states(c, a_ids).count("running") == 4 and \
            sorted(_states(c, b_ids)) == ["pending"] * 4 + ["running"] * 4
    wait_until(settled, timeout_s=15, interval_s=0.2, what="a's four running, four of b's waiting")
    assert most_a <= 4
    signalled = [t for t, m in zip(b_ids, markers, strict=True) if m.exists()]
    assert len(signalled) == 4 and all(c.task(t)["state"] == "pending" for t in signalled)
    for t in signalled:
        task = c.task(t)
        assert [h["state"] for h in task["history"]][-2:] == ["preempted", "pending"]
        assert "reclaimed by queue a" in task["history"][-2]["reason"]
        assert "Queue b would hold 5 GPUs with this task, more than its quota of 4" in task["reason"]   # it waits
    assert all(c.task(t)["queue"] == "a" and c.task(t)["borrowed_gpus"] == 0 for t in a_ids)
    return a_ids


def _all_tasks(c: Cluster) -> list[types_pb2.Task]:
    out = []
    for t in c.ctl_json("tasks")["tasks"]:
        task = types_pb2.Task(id=t["task_id"], state=types_pb2.TaskState.Value("TASK_STATE_" + t["state"].upper()
                                                                                 .replace("-", "_")))
        for na in t["allocation"]:
            task.allocation.nodes.add(node_id=na["node_id"], gpu_indices=na["gpu_indices"])
        out.append(task)
    return out



def _queues_with_a_tiny_budget(tmp_path: Path) -> Path:
    """QUEUES with queue a held past 0.001 GPU-hours a day (3.6 GPU-seconds), as a --queues file."""
    path = tmp_path / "queues.toml"
    path.write_text(QUEUES.replace('default_for = ["alice"]',
                                   'default_for = ["alice"]\nbudget = { kind = "gpu_hours", amount = 0.001, '
                                   'period = "day", action = "hold" }'))
    return path

class TestQueues:
    @pytest.mark.slow
    def test_a_queue_reclaims_its_lent_quota(self, cluster: Cluster, tmp_path: Path) -> None:
        cluster.start_coordinator("c1", "--queues", str(_queues_file(tmp_path)))
        cluster.wait_leader("c1")
        b_ids, markers = _b_fills_the_node(cluster, tmp_path)
        a_ids = _a_takes_its_quota_back(cluster, tmp_path, b_ids, markers)
        tasks = _all_tasks(cluster)
        assert len(tasks) == 12
        assert_gpus_held_once(tasks)
        views = _queue_views(cluster)
        assert views is not None and _held(views["a"]) == (4, 0) and _held(views["b"]) == (4, 0)
        assert views["b"]["pending"] == 4 and views["a"]["running"] == 4
        events = cluster.ctl("-o", "json", "events").stdout
        assert "reclaims its quota" in events and a_ids
        with urllib.request.urlopen(f"http://{cluster.metrics_address('c1')}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for series, value in (('gptrm_queue_gpus{kind="own",queue="a"}', 4.0),
                              ('gptrm_queue_gpus{kind="borrowed",queue="b"}', 0.0),
                              ('gptrm_queue_tasks{queue="b",state="pending"}', 4.0)):
            assert f"{series} {value}" in text, series

    @pytest.mark.slow
    def test_reclaim_survives_the_leader_killed(self, cluster: Cluster, tmp_path: Path) -> None:
        queues = str(_queues_file(tmp_path))
        cluster.start_coordinator("c1", "--queues", queues, "--usage-interval", "1")
        cluster.wait_leader("c1")
        cluster.start_coordinator("c2", "--queues", queues, "--usage-interval", "1")
        b_ids, markers = _b_fills_the_node(cluster, tmp_path)

        def kill_during_reclaim() -> None:
            wait_until(lambda: any(m.exists() for m in markers), timeout_s=10, interval_s=0.01,
                       what="the reclaim under way (a checkpoint signal)")
            cluster.proc("c1").kill()
            cluster.wait_leader("c2", timeout_s=30)

        _a_takes_its_quota_back(cluster, tmp_path, b_ids, markers, during=kill_during_reclaim)
        tasks = _all_tasks(cluster)
        assert len(tasks) == 12
        assert_gpus_held_once(tasks)

        def usage_of_both() -> dict[str, Any] | None:
            res = cluster.ctl("-o", "json", "usage", "--since", "1h")
            rows = {r["key"]: r for r in json.loads(res.stdout)["rows"]} if res.returncode == 0 else {}
            return rows if rows.get("a", {}).get("gpu_hours", 0) > 0 and rows.get("b", {}).get("gpu_hours", 0) > 0 \
                else None
        wait_until(usage_of_both, timeout_s=30, interval_s=0.5, what="usage of both queues")

    def test_a_caller_without_access_is_refused_and_audited(self, cluster: Cluster, tmp_path: Path) -> None:
        toks = {"alice": new_token(), "bob": new_token()}
        tokens = tmp_path / "tokens"
        tokens.write_text(token_line("alice", "admin", toks["alice"], queues=("a",)) + "\n"
                          + token_line("bob", "admin", toks["bob"], queues=("b",)) + "\n")
        audit = tmp_path / "audit.log"
        cluster.start_coordinator("c1", "--queues", str(_queues_file(tmp_path)), "--admin-tokens", str(tokens),
                                  "--audit-log", str(audit))
        wait_until(lambda: cluster.ctl("--token", toks["alice"], "status").returncode == 0, what="c1 up")
        cluster.start_agent("n1", *ROOT_TASKS_AGENT)
        res = cluster.ctl("--token", toks["bob"], "submit", *ROOT_TASKS_SUBMIT, "--queue", "a", "--gpus", "1",
                          "--", "true")
        assert res.returncode != 0 and "PERMISSION_DENIED" in res.stderr and "'bob' may submit to b" in res.stderr
        refused = [json.loads(line) for line in audit.read_text().splitlines()
                   if '"SubmitTask"' in line and '"refused"' in line]
        assert refused and refused[-1]["principal"] == "bob" and "queue 'a'" in refused[-1]["reason"]
        res = cluster.ctl("--token", toks["alice"], "-o", "json", "submit", *ROOT_TASKS_SUBMIT, "--gpus", "1",
                          "--", "true")
        assert res.returncode == 0, res.stderr
        res = cluster.ctl("--token", toks["alice"], "-o", "json", "tasks", json.loads(res.stdout)["task_id"])
        task = json.loads(res.stdout)
        assert task["queue"] == "a" and task["submitted_by"] == "alice"   # alice's default queue

    def test_a_queue_past_its_budget_gets_no_new_work_while_another_waits(self, cluster: Cluster,
                                                                          tmp_path: Path) -> None:
        """Queue a may use 0.001 GPU-hours a day (3.6 GPU-seconds) and holds new work past it: after one task of
        a ran 5 s on one GPU, a's next task waits with the budget as its reason while b's tasks run; the 80 % and
        100 % lines are events; `queues` shows the reading."""
        path = _queues_with_a_tiny_budget(tmp_path)
        cluster.start_coordinator("c1", "--queues", str(path), "--usage-interval", "1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1", *ROOT_TASKS_AGENT)
        wait_until(lambda: any(n["state"] == "ready" for n in cluster.ctl_json("nodes")["nodes"]), what="node ready")
        first = cluster.submit("--queue", "a", "--gpus", "1", "--gpu-mem-gib", "10", "--cpu", "0.1", "--", "sleep", "5")
        wait_until(lambda: cluster.task_in(first, "succeeded"), timeout_s=30, what="a's first task")
        views = wait_until(lambda: (v := _queue_views(cluster)) and v["a"]["budget_used"] >= 1.0 and v,
                           timeout_s=30, interval_s=0.5, what="a's budget reading past 100 %")
        assert views["a"]["budget_gate"] == "hold" and views["b"]["budget_gate"] == "run"
        b_ids = [cluster.submit("--queue", "b", "--gpus", "1", "--gpu-mem-gib", "10", "--cpu", "0.1", "--", "sleep",
                                "30") for _ in range(2)]
        held = cluster.submit("--queue", "a", "--gpus", "1", "--gpu-mem-gib", "10", "--cpu", "0.1", "--", "true")
        wait_until(lambda: all(cluster.task_in(t, "running") for t in b_ids), timeout_s=30, what="b's tasks running")
        wait_until(lambda: "past its budget" in cluster.task(held)["reason"], timeout_s=15, what="a's task held")
        assert cluster.task(held)["state"] == "pending"
        events = cluster.ctl("-o", "json", "events").stdout
        assert "queue a is at" in events and "queue a is past its gpu_hours budget" in events
        usage = cluster.ctl_json("usage", "--since", "1h")
        validate(usage, "usage")
        (budget,) = usage["budgets"]
        assert budget["queue"] == "a" and budget["fraction"] >= 1.0 and budget["gate"] == "hold"
        assert "budgets (current period)" in cluster.ctl("usage", "--since", "1h").stdout

    def test_budget_lines_are_announced_once_across_a_leader_change(self, cluster: Cluster, tmp_path: Path) -> None:
        """Queue a's budget (3.6 GPU-seconds a day) is crossed by one task: the leader announces 80 % and 100 % once
        each; after it stops, the new leader reads the same budget (and holds a's work) without announcing
        either again."""
        path = _queues_with_a_tiny_budget(tmp_path)
        cluster.start_coordinator("c1", "--queues", str(path), "--usage-interval", "1")
        cluster.wait_leader("c1")
        cluster.start_coordinator("c2", "--queues", str(path), "--usage-interval", "1")
        cluster.start_agent("n1", *ROOT_TASKS_AGENT)
        wait_until(lambda: any(n["state"] == "ready" for n in cluster.ctl_json("nodes")["nodes"]), what="node ready")
        first = cluster.submit("--queue", "a", "--gpus", "1", "--gpu-mem-gib", "10", "--cpu", "0.1", "--", "sleep", "5")
        wait_until(lambda: cluster.task_in(first, "succeeded"), timeout_s=30, what="a's first task")

        def announced(name: str) -> list[str]:
            res = cluster.ctl("-o", "json", "events", coordinator=cluster.address(name))
            assert res.returncode == 0, res.stderr
            return [e["message"] for e in map(json.loads, res.stdout.splitlines())
                    if e["kind"] == "queues" and "budget" in e["message"]]

        wait_until(lambda: len(announced("c1")) == 2 and (v := _queue_views(cluster)) and v["a"]["budget_used"] >= 1,
                   timeout_s=30, interval_s=0.5, what="c1 announcing a's 80 % and 100 % lines")
        cluster.proc("c1").stop()
        cluster.wait_leader("c2")
        views = wait_until(lambda: (v := _queue_views(cluster)) and v["a"]["budget_used"] >= 1.0 and v,
                           timeout_s=30, interval_s=0.5, what="c2's budget reading")
        assert views["a"]["budget_gate"] == "hold"
        accounted = cluster.ctl_json("usage", "--since", "1h")["accounted_until_unix_s"]
        wait_until(lambda: cluster.ctl_json("usage", "--since", "1h")["accounted_until_unix_s"] > accounted + 2,
                   timeout_s=30, interval_s=0.5, what="c2's next usage passes")
        assert announced("c2") == []

    def test_queues_set_show_and_rm_from_gptrmctl(self, cluster: Cluster) -> None:
        """Without queues every task runs in `default`; `queues set` builds a tree (validated whole: a child
        may not exceed its parent's quota), `queues` shows it, `rm` is refused while the queue holds work."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        d = cluster.ctl_json("queues")
        validate(d, "queues")
        assert d["managed"] is False and [q["name"] for q in d["queues"]] == ["default"]
        for argv in (("org", "--gpus", "8"), ("t1", "--parent", "org", "--gpus", "6", "--limit", "8",
                                              "--members", "*", "--default-for", "*"),
                     ("t2", "--parent", "org", "--gpus", "2", "--lend", "0", "--weight", "2",
                      "--budget", "kwh:10/day:lowest")):
            res = cluster.ctl("-o", "json", "queues", "set", *argv)
            assert res.returncode == 0, res.stderr
        res = cluster.ctl("queues", "set", "t3", "--parent", "org", "--gpus", "4")
        assert res.returncode != 0 and "org" in res.stderr          # 6 + 2 + 4 > the parent's 8
        d = cluster.ctl_json("queues")
        validate(d, "queues")
        by_name = {q["name"]: q for q in d["queues"]}
        assert d["managed"] and [q["name"] for q in d["queues"]] == ["default", "org", "t1", "t2"]   # default kept
        assert by_name["t1"]["quotas"] == [{"gpu_model": "*", "gpus": 6, "limit": 8, "lend": None}]
        assert by_name["t2"]["budget"] == {"kind": "kwh", "amount": 10.0, "period": "day", "action": "lowest"}
        assert not by_name["org"]["leaf"] and by_name["t2"]["weight"] == 2.0
        res = cluster.ctl("queues", "set", "t1", "--gpus", "5")     # flags not given keep their value
        assert res.returncode == 0, res.stderr
        assert cluster.ctl_json("queues", "t1")["queues"][0]["quotas"][0] == {"gpu_model": "*", "gpus": 5, "limit": 8,
                                                                            "lend": None}
        task = cluster.submit("--gpus", "1", "--", "true")          # no node: it waits in its default queue
        assert cluster.task(task)["queue"] == "t1"
        res = cluster.ctl("queues", "rm", "t1")
        assert res.returncode != 0 and "unfinished" in res.stderr
        assert cluster.ctl("queues", "rm", "org").returncode != 0   # it has children
        assert cluster.ctl("cancel", task).returncode == 0
        wait_until(lambda: cluster.ctl("queues", "rm", "t1").returncode == 0, timeout_s=15, what="t1 removed")
        assert [q["name"] for q in cluster.ctl_json("queues")["queues"]] == ["default", "org", "t2"]
        assert "queue t1 removed" in cluster.ctl("-o", "json", "events").stdout
