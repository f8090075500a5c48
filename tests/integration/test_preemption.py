"""Preemption end to end: real coordinator, agent and task processes on a 2-GPU simulated node."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, assert_gpus_held_once, wait_until


def _submit(c: Cluster, *args: str) -> str:
    return c.submit(*ROOT_TASKS_SUBMIT, *args)


def _states(history: list[dict]) -> list[str]:
    return [h["state"] for h in history]


def _victim(c: Cluster, name: str, marker: Path) -> str:
    """A priority-0 one-GPU task that appends to ``marker`` and exits when it gets SIGUSR1."""
    return _submit(c, "--name", name, "--priority", "0", "--gpus", "1", "--gpu-mem-gib", "10", "--cpu", "0.1",
                   "--stop-grace-s", "2", "--",
                   "sh", "-c", f"trap 'echo checkpoint >> {marker}; exit 0' USR1; while true; do sleep 0.1; done")


def _two_running_victims(cluster: Cluster, tmp_path: Path) -> tuple[list[str], list[Path]]:
    """A 2-GPU simulated node running two priority-0 one-GPU victims; their checkpoint marker files."""
    cluster.start_agent("n1", "--simulate-gpus", "2xH100-80GB", *ROOT_TASKS_AGENT)
    wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
    markers = [tmp_path / "v1.ckpt", tmp_path / "v2.ckpt"]
    victims = [_victim(cluster, f"low-{i}", m) for i, m in enumerate(markers)]
    for v in victims:
        wait_until(lambda v=v: cluster.task(v)["state"] == "running", what=f"{v} running")
    return victims, markers


def _metric(c: Cluster, series: str) -> float:
    """The value of one series (name and labels as exposed) on c1's metrics endpoint; 0 when absent."""
    with urllib.request.urlopen(f"http://{c.metrics_address('c1')}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    return next((float(line.rsplit(" ", 1)[1]) for line in lines if line.rsplit(" ", 1)[0] == series), 0.0)


class TestPreemption:
    def test_high_priority_task_preempts_two_victims_which_run_again(self, cluster: Cluster, tmp_path: Path) -> None:
        """A priority-10 two-GPU task preempts both priority-0 tasks (signalled, preempted, pending) and they run
        again once it finished."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        victims, markers = _two_running_victims(cluster, tmp_path)
        submitted = {v: cluster.task(v)["submit_unix_s"] for v in victims}
        high = _submit(cluster, "--name", "urgent", "--priority", "10", "--gpus", "2", "--gpu-mem-gib", "10",
                       "--cpu", "0.1", "--", "sh", "-c", "sleep 3")
        wait_until(lambda: all(m.exists() for m in markers), timeout_s=5.0, what="both victims signalled")
        wait_until(lambda: cluster.task(high)["state"] == "running", timeout_s=5.0, what="urgent running")
        for v in victims:
            t = cluster.task(v)
            assert t["preemptions"] == 1
            states = _states(t["history"])
            assert states[states.index("preempted"):][:2] == ["preempted", "pending"]
            assert t["submit_unix_s"] == submitted[v] and t["priority"] == 0
        wait_until(lambda: cluster.task(high)["state"] == "succeeded", what="urgent finished")
        for v in victims:
            t = wait_until(lambda v=v: (t := cluster.task(v))["state"] == "running" and t, what=f"{v} running again")
            assert _states(t["history"]).count("running") == 2
        events = cluster.ctl("-o", "json", "events").stdout
        assert "preemption" in events and high in events
        text = urllib.request.urlopen(f"http://{cluster.metrics_address('c1')}/metrics", timeout=5).read().decode()
        assert "gptrm_preemptions_total 2.0" in text
        table = cluster.ctl("-o", "wide", "tasks").stdout
        assert "PREEMPTED" in table

    def test_equal_priority_waits(self, cluster: Cluster, tmp_path: Path) -> None:
        """A task of the same priority as the running ones waits instead of preempting them."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        victims, markers = _two_running_victims(cluster, tmp_path)
        waiting = 'gptrm_scheduler_decisions_total{outcome="waiting"}'
        cycles, refused = _metric(cluster, "gptrm_scheduler_cycle_duration_seconds_count"), _metric(cluster, waiting)
        same = _submit(cluster, "--name", "same", "--priority", "0", "--gpus", "2", "--gpu-mem-gib", "10",
                       "--cpu", "0.1", "--", "true")
        # A cycle that refused it has ended, preemption tried (victims are preempted inside the cycle); later
        # cycles, given the same inputs, are skipped.
        wait_until(lambda: _metric(cluster, "gptrm_scheduler_cycle_duration_seconds_count") > cycles
                   and _metric(cluster, waiting) > refused,
                   what="a scheduling cycle that refused the task")
        assert cluster.task(same)["state"] == "pending"
        assert not any(m.exists() for m in markers)
        assert all(cluster.task(v)["preemptions"] == 0 for v in victims)

    def test_leader_killed_right_after_submit(self, cluster: Cluster, tmp_path: Path) -> None:
        """With the leader killed (-9) right after the submit the end state is the same: victims signalled,
        preempted, pending, the urgent task runs then both run again; no GPU held twice, no task lost."""
        flags = ("--task-grace", "3")
        cluster.start_coordinator("c1", *flags)
        cluster.wait_leader("c1")
        cluster.start_coordinator("c2", *flags)
        victims, markers = _two_running_victims(cluster, tmp_path)
        high = _submit(cluster, "--name", "urgent", "--priority", "10", "--gpus", "2", "--gpu-mem-gib", "10",
                       "--cpu", "0.1", "--", "sh", "-c", "sleep 3")
        cluster.proc("c1").kill()
        c2 = cluster.address("c2")
        cluster.wait_leader("c2")

        def gpus_held_once() -> list[types_pb2.Task]:
            tasks = list(cluster.admin("c2").ListTasks(admin_pb2.ListTasksRequest(), timeout=10).tasks)
            assert_gpus_held_once(tasks)
            return tasks

        def urgent_ran() -> bool:
            tasks = gpus_held_once()
            return any(t.id == high and any(h.state == types_pb2.TASK_STATE_RUNNING for h in t.history)
                       for t in tasks)

        wait_until(urgent_ran, what="urgent running (before or after the leader change)")
        assert all(m.exists() for m in markers)
        for v in victims:
            t = cluster.task(v, c2)
            assert t["preemptions"] == 1
            states = _states(t["history"])
            assert states[states.index("preempted"):][:2] == ["preempted", "pending"]
        wait_until(lambda: gpus_held_once() and cluster.task(high, c2)["state"] == "succeeded", what="urgent done")
        for v in victims:
            wait_until(lambda v=v: gpus_held_once() and cluster.task(v, c2)["state"] == "running",
                       what=f"{v} running again")
        assert {t.id for t in gpus_held_once()} == {high, *victims}

    def test_victim_ignoring_its_checkpoint_signal_is_stopped_after_grace(self, cluster: Cluster) -> None:
        """A victim that ignores SIGUSR1 (and SIGTERM) is still killed after its grace and the urgent task runs."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1", "--simulate-gpus", "1xH100-80GB", *ROOT_TASKS_AGENT)
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
        stubborn = _submit(cluster, "--name", "stubborn", "--gpus", "1", "--gpu-mem-gib", "10", "--cpu", "0.1",
                           "--stop-grace-s", "1", "--", "sh", "-c", "trap '' USR1 TERM; while true; do sleep 0.1; done")
        t = wait_until(lambda: (t := cluster.task(stubborn))["state"] == "running" and t, what="stubborn running")
        pid = t["pids"][0]
        high = _submit(cluster, "--name", "urgent", "--priority", "1", "--gpus", "1", "--gpu-mem-gib", "10",
                       "--cpu", "0.1", "--", "sleep", "30")
        wait_until(lambda: cluster.task(high)["state"] == "running", what="urgent running")
        assert cluster.task(stubborn)["state"] == "pending"
        try:
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        assert not alive
