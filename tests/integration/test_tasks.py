"""Tasks end to end: gptrmctl → coordinator → etcd → agent → a real process, and back."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.integration.harness import Cluster, wait_until


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _exited(pid: int) -> bool:
    """Whether the process is gone or a zombie (it ended; its parent has not reaped it yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _events(log: str) -> list[dict]:
    """The JSON log lines of a process's log."""
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


class TestTaskLifecycle:
    def test_success_failure_and_cuda_visible_devices(self, cluster: Cluster, tmp_path: Path) -> None:
        """A task runs with its GPUs' UUIDs in CUDA_VISIBLE_DEVICES and succeeds; a failing one shows code and tail."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
        ok = cluster.submit("--name", "ok", "--gpus", "2", "--gpu-mem-gib", "10", "--cpu", "0.1", "--",
                     "sh", "-c", 'echo "cvd=$CUDA_VISIBLE_DEVICES"')
        t = wait_until(lambda: cluster.task_in(ok, "succeeded", "failed"), what="ok to finish")
        assert t["state"] == "succeeded" and t["exit_code"] == 0
        uuids = t["log_tail"].split("cvd=", 1)[1].split()[0].split(",")
        assert len(uuids) == 2 and all(u.startswith("GPU-sim-n1-") for u in uuids)
        assert [a["node_id"] for a in t["allocation"]] == ["n1"]
        assert [h["state"] for h in t["history"]] == ["pending", "scheduled", "starting", "running", "succeeded"]
        bad = cluster.submit("--name", "bad", "--gpus", "1", "--gpu-mem-gib", "10", "--cpu", "0.1", "--",
                      "sh", "-c", "echo something went wrong >&2; exit 3")
        t = wait_until(lambda: cluster.task_in(bad, "succeeded", "failed"), what="bad to finish")
        assert t["state"] == "failed" and t["exit_code"] == 3 and "something went wrong" in t["log_tail"]
        res = cluster.ctl("tasks", bad)
        assert "something went wrong" in res.stdout and "exit code     3" in res.stdout

    def test_cancel_kills_after_grace(self, cluster: Cluster) -> None:
        """Cancelling a task that ignores SIGTERM kills it after its grace period."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        agent = cluster.start_agent("n1")
        tid = cluster.submit("--name", "stubborn", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1",
                      "--stop-grace-s", "1",
                      "--", "sh", "-c", "trap '' TERM; while true; do sleep 0.1; done")
        t = wait_until(lambda: cluster.task_in(tid, "running"), what="running")
        pids = t["pids"]
        assert pids and _pid_alive(pids[0])
        assert cluster.ctl("cancel", tid).returncode == 0
        t = wait_until(lambda: cluster.task_in(tid, "cancelled"), what="cancelled")
        killed = [e for e in _events(agent.log()) if e.get("event") == "task_killed" and e.get("task_id") == tid]
        assert killed and killed[0]["reason"] == "still alive after 1.0s grace", agent.tail()
        wait_until(lambda: not _pid_alive(pids[0]), what="process gone")

    def test_cancel_wins_over_restart_policy(self, cluster: Cluster) -> None:
        """A crash-looping task under restart_policy always backs off between restarts, and once
        cancelled ends CANCELLED and is never restarted again."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        tid = cluster.submit("--name", "crashloop", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1",
                      "--restart-policy", "always", "--max-restarts", "1000", "--", "sh", "-c", "exit 1")
        t = wait_until(lambda: (lambda x: x if x["restarts"] >= 2 else None)(cluster.task(tid)), what="2 restarts")
        assert "after failure in" in t["reason"] or t["state"] != "pending"
        wait_until(lambda: cluster.ctl("cancel", tid).returncode == 0, what="cancel accepted")
        t = wait_until(lambda: cluster.task_in(tid, "cancelled"), what="cancelled")
        restarts = t["restarts"]
        # A requeue counts the restart at once (its backoff only delays the placement). A later task that runs
        # and ends on the same node shows that everything the agent reported before it has been handled.
        after = cluster.submit("--name", "after", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1", "--", "true")
        wait_until(lambda: cluster.task_in(after, "succeeded"), what="a later task to run")
        t = cluster.task(tid)
        assert t["state"] == "cancelled" and t["restarts"] == restarts
        assert [h["state"] for h in t["history"]][-1] == "cancelled"
        assert restarts < 10   # backoff: 1 s, 2 s, 4 s ... not ~20 restarts a second

    def test_agent_kill9_readopts_tasks(self, cluster: Cluster) -> None:
        """After kill -9 of the agent, live tasks are re-adopted (not restarted) and a task that ended is reported."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        agent = cluster.start_agent("n1")
        long = cluster.submit("--name", "long", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1",
                       "--", "sleep", "30")
        short = cluster.submit("--name", "short", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1", "--",
                        "sh", "-c", "sleep 2; exit 7")
        wait_until(lambda: cluster.task_in(long, "running") and cluster.task_in(short, "running"),
                   what="both running")
        pid = cluster.task(long)["pids"][0]
        short_pid = cluster.task(short)["pids"][0]
        agent.signal(signal.SIGKILL)
        agent.proc.wait()  # type: ignore[union-attr]
        wait_until(lambda: _exited(short_pid), what="the short task to end while no agent is there")
        cluster.start_agent("n1")
        t = wait_until(lambda: cluster.task_in(short, "failed", "succeeded"), what="short reported")
        assert t["state"] == "failed" and t["exit_code"] == 7
        t = cluster.task(long)
        assert t["state"] == "running" and t["pids"] == [pid] and _pid_alive(pid)
        assert [h["state"] for h in t["history"]].count("running") == 1
        assert cluster.ctl("cancel", long).returncode == 0
        wait_until(lambda: cluster.task_in(long, "cancelled"), what="long cancelled")


class TestCoordinatorRestart:
    @pytest.mark.slow
    def test_no_status_event_lost(self, cluster: Cluster) -> None:
        """Tasks that finish while the coordinator is down are reported after it returns; the agent reconnects."""
        addr = cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1", "--buffer-samples", "1", "--interval", "0.1")
        # Each runs until the test signals it (SIGUSR1), so all four run at once however loaded the machine is.
        tids = [cluster.submit("--name", f"t{i}", "--gpus", "0.25", "--gpu-mem-gib", "1", "--cpu", "0.1", "--",
                               "sh", "-c", f"trap 'exit {i}' USR1; while true; do sleep 0.1; done") for i in range(4)]
        running = wait_until(lambda: all(ts := [cluster.task_in(t, "running") for t in tids]) and ts,
                             what="all running")
        pids = [t["pids"][0] for t in running]
        cluster.proc("c1").stop()
        for pid in pids:   # to the task's process group, as the agent signals a task (the wrappers let it pass)
            os.killpg(os.getpgid(pid), signal.SIGUSR1)
        # Every task ends while no coordinator is there; telemetry beyond 1 sample (one every 0.1 s) is dropped.
        wait_until(lambda: all(_exited(p) for p in pids), what="every task to end while no coordinator is there")
        wait_until(lambda: "telemetry_dropped" in cluster.agents["n1"].log(), what="the agent to drop a sample")
        assert cluster.start_coordinator("c1") == addr
        cluster.wait_leader("c1")
        for i, tid in enumerate(tids):
            t = wait_until(lambda tid=tid: cluster.task_in(tid, "succeeded", "failed"), what=f"{tid} final")
            assert t["exit_code"] == i and t["state"] == ("succeeded" if i == 0 else "failed")
        node = wait_until(lambda: (n := json.loads(cluster.ctl("-o", "json", "nodes", "n1").stdout))["state"]
                          == "ready" and n["dropped_samples_total"] > 0 and n, what="reconnected with drops")
        assert node["dropped_samples_total"] >= 1
