"""Multi-node tasks end to end: real etcd, coordinators and agents (4 simulated GPUs each, advertising
127.0.0.1), parts that find each other through MASTER_ADDR/MASTER_PORT, and parts that live and die together."""

from __future__ import annotations

import json
import signal
import socket
import sys
from pathlib import Path

import psutil

from tests.helpers.ports import free_port
from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until

# Until the coordinator's default threshold lets a part take a whole node, the tests allow it.
_COORD = ("--threshold", "1.0")
_GANG = ("--nodes", "2", "--gpus", "4", "--gpu-mem-gib", "10", "--cpu", "0.1")

# Rank 0 accepts on the socket its agent listens on MASTER_PORT with and hands it (GPTRM_MASTER_LISTEN_FD);
# every other rank connects and sends its rank; rank 0 adds them
# to its own and sends the sum back; every part prints it with what its environment says.
_MEET = r'''
import os, socket, time
rank, nnodes = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    # The port is rank 0's from the start: its agent listens on it and hands the socket over.
    srv = socket.socket(fileno=int(os.environ["GPTRM_MASTER_LISTEN_FD"]))
    assert srv.getsockname()[1] == port
    peers = [srv.accept()[0] for _ in range(nnodes - 1)]
    total = rank + sum(int(c.makefile().readline()) for c in peers)
    for c in peers:
        c.sendall(f"{total}\n".encode())
else:
    end = time.monotonic() + 60
    while True:
        try:
            c = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)
    c.sendall(f"{rank}\n".encode())
    total = int(c.makefile().readline())
print(f"rank={rank} nnodes={nnodes} world={os.environ['WORLD_SIZE']} local={os.environ['LOCAL_WORLD_SIZE']} "
      f"ids={os.environ['GPTRM_NODE_IDS']} nodelist={os.environ['GPTRM_NODELIST']} sum={total}", flush=True)
'''


def _two_nodes(c: Cluster, *agent_args: str, leader: str = "c1") -> None:
    """Agents n1 and n2 on this host, ready."""
    c.start_agents(["n1", "n2"], *agent_args, leader=leader)


def _task_processes(task_id: str, name: str) -> dict[str, int]:
    """NODE_RANK → how many processes called ``name`` run for the task (read from their environment)."""
    out: dict[str, int] = {}
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] != name:
                continue
            env = p.environ()
        except psutil.Error:
            continue
        if env.get("GPTRM_TASK_ID") == task_id:
            out[env.get("NODE_RANK", "?")] = out.get(env.get("NODE_RANK", "?"), 0) + 1
    return out


