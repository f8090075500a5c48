"""gptrmctl logs against a real cluster: a task's output read from its agent through the leader."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.helpers.ctl_schema import validate
from tests.integration.harness import BIN, ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until


def _start(c: Cluster) -> None:
    c.start_coordinator("c1")
    c.wait_leader("c1")
    c.start_agent("n1", *ROOT_TASKS_AGENT)
    wait_until(lambda: c.ctl_json("nodes")["nodes"], what="node registered")


def _run(c: Cluster, script: str) -> str:
    task = c.ctl_json("submit", "--name", "printer", "--gpus", "0", "--cpu", "0.1", *ROOT_TASKS_SUBMIT, "--",
                 "/bin/sh", "-c", script)
    return task["task_id"]


class TestTaskLogs:
    def test_tail_prints_the_last_lines(self, cluster: Cluster) -> None:
        """logs --tail 2 prints exactly the task's last two lines; -o json gives one schema-valid object per chunk."""
        _start(cluster)
        task_id = _run(cluster, "echo one; echo two; echo three; echo four >&2; sleep 60")
        res = wait_until(lambda: (r := cluster.ctl("logs", task_id, "--tail", "2")).stdout == "three\nfour\n" and r,
                         what="last two lines")
        assert res.returncode == 0
        res = cluster.ctl("-o", "json", "logs", task_id, "--tail", "3")
        assert res.returncode == 0, res.stderr
        docs = [json.loads(line) for line in res.stdout.splitlines()]
        for doc in docs:
            validate(doc, "log_chunk")
        assert "".join(d["text"] for d in docs) == "two\nthree\nfour\n"
        assert {d["task_id"] for d in docs} == {task_id} and {d["node_id"] for d in docs} == {"n1"}
        assert [d["seq"] for d in docs] == list(range(1, len(docs) + 1))

    def test_follow_receives_later_lines_and_ends_with_the_task(self, cluster: Cluster, tmp_path: Path) -> None:
        """logs --follow prints lines written after it started and exits 0 when the task ends."""
        _start(cluster)
        go = tmp_path / "go"
        task_id = _run(cluster, f"echo started; while [ ! -e {go} ]; do sleep 0.1; done; echo after-1; echo after-2")
        wait_until(lambda: cluster.ctl("logs", task_id).stdout == "started\n", what="first line")
        follower = subprocess.Popen(
            [str(BIN / "gptrmctl"), "--coordinator", cluster.address("c1"), "--insecure", "logs", task_id,
             "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert follower.stdout is not None
            assert follower.stdout.readline() == "started\n"   # following: the backlog arrived
            go.touch()
            out, err = follower.communicate(timeout=60)
        finally:
            follower.kill()
        assert follower.returncode == 0, err
        assert out == "after-1\nafter-2\n"

    def test_unknown_task_and_task_that_never_ran(self, cluster: Cluster) -> None:
        """An unknown task exits 1 naming it; a task that never ran says it has no output."""
        _start(cluster)
        res = cluster.ctl("logs", "no-such-task")
        assert res.returncode == 1 and "no-such-task" in res.stderr
        pending = cluster.ctl_json("submit", "--name", "huge", "--gpus", "1", "--cpu", "1000", "--queue-unplaceable",
                                   "--", "true")
        res = cluster.ctl("logs", pending["task_id"])
        assert res.returncode == 1 and "has not run on any node" in res.stderr

    def test_agent_gone_is_unavailable(self, cluster: Cluster) -> None:
        """When the task's agent is down, logs exits 1 naming the task and its node."""
        _start(cluster)
        task_id = _run(cluster, "echo hi; sleep 60")
        wait_until(lambda: cluster.ctl("logs", task_id).stdout == "hi\n", what="output")
        cluster.agents["n1"].stop()
        res = wait_until(lambda: (r := cluster.ctl("logs", task_id)).returncode == 1 and r, what="refusal")
        assert task_id in res.stderr and "n1" in res.stderr and "not connected" in res.stderr

    def test_usage_errors(self, cluster: Cluster) -> None:
        """A negative --tail is a usage error (exit 2) naming the flag."""
        res = cluster.ctl("logs", "t", "--tail", "-1")
        assert res.returncode == 2 and "--tail" in res.stderr
