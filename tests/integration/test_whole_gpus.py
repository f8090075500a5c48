"""Whole GPUs with every default (no threshold flag anywhere): a node's GPUs can all be reserved, and a task
no known node could hold is refused at submit. Real etcd, coordinator and agent processes, simulated GPUs."""

from __future__ import annotations

import json

from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until

_SMALL = ("--gpu-mem-gib", "10", "--cpu", "0.1", "--mem-gib", "1")


def _start(cluster: Cluster, *gpus: str) -> None:
    """A coordinator with its defaults and one agent per ``gpus`` entry (``n1``, ``n2``, …)."""
    cluster.start_coordinator("c1")
    cluster.wait_leader("c1")
    for k, spec in enumerate(gpus, start=1):
        cluster.start_agent(f"n{k}", "--simulate-gpus", spec, *ROOT_TASKS_AGENT)
    wait_until(lambda: len(json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"]) == len(gpus),
               what="nodes registered")


def _submit(cluster: Cluster, *args: str) -> str:
    return cluster.submit(*ROOT_TASKS_SUBMIT, *args)


def _running(cluster: Cluster, task_id: str) -> dict:
    return wait_until(lambda: (t := cluster.task(task_id))["state"] == "running" and t, what=f"{task_id} running")


class TestWholeGpusByDefault:
    def test_full_node_task_runs_on_an_idle_node(self, cluster: Cluster) -> None:
        """An 8-GPU task runs on an idle 8-GPU node and holds all eight GPUs."""
        _start(cluster, "8xH100-80GB")
        task = _submit(cluster, "--name", "full", "--gpus", "8", *_SMALL, "--", "sleep", "300")
        t = _running(cluster, task)
        [alloc] = t["allocation"]
        assert alloc["node_id"] == "n1" and sorted(alloc["gpu_indices"]) == list(range(8))

    def test_two_one_gpu_tasks_side_by_side_on_a_two_gpu_node(self, cluster: Cluster) -> None:
        """A 2-GPU node runs two 1-GPU tasks at once, on different GPUs."""
        _start(cluster, "2xH100-80GB")
        tasks = [_submit(cluster, "--name", f"one-{k}", "--gpus", "1", *_SMALL, "--", "sleep", "300") for k in (0, 1)]
        held = [_running(cluster, t)["allocation"][0]["gpu_indices"] for t in tasks]
        assert sorted(i for gpus in held for i in gpus) == [0, 1]

    def test_policy_and_status_say_which_rule_is_in_force(self, cluster: Cluster) -> None:
        """policy get and status (json and human) name the threshold mode; policy set changes it and keeps it."""
        _start(cluster, "2xH100-80GB")
        policy = json.loads(cluster.ctl("-o", "json", "policy", "get").stdout)
        assert policy["threshold"] == 0.9 and policy["threshold_mode"] == "whole-gpus"
        status = json.loads(cluster.ctl("-o", "json", "status").stdout)
        assert status["policy"]["threshold_mode"] == "whole-gpus"
        assert "whole-gpus" in cluster.ctl("status").stdout
        res = cluster.ctl("policy", "set", "max-utilization", "--threshold-mode", "paper")
        assert res.returncode == 0 and "paper" in res.stdout, res.stderr
        policy = json.loads(cluster.ctl("-o", "json", "policy", "set", "first-fit").stdout)
        assert policy == {"name": "first-fit", "threshold": 0.9, "threshold_mode": "paper"}
        assert "paper" in cluster.ctl("policy", "get").stdout
        assert cluster.ctl("policy", "set", "first-fit", "--threshold-mode", "strict").returncode == 2


class TestRefusedAtTheDoor:
    def test_more_gpus_than_any_node_is_refused_with_the_reason(self, cluster: Cluster) -> None:
        """16 GPUs per node on 8- and 2-GPU nodes: exit 1, naming the largest node and its GPU count; nothing
        is queued. With --queue-unplaceable it is queued and waits."""
        _start(cluster, "2xH100-80GB", "8xH100-80GB")
        res = cluster.ctl("submit", *ROOT_TASKS_SUBMIT, "--name", "huge", "--gpus", "16", *_SMALL, "--", "true")
        assert res.returncode == 1, res.stdout
        assert "16 GPUs per node requested; the largest node, n2, has 8" in res.stderr, res.stderr
        assert "requested node configuration is not available" in res.stderr
        assert json.loads(cluster.ctl("-o", "json", "tasks").stdout)["tasks"] == []
        queued = _submit(cluster, "--queue-unplaceable", "--name", "huge", "--gpus", "16", *_SMALL, "--", "true")
        assert cluster.task(queued)["state"] == "pending"

    def test_gang_needs_enough_nodes(self, cluster: Cluster) -> None:
        """A 3-node gang of 2 GPUs each on two nodes is refused; a 2-node gang is accepted and runs."""
        _start(cluster, "2xH100-80GB", "2xH100-80GB")
        res = cluster.ctl("submit", *ROOT_TASKS_SUBMIT, "--name", "gang", "--gpus", "2", "--nodes", "3", *_SMALL,
                          "--", "true")
        assert res.returncode == 1 and "a gang of 3 nodes requested; only 2 of the 2 known nodes" in res.stderr, \
            res.stderr
        gang = _submit(cluster, "--name", "gang", "--gpus", "2", "--nodes", "2", *_SMALL, "--", "sleep", "300")
        assert {a["node_id"] for a in _running(cluster, gang)["allocation"]} == {"n1", "n2"}

    def test_cordoned_node_still_counts(self, cluster: Cluster) -> None:
        """A cordoned node could take the task once uncordoned: the task is queued, not refused."""
        _start(cluster, "8xH100-80GB")
        assert cluster.ctl("cordon", "n1").returncode == 0
        task = _submit(cluster, "--name", "later", "--gpus", "8", *_SMALL, "--", "sleep", "300")
        assert cluster.task(task)["state"] == "pending"
        assert cluster.ctl("uncordon", "n1").returncode == 0
        _running(cluster, task)

    def test_paper_mode_refuses_a_full_node_task(self, cluster: Cluster) -> None:
        """Under the paper's rule (threshold 0.9 on the GPU count too) an 8-GPU task never fits an 8-GPU node:
        refused at submit with the filter's reason."""
        _start(cluster, "8xH100-80GB")
        assert cluster.ctl("policy", "set", "max-utilization", "--threshold-mode", "paper").returncode == 0
        res = cluster.ctl("submit", *ROOT_TASKS_SUBMIT, "--name", "full", "--gpus", "8", *_SMALL, "--", "true")
        assert res.returncode == 1, res.stdout
        assert "the largest node, n1" in res.stderr and "gpus over threshold 0.9" in res.stderr, res.stderr