class TestDistributedLaunch:
    def test_parts_meet_over_tcp(self, cluster: Cluster, tmp_path: Path) -> None:
        """Both parts of a 2×4-GPU task find each other at MASTER_ADDR:MASTER_PORT and print the sum of ranks;
        logs --rank 1 shows part 1's output; tasks TASK shows each part; nodes NODE shows the address."""
        cluster.start_coordinator("c1", *_COORD)
        cluster.wait_leader("c1")
        port = free_port()
        _two_nodes(cluster, *ROOT_TASKS_AGENT, "--task-port-range", f"{port}-{port + 10}")
        script = tmp_path / "meet.py"
        script.write_text(_MEET)
        tid = cluster.submit(*_GANG, *ROOT_TASKS_SUBMIT, "--", sys.executable, str(script))
        t = wait_until(lambda: cluster.task_in(tid, "succeeded", "failed", "cancelled"), what="the gang to end")
        assert t["state"] == "succeeded", t
        ranks = {p["rank"]: p for p in t["parts"]}
        assert sorted(ranks) == [0, 1] and {p["state"] for p in t["parts"]} == {"succeeded"}
        assert all(p["exit_code"] == 0 for p in t["parts"])
        ids = f"{ranks[0]['node_id']},{ranks[1]['node_id']}"
        assert [a["node_id"] for a in t["allocation"]] == ids.split(",")
        assert [a["address"] for a in t["allocation"]] == ["127.0.0.1", "127.0.0.1"]
        assert port <= t["master_port"] <= port + 10
        for rank in (0, 1):
            args = ("logs", tid) if rank == 0 else ("logs", tid, "--rank", "1")
            res = cluster.ctl(*args)
            assert res.returncode == 0, res.stderr
            assert (f"rank={rank} nnodes=2 world=8 local=4 ids={ids} nodelist=127.0.0.1,127.0.0.1 sum=1"
                    in res.stdout), res.stdout
        res = cluster.ctl("logs", tid, "--rank", "2")
        assert res.returncode != 0 and "rank 2" in res.stderr
        shown = cluster.ctl("tasks", tid).stdout
        assert "RANK" in shown and ranks[1]["node_id"] in shown and "succeeded" in shown
        node = json.loads(cluster.ctl("-o", "json", "nodes", "n1").stdout)
        assert (node["advertise_address"], node["task_port_min"], node["task_port_max"]) == \
            ("127.0.0.1", port, port + 10)
        assert f"address       127.0.0.1, task ports {port}-{port + 10}" in cluster.ctl("nodes", "n1").stdout

    def test_torchrun_launcher(self, cluster: Cluster, tmp_path: Path) -> None:
        """--launcher torchrun runs the argv under torchrun (a stand-in on the task's PATH) with each part's values."""
        cluster.start_coordinator("c1", *_COORD)
        cluster.wait_leader("c1")
        _two_nodes(cluster, *ROOT_TASKS_AGENT)
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "torchrun").write_text('#!/bin/sh\necho "torchrun $*"\n')
        (bindir / "torchrun").chmod(0o755)
        tid = cluster.submit(*_GANG, *ROOT_TASKS_SUBMIT, "--launcher", "torchrun",
                      "--env", f"PATH={bindir}:/usr/bin:/bin", "--", "train.py", "--lr", "0.1")
        t = wait_until(lambda: cluster.task_in(tid, "succeeded", "failed"), what="the gang to end")
        assert t["state"] == "succeeded", t
        assert t["spec"]["launcher"] == "torchrun"
        port = t["master_port"]
        for rank in (0, 1):
            out = cluster.ctl("logs", tid, "--rank", str(rank)).stdout
            assert (f"torchrun --nnodes 2 --node-rank {rank} --nproc-per-node 4 --master-addr 127.0.0.1 "
                    f"--master-port {port} -- train.py --lr 0.1") in out, out

    def test_a_missing_launcher_fails_each_rank_with_its_own_reason(self, cluster: Cluster) -> None:
        """torchrun is on no agent's task PATH: every rank exits 127 by itself and is shown failed with that
        reason, not "cancelled, stopped by the coordinator", and the task's reason names what was missing."""
        cluster.start_coordinator("c1", *_COORD)
        cluster.wait_leader("c1")
        _two_nodes(cluster, *ROOT_TASKS_AGENT)
        tid = cluster.submit(*_GANG, *ROOT_TASKS_SUBMIT, "--launcher", "torchrun", "--", "train.py")
        t = wait_until(lambda: (t := cluster.task(tid))["state"] == "failed"
                       and all(p["state"] in ("failed", "cancelled") for p in t["parts"]) and t,
                       what="the gang to fail")
        assert "torchrun: not found on the task's PATH" in t["reason"], t["reason"]
        # A rank whose launcher was missing is failed with its own reason, never shown as stopped (one the stop
        # reached before its launcher was even looked up, on a loaded machine, is rightly cancelled).
        missing = [p for p in t["parts"] if p.get("exit_code") == 127]
        assert missing, t["parts"]
        for part in missing:
            assert part["state"] == "failed", t["parts"]
            assert "torchrun: not found on the task's PATH" in part["reason"] and "--task-path" in part["reason"]


