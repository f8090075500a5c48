"""Time limits and protected run time end to end: real coordinator, agent and task processes on a simulated node."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until


def _start(cluster: Cluster, gpus: int = 1) -> None:
    cluster.start_coordinator("c1")
    cluster.wait_leader("c1")
    cluster.start_agent("n1", "--simulate-gpus", f"{gpus}xH100-80GB", *ROOT_TASKS_AGENT)
    wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")


def _looping(marker: Path) -> list[str]:
    """A command that appends to ``marker`` on SIGUSR1 (its checkpoint) and keeps running until stopped."""
    return ["sh", "-c", f"trap 'echo checkpoint >> {marker}' USR1; while true; do sleep 0.1; done"]


class TestTimeLimit:
    def test_task_past_its_time_limit_is_signalled_then_ends_timeout(self, cluster: Cluster, tmp_path: Path) -> None:
        """A --time 3s task gets its checkpoint signal at the limit, is stopped after its grace (its queue's) and
        ends timeout; its restart policy (always) does not run it again. A time above the queue's maximum, and node
        choices no known node matches, are refused at submit, naming the field."""
        _start(cluster)
        cluster.ctl_json("queues", "set", "team", "--gpus", "1", "--members", "*", "--default-for", "*",
                         "--max-time", "1h", "--grace", "1s")
        refused = cluster.ctl("submit", "--time", "2h", "--", "true")
        assert refused.returncode != 0 and "spec.time_limit_s" in refused.stderr and "1h" in refused.stderr
        nowhere = cluster.ctl("submit", "--nodelist", "n1", "--exclude", "n1", "--", "true")
        assert nowhere.returncode != 0 and "spec.constraints.avoid_nodes" in nowhere.stderr
        marker = tmp_path / "ckpt"
        tid = cluster.submit(*ROOT_TASKS_SUBMIT, "--name", "limited", "--gpus", "1", "--gpu-mem-gib", "10",
                             "--cpu", "0.1", "--time", "3s", "--restart-policy", "always",
                             "--", *_looping(marker))
        t = wait_until(lambda: (t := cluster.task(tid))["state"] == "timeout" and t, timeout_s=60.0,
                       what="the task ended timeout")
        assert marker.read_text().strip() == "checkpoint"
        assert t["timed_out"] is True and t["time_limit_s"] == 3.0
        assert t["spec"]["stop_grace_s"] == 1.0   # the queue's grace
        assert "time limit of 3s reached" in t["reason"]
        assert t["restarts"] == 0
        states = [h["state"] for h in t["history"]]
        assert states[-2:] == ["running", "timeout"]
        table = cluster.ctl("tasks").stdout
        assert "TIMEOUT" in table.upper()
        # Final: nothing brings it back (the restart policy never applies to timeout).
        wait_until(lambda: "gptrm_tasks{state=\"timeout\"} 1.0" in _metrics(cluster), what="timeout in /metrics")
        assert cluster.task(tid)["state"] == "timeout"


def _metrics(cluster: Cluster) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{cluster.metrics_address('c1')}/metrics", timeout=5) as resp:
        return resp.read().decode()


class TestProtectedRunTime:
    def test_task_inside_its_min_runtime_is_never_the_preemption_victim(self, cluster: Cluster,
                                                                        tmp_path: Path) -> None:
        """Of two priority-0 tasks on a full 2-GPU node, victim choice would take the newer; inside its
        --min-runtime it is kept and the older one is preempted for the priority-10 task instead."""
        _start(cluster, gpus=2)
        common = ("--priority", "0", "--gpus", "1", "--gpu-mem-gib", "10", "--cpu", "0.1", "--stop-grace-s", "1")
        markers = {name: tmp_path / f"{name}.ckpt" for name in ("old", "young")}
        old = cluster.submit(*ROOT_TASKS_SUBMIT, "--name", "old", *common, "--", *_looping(markers["old"]))
        wait_until(lambda: cluster.task(old)["state"] == "running", what="old running")
        young = cluster.submit(*ROOT_TASKS_SUBMIT, "--name", "young", *common, "--min-runtime", "10m", "--",
                               *_looping(markers["young"]))
        wait_until(lambda: cluster.task(young)["state"] == "running", what="young running")
        high = cluster.submit(*ROOT_TASKS_SUBMIT, "--name", "urgent", "--priority", "10", "--gpus", "1",
                              "--gpu-mem-gib", "10", "--cpu", "0.1", "--", "sh", "-c", "sleep 30")
        wait_until(lambda: cluster.task(high)["state"] == "running", what="urgent running")
        assert markers["old"].exists() and cluster.task(old)["preemptions"] == 1
        t = cluster.task(young)
        assert t["state"] == "running" and t["preemptions"] == 0 and t["min_runtime_s"] == 600.0
        assert not markers["young"].exists()
