"""Elastic training end to end: real coordinator, agent and task processes on a 4-GPU simulated node.

The elastic task appends one line per start to a marker file — its ``WORLD_SIZE``, ``GPTRM_RESTART_COUNT`` and
``GPTRM_RESIZE_REASON`` — and exits on its checkpoint signal (SIGUSR1), as a training job that checkpoints would.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from common.pb.gptrm.v1 import admin_pb2
from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, assert_gpus_held_once, wait_until

_INTERVAL_S = "4"   # the hysteresis: short, so that growing back is quick


def _submit(c: Cluster, *args: str) -> str:
    return c.submit(*ROOT_TASKS_SUBMIT, *args)


def _elastic(c: Cluster, marker: Path, ckpt: Path, checkpoint_s: float = 0.0) -> str:
    """Submit the 1:4 elastic task; it takes ``checkpoint_s`` to checkpoint after its signal."""
    script = (f'echo "$WORLD_SIZE|$GPTRM_RESTART_COUNT|$GPTRM_RESIZE_REASON" >> {marker}; '
              f"trap 'sleep {checkpoint_s}; echo checkpoint >> {ckpt}; exit 0' USR1; while true; do sleep 0.1; done")
    return _submit(c, "--name", "trainer", "--kind", "training", "--gpus", "1:4", "--gpu-mem-gib", "10",
                   "--cpu", "0.1", "--stop-grace-s", "3", "--", "sh", "-c", script)


def _starts(marker: Path) -> list[tuple[int, int, str]]:
    """(WORLD_SIZE, GPTRM_RESTART_COUNT, GPTRM_RESIZE_REASON) of each start so far."""
    if not marker.exists():
        return []
    out = []
    for line in marker.read_text().splitlines():
        world, count, reason = line.split("|", 2)
        out.append((int(world), int(count), reason))
    return out


def _running_instances(marker: Path) -> int:
    """Live processes of the elastic task (its shell names the marker file)."""
    n = 0
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if len(cmd) >= 3 and cmd[0] == "sh" and str(marker) in cmd[2]:
            n += 1
    return n


def _elastic_in_team(c: Cluster, tmp_path: Path, *, team_quota: int, other_quota: int) -> str:
    """One 4-GPU node, queues team (``team_quota``, limit 3, everyone's default) and other (``other_quota``),
    and the 1:4 elastic task submitted to team and started (its starts in ``tmp_path/starts``)."""
    queues = tmp_path / "queues.toml"
    queues.write_text(f'[[queue]]\nname = "team"\ngpus = {{ "*" = {team_quota} }}\nlimit = {{ "*" = 3 }}\n'
                      f'members = ["*"]\ndefault_for = ["*"]\n[[queue]]\nname = "other"\n'
                      f'gpus = {{ "*" = {other_quota} }}\nmembers = ["*"]\n')
    c.start_coordinator("c1", "--queues", str(queues), "--elastic-interval", _INTERVAL_S)
    c.wait_leader("c1")
    c.start_agent("n1", *ROOT_TASKS_AGENT)
    wait_until(lambda: json.loads(c.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
    marker = tmp_path / "starts"
    trainer = _elastic(c, marker, tmp_path / "ckpt")
    wait_until(lambda: _starts(marker), what="elastic task started")
    return trainer


class TestElastic:
    @pytest.mark.slow
    def test_grows_shrinks_for_a_waiting_task_and_grows_back(self, cluster: Cluster, tmp_path: Path) -> None:
        """1:4 on an idle 4-GPU node runs at 4; a 2-GPU task arrives: the elastic one is signalled, restarts
        at 2 and the new task runs, each within 30 s; once it ended, the elastic one grows back to 4."""
        cluster.start_coordinator("c1", "--elastic-interval", _INTERVAL_S)
        cluster.wait_leader("c1")
        cluster.start_agent("n1", *ROOT_TASKS_AGENT)
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
        # A maximum no node could hold (the node has 4 GPUs) is refused at submit, naming the field.
        res = cluster.ctl("submit", "--name", "big", "--kind", "training", "--gpus", "1:5", "--cpu", "0.1", "--",
                          "sleep", "1")
        assert res.returncode == 1 and "spec.elastic.max_gpus: 5 GPUs per node requested" in res.stderr, res.stderr
        marker, ckpt = tmp_path / "starts", tmp_path / "ckpt"
        trainer = _elastic(cluster, marker, ckpt)
        wait_until(lambda: _starts(marker), what="elastic task started")
        assert _starts(marker) == [(4, 0, "")]   # it took the whole idle node at once, no restart
        t = cluster.task(trainer)
        assert t["elastic"]["gpus"] == 4 and t["elastic"]["min_gpus"] == 1 and t["elastic"]["max_gpus"] == 4

        other = _submit(cluster, "--name", "other", "--gpus", "2", "--gpu-mem-gib", "10", "--cpu", "0.1", "--",
                        "sh", "-c", "sleep 6")
        wait_until(ckpt.exists, timeout_s=30, what="checkpoint signal to the elastic task")
        wait_until(lambda: len(_starts(marker)) == 2, timeout_s=30, what="elastic task restarted")
        world, count, reason = _starts(marker)[1]
        assert (world, count) == (2, 1) and other in reason
        wait_until(lambda: cluster.task(other)["state"] in ("running", "succeeded"), timeout_s=30,
                   what="the waiting task runs")
        t = cluster.task(trainer)
        assert t["restarts"] == 0 and t["preemptions"] == 0 and t["elastic"]["resizes"] == 1

        wait_until(lambda: cluster.task(other)["state"] == "succeeded", what="the other task ended")
        wait_until(lambda: len(_starts(marker)) == 3, timeout_s=60, what="elastic task grew back")
        world, count, reason = _starts(marker)[2]
        assert (world, count) == (4, 2) and "idle GPUs" in reason
        t = wait_until(lambda: (t := cluster.task(trainer))["state"] == "running" and t, what="running at 4")
        history = t["elastic"]["history"]
        assert [(h["from_gpus"], h["to_gpus"]) for h in history] == [(2, 4), (4, 2)]   # latest first
        # A resize waits out the hysteresis: the grow came at least the interval after the shrink.
        assert history[0]["time_unix_s"] - history[1]["time_unix_s"] >= float(_INTERVAL_S)
        events = cluster.ctl("-o", "json", "events").stdout
        assert '"resize"' in events
        detail = cluster.ctl("tasks", trainer).stdout
        assert "elastic       1:4 GPUs" in detail and "resizes       2" in detail
        assert _running_instances(marker) == 1

    def test_moves_to_another_node_to_grow(self, cluster: Cluster, tmp_path: Path) -> None:
        """A 2-GPU task holds half of n1 and the elastic 1:4 task the other half; once n2 joins idle, the elastic task
        restarts there at 4 GPUs (its own node had no room to grow)."""
        cluster.start_coordinator("c1", "--elastic-interval", _INTERVAL_S)
        cluster.wait_leader("c1")
        cluster.start_agent("n1", *ROOT_TASKS_AGENT)
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
        rigid = _submit(cluster, "--name", "rigid", "--gpus", "2", "--gpu-mem-gib", "10", "--cpu", "0.1", "--",
                        "sh", "-c", "sleep 600")
        wait_until(lambda: cluster.task(rigid)["state"] == "running", what="the rigid task runs")
        marker, ckpt = tmp_path / "starts", tmp_path / "ckpt"
        trainer = _elastic(cluster, marker, ckpt)
        wait_until(lambda: _starts(marker), what="elastic task started")
        assert _starts(marker) == [(2, 0, "")]   # what n1 had left
        cluster.start_agent("n2", *ROOT_TASKS_AGENT)
        wait_until(lambda: len(_starts(marker)) == 2, timeout_s=60, what="elastic task moved")
        world, count, reason = _starts(marker)[1]
        assert (world, count) == (4, 1) and "another node" in reason
        t = wait_until(lambda: (t := cluster.task(trainer))["state"] == "running" and t, what="running at 4")
        assert t["elastic"]["gpus"] == 4 and [a["node_id"] for a in t["allocation"]] == ["n2"]
        assert cluster.task(rigid)["state"] == "running" and _running_instances(marker) == 1

    def test_leader_killed_during_a_resize(self, cluster: Cluster, tmp_path: Path) -> None:
        """The leader killed (-9) while the elastic task is being shrunk: the new leader finishes the resize; the
        task runs exactly once, at 2 GPUs beside the waiting task, and no GPU is held twice."""
        flags = ("--task-grace", "3", "--elastic-interval", "600")
        cluster.start_coordinator("c1", *flags)
        cluster.wait_leader("c1")
        cluster.start_coordinator("c2", *flags)
        cluster.start_agent("n1", *ROOT_TASKS_AGENT)
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "nodes").stdout)["nodes"], what="node")
        marker, ckpt = tmp_path / "starts", tmp_path / "ckpt"
        trainer = _elastic(cluster, marker, ckpt, checkpoint_s=2.0)
        wait_until(lambda: _starts(marker) == [(4, 0, "")], what="elastic task at 4 GPUs")
        wait_until(lambda: cluster.task(trainer)["state"] == "running", what="elastic task running")
        other = _submit(cluster, "--name", "other", "--gpus", "2", "--gpu-mem-gib", "10", "--cpu", "0.1", "--",
                        "sh", "-c", "sleep 600")
        admin = cluster.admin("c1")
        wait_until(lambda: admin.GetTask(admin_pb2.GetTaskRequest(task_id=trainer), timeout=5).state == 9,
                   timeout_s=30, interval_s=0.02, what="resize under way (PREEMPTED)")
        assert not ckpt.exists()   # still checkpointing
        cluster.proc("c1").kill()
        c2 = cluster.address("c2")
        cluster.wait_leader("c2")

        def settled() -> bool:
            tasks = list(cluster.admin("c2").ListTasks(admin_pb2.ListTasksRequest(), timeout=10).tasks)
            assert_gpus_held_once(tasks)
            states = {t.id: t.state for t in tasks}
            return states.get(trainer) == 4 and states.get(other) == 4   # both RUNNING

        wait_until(settled, timeout_s=60, what="both running under the new leader")
        # RUNNING is reported once its process started; its first line follows a moment later.
        wait_until(lambda: len(_starts(marker)) >= 2, what="the elastic task's second start")
        assert [s[0] for s in _starts(marker)] == [4, 2]
        assert _running_instances(marker) == 1
        t = cluster.task(trainer, coordinator=c2)
        assert t["elastic"]["gpus"] == 2 and t["elastic"]["resizes"] == 1

    def test_grows_into_lent_gpus_within_its_queues_limit_and_gives_them_back(self, cluster: Cluster,
                                                                               tmp_path: Path) -> None:
        """Team queues: team (quota 1, limit 3) and other (quota 3, idle: it lends). An elastic 1:4 task of team
        takes 3 GPUs of the idle 4-GPU node, 2 of them borrowed: its limit, not its quota (growing borrows like
        any task). ``tasks`` shows the interval and that the limit keeps it from growing. A task of other then
        asks for its quota: the elastic task gives the borrowed GPUs back and restarts at 1."""
        marker = tmp_path / "starts"
        trainer = _elastic_in_team(cluster, tmp_path, team_quota=1, other_quota=3)
        assert _starts(marker) == [(3, 0, "")]
        t = wait_until(lambda: (t := cluster.task(trainer))["elastic"]["grow_blocked"] and t,
                       what="the reason it does not grow")
        assert t["queue"] == "team" and t["elastic"]["gpus"] == 3 and t["borrowed_gpus"] == 2
        assert "its limit of 3" in t["elastic"]["grow_blocked"] and t["elastic"]["interval_s"] == float(_INTERVAL_S)
        detail = cluster.ctl("tasks", trainer).stdout
        assert f"at most one resize per {_INTERVAL_S} s" in detail and "growing       blocked: Queue team" in detail

        other = _submit(cluster, "--name", "other", "--queue", "other", "--gpus", "3", "--gpu-mem-gib", "10",
                        "--cpu", "0.1", "--", "sh", "-c", "sleep 600")
        wait_until(lambda: len(_starts(marker)) == 2, timeout_s=30, what="elastic task gave its borrowed GPUs back")
        world, count, reason = _starts(marker)[1]
        assert (world, count) == (1, 1) and other in reason
        wait_until(lambda: cluster.task(other)["state"] == "running", timeout_s=30, what="the other queue's task runs")
        t = wait_until(lambda: (t := cluster.task(trainer))["state"] == "running" and t, what="running at 1")
        assert t["elastic"]["gpus"] == 1 and t["borrowed_gpus"] == 0 and _running_instances(marker) == 1

    def test_a_task_waiting_on_its_queues_limit_shrinks_it(self, cluster: Cluster, tmp_path: Path) -> None:
        """team (quota 2, limit 3) beside an idle other (quota 2): the elastic 1:4 task grows to 3, team's limit. A
        1-GPU task of team is then refused by the limit although a GPU is idle: the elastic task shrinks to 2
        for it (once), and both run."""
        marker = tmp_path / "starts"
        trainer = _elastic_in_team(cluster, tmp_path, team_quota=2, other_quota=2)
        assert _starts(marker) == [(3, 0, "")]
        wait_until(lambda: cluster.task(trainer)["state"] == "running", what="elastic task running")
        rigid = _submit(cluster, "--name", "rigid", "--gpus", "1", "--gpu-mem-gib", "10", "--cpu", "0.1", "--",
                        "sh", "-c", "sleep 600")
        wait_until(lambda: len(_starts(marker)) == 2, timeout_s=30, what="elastic task shrunk for the limit")
        world, count, reason = _starts(marker)[1]
        assert (world, count) == (2, 1) and rigid in reason and "limit" in reason
        wait_until(lambda: cluster.task(rigid)["state"] == "running", timeout_s=30, what="the rigid task runs")
        t = wait_until(lambda: (t := cluster.task(trainer))["state"] == "running" and t, what="running at 2")
        assert t["elastic"]["gpus"] == 2 and t["elastic"]["resizes"] == 1 and _running_instances(marker) == 1