class TestLiveAndDieTogether:
    def test_a_failed_part_stops_the_other_and_the_task_fails_once(self, cluster: Cluster) -> None:
        """Rank 1 exits 1: rank 0 (still running) is stopped, the task ends FAILED once, with rank 1's exit code."""
        cluster.start_coordinator("c1", *_COORD)
        cluster.wait_leader("c1")
        _two_nodes(cluster)
        tid = cluster.submit(*_GANG, "--stop-grace-s", "2", "--",
                      "sh", "-c", 'if [ "$NODE_RANK" = 1 ]; then echo rank 1 gives up; exit 1; fi; exec sleep 300')
        t = wait_until(lambda: cluster.task_in(tid, "failed", "succeeded", "cancelled"), what="the gang to end")
        assert t["state"] == "failed", t
        ranks = {p["rank"]: p for p in t["parts"]}
        assert (ranks[1]["state"], ranks[1]["exit_code"]) == ("failed", 1)
        assert ranks[0]["state"] == "cancelled"   # stopped by the coordinator
        # Ended once; a start an agent refused for want of room (FAILED, then PENDING again) is not an end.
        ends = [h for h in t["history"] if h["state"] == "failed" and " refused: " not in h["reason"]]
        assert len(ends) == 1 and t["history"][-1]["state"] == "failed", t["history"]
        assert t["exit_code"] == 1 and "rank 1" in t["reason"] and "rank 1 gives up" in t["log_tail"]
        assert _task_processes(tid, "sleep") == {}
        for pid in t["pids"]:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        nodes = json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"]
        assert all(tid not in n["task_ids"] for n in nodes)   # its GPUs are free again
        shown = cluster.ctl("tasks", tid).stdout
        assert "failed" in shown and "cancelled" in shown

    def test_a_taken_master_port_makes_the_gang_wait_not_fail(self, cluster: Cluster) -> None:
        """Something else listens on the only port of both nodes' range: the gang is not failed but waits pending,
        its reason naming the master port (refused by rank 0's agent and placed again, or never placed on a node
        whose agent reports no free port); no part is left running, and it is not counted as restarted. Once the
        port is free, the gang runs."""
        cluster.start_coordinator("c1", *_COORD)
        cluster.wait_leader("c1")
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            _two_nodes(cluster, "--task-port-range", f"{port}-{port}")
            tid = cluster.submit(*_GANG, "--stop-grace-s", "2", "--", "sh", "-c", "exec sleep 300")
            t = wait_until(lambda: (t := cluster.task(tid))["state"] == "pending" and "master port" in t["reason"]
                           and t, what="the gang waiting for its master port")
            assert t["restarts"] == 0, t
            wait_until(lambda: _task_processes(tid, "sleep") == {}, what="no part of it left running")
        finally:
            taken.close()
        wait_until(lambda: cluster.task_in(tid, "running"), 60.0, what="the gang to run once the port is free")
        assert cluster.task(tid)["restarts"] == 0
        cluster.ctl("cancel", tid)
        wait_until(lambda: cluster.task_in(tid, "cancelled"), what="the gang cancelled")

    def test_leader_killed_while_the_gang_starts_runs_each_part_once(self, cluster: Cluster) -> None:
        """kill -9 of the leader right after it placed a gang: the other coordinator leads and each part runs
        exactly once (the re-sent starts are the same decisions)."""
        names = ["c1", "c2"]
        for n in names:
            cluster.start_coordinator(n, *_COORD, "--task-grace", "5")
        leader = wait_until(lambda: next((n for n in names if cluster.status(n).is_leader), None), what="a leader")
        _two_nodes(cluster, leader=leader)
        tid = cluster.submit(*_GANG, "--", "sh", "-c", "exec sleep 300")
        wait_until(lambda: cluster.task(tid)["state"] != "pending", 30, 0.02, "the gang placed")
        cluster.proc(leader).signal(signal.SIGKILL)
        survivor = next(n for n in names if n != leader)
        cluster.wait_leader(survivor)
        t = wait_until(lambda: (d := cluster.task_in(tid, "running", "failed")) and
                       (d["state"] == "failed" or all(p["state"] == "running" for p in d["parts"])) and d,
                       what="both parts running under the new leader")
        assert t["state"] == "running", t
        assert wait_until(lambda: _task_processes(tid, "sleep") == {"0": 1, "1": 1} or None,
                          what="one process per part")
        # Every agent reported since the new leader took over (each registered with it): still one each.
        wait_until(lambda: cluster.ready_nodes(survivor) == 2, what="nodes ready under the new leader")
        assert _task_processes(tid, "sleep") == {"0": 1, "1": 1}
        assert [h["state"] for h in cluster.task(tid)["history"]].count("running") == 1
        res = cluster.ctl("cancel", tid)
        assert res.returncode == 0, res.stderr
        wait_until(lambda: cluster.task_in(tid, "cancelled"), what="the gang cancelled")
        assert _task_processes(tid, "sleep") == {}

