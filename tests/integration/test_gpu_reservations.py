"""Reservations end to end: real coordinators, agent and task processes on a simulated 2-GPU node."""

from __future__ import annotations

import json

from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until


def _task(cluster: Cluster, queue: str, name: str) -> str:
    return cluster.submit(*ROOT_TASKS_SUBMIT, "--queue", queue, "--name", name, "--gpus", "1", "--gpu-mem-gib", "10",
                          "--cpu", "0.1", "--", "sh", "-c", "while true; do sleep 0.2; done")


class TestReservations:
    def test_a_reservation_keeps_its_gpus_from_another_queue_and_hands_them_to_its_own_at_the_start(
            self, cluster: Cluster) -> None:
        """A reservation of one GPU for team-a, starting a few seconds ahead, survives a leader change; team-b's
        second task, which could otherwise borrow team-a's idle GPU, never lands on it; team-a's task, submitted
        before the start, runs on the kept GPU from the start."""
        flags = ("--task-grace", "3")
        cluster.start_coordinator("c1", *flags)
        cluster.wait_leader("c1")
        cluster.start_coordinator("c2", *flags)
        cluster.start_agent("n1", "--simulate-gpus", "2xH100-80GB", *ROOT_TASKS_AGENT)
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
        for queue in ("team-a", "team-b"):
            cluster.ctl_json("queues", "set", queue, "--gpus", "1", "--members", "*")
        refused = cluster.ctl("reservations", "create", "big", "--gpus", "3", "--start", "now", "--duration", "1h",
                              "--queue", "team-a")
        assert refused.returncode != 0 and "gpus" in refused.stderr and "only 2 known GPUs" in refused.stderr
        created = cluster.ctl_json("reservations", "create", "demo", "--gpus", "1", "--start", "+12s",
                                   "--duration", "1h", "--queue", "team-a")
        assert created["state"] == "upcoming" and created["queue"] == "team-a"
        [(node, [kept])] = [(h["node_id"], h["gpu_indices"]) for h in created["held"]]
        cluster.proc("c1").kill()   # the reservation is in etcd: the next leader keeps it
        cluster.wait_leader("c2")
        c2 = cluster.address("c2")
        b1 = _task(cluster, "team-b", "b1")
        wait_until(lambda: cluster.task(b1, c2)["state"] == "running", what="b1 running")
        assert cluster.task(b1, c2)["allocation"][0]["gpu_indices"] != [kept]
        b2 = _task(cluster, "team-b", "b2")
        a1 = _task(cluster, "team-a", "a1")
        t = wait_until(lambda: (t := cluster.task(a1, c2))["state"] == "running" and t, what="a1 running")
        assert t["allocation"][0]["node_id"] == node and t["allocation"][0]["gpu_indices"] == [kept]
        started = next(h["time_unix_s"] for h in t["history"] if h["state"] == "running")
        assert started >= created["start_unix_s"]
        other = cluster.task(b2, c2)
        assert other["state"] == "pending" and "running" not in [h["state"] for h in other["history"]]
        listed = cluster.ctl_json("reservations", coordinator=c2)["reservations"]
        assert [(r["name"], r["state"], r["used_gpus"]) for r in listed] == [("demo", "active", 1)]
        assert "DEMO" in cluster.ctl("reservations", coordinator=c2).stdout.upper()
        removed = cluster.ctl_json("reservations", "rm", "demo", coordinator=c2)
        assert removed["name"] == "demo"
        # Without it, team-b's waiting task may borrow again (team-a's idle quota: none idle now, so it waits
        # for a GPU) and the list is empty.
        assert cluster.ctl_json("reservations", coordinator=c2)["reservations"] == []
