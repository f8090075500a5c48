"""Queue changes on a running cluster strand nothing, and a hostile stored tree never stops the leader.

Real coordinator (and agent where tasks must run) on the shared real etcd; the last test builds the
coordinator in-process (``tests.helpers.inproc``) to see on which thread SetQueue validates.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from pathlib import Path
from typing import ClassVar

import pytest

from common.errors import ValidationError
from coordinator.app import App
from coordinator.etcd_embedded import EtcdCluster
from coordinator.queues import MAX_QUEUES, Queue
from coordinator.sync import Keys
from coordinator.sync.client import connect, op_put
from tests.helpers.ctl_schema import validate
from tests.helpers.inproc import run_leading
from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until


def _sleeper(c: Cluster, *args: str) -> str:
    return c.submit(*ROOT_TASKS_SUBMIT, "--gpus", "4", "--gpu-mem-gib", "1", "--cpu", "0.1", *args, "--",
                    "sleep", "600")


class TestQueueChanges:
    def test_the_first_queue_keeps_default_and_its_work(self, cluster: Cluster) -> None:
        """On a cluster whose tasks run in the implicit default queue, `queues set vision --gpus 4 --limit 6`
        keeps `default`: its running task keeps running, its pending task keeps a queue that exists, a submit
        without --queue still goes to `default`, and the reply says so (human and JSON)."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1", *ROOT_TASKS_AGENT)                  # 4 simulated GPUs
        running = _sleeper(cluster)
        wait_until(lambda: cluster.task(running)["state"] == "running", timeout_s=30, what="first task running")
        waiting = _sleeper(cluster)                                  # no room left: it waits
        res = cluster.ctl("queues", "set", "vision", "--gpus", "4", "--limit", "6")
        assert res.returncode == 0, res.stderr
        assert "Queue default, in which every task ran until now, is kept" in res.stdout
        assert "submits without --queue still go to it" in res.stdout
        res = cluster.ctl("-o", "json", "queues", "set", "audio", "--gpus", "0")
        assert res.returncode == 0, res.stderr
        reply = json.loads(res.stdout)
        validate({"managed": True, "half_life_h": 24.0, "stale": False, "queues": [reply]}, "queues")
        assert reply["existing_work"] == "No existing task changed queue."
        queues = cluster.ctl_json("queues")
        assert [q["name"] for q in queues["queues"]] == ["audio", "default", "vision"]
        later = _sleeper(cluster)                                    # no --queue: the default queue, as before
        assert cluster.task(later)["queue"] == "default"
        wait_until(lambda: cluster.task(later)["reason"].startswith("Queue default would hold"), timeout_s=15,
                   what="a cycle deciding the later task in the default queue")
        assert "does not exist" not in cluster.task(waiting)["reason"]
        assert cluster.task(running)["state"] == "running"
        for task in (running, waiting, later):
            assert cluster.ctl("cancel", task).returncode == 0
        wait_until(lambda: cluster.task(running)["state"] == "cancelled", timeout_s=30,
                   what="the running task stopped (no process left behind)")

    def test_a_queues_file_read_by_a_new_leader_keeps_default_while_it_holds_work(self, cluster: Cluster,
                                                                                   tmp_path: Path) -> None:
        """A cluster that ran without queues gets a leader with `--queues FILE` (no `default` in it): `default`
        is kept for its waiting task, which never reads "does not exist"; the file's `"*"` default wins."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        task = cluster.submit("--gpus", "1", "--", "true")                     # no node: it waits in default
        assert cluster.task(task)["queue"] == "default"
        path = tmp_path / "queues.toml"
        path.write_text('[[queue]]\nname = "vision"\ngpus = { "*" = 4 }\nmembers = ["*"]\ndefault_for = ["*"]\n')
        cluster.proc("c1").stop()
        cluster.start_coordinator("c1", "--queues", str(path))
        cluster.wait_leader("c1", timeout_s=30)
        queues = {q["name"]: q for q in cluster.ctl_json("queues")["queues"]}
        assert sorted(queues) == ["default", "vision"] and queues["default"]["pending"] == 1
        assert queues["default"]["default_for"] == [] and queues["vision"]["default_for"] == ["*"]
        later = cluster.submit("--gpus", "1", "--", "true")
        assert cluster.task(later)["queue"] == "vision"
        wait_until(lambda: cluster.task(later)["reason"] != "", timeout_s=15, what="a cycle after the new leader")
        assert "does not exist" not in cluster.task(task)["reason"]

    def test_set_parent_is_refused_while_the_queue_holds_work(self, cluster: Cluster) -> None:
        """A queue with a pending task neither gets a child queue (it would stop taking tasks) nor moves under
        another parent; `rm` is refused by the same rule; once the work is gone, both changes go through."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        for argv in (("a", "--gpus", "0", "--members", "*"), ("org", "--gpus", "0")):
            res = cluster.ctl("queues", "set", *argv)
            assert res.returncode == 0, res.stderr
        task = cluster.submit("--queue", "a", "--gpus", "1", "--", "true")        # no node: it waits in a
        res = cluster.ctl("queues", "set", "hq", "--parent", "a", "--gpus", "0")
        assert res.returncode != 0
        assert "queue a: 1 unfinished task(s) in it" in res.stderr and "give it child queues (hq)" in res.stderr
        res = cluster.ctl("queues", "set", "a", "--parent", "org")
        assert res.returncode != 0 and "move it from under no queue to under org" in res.stderr
        res = cluster.ctl("queues", "rm", "a")
        assert res.returncode != 0 and "queue a: 1 unfinished task(s) in it" in res.stderr
        assert [q["name"] for q in cluster.ctl_json("queues")["queues"]] == ["a", "default", "org"]
        assert cluster.task(task)["queue"] == "a" and "does not exist" not in cluster.task(task)["reason"]
        assert cluster.ctl("cancel", task).returncode == 0
        wait_until(lambda: cluster.ctl("queues", "set", "a", "--parent", "org").returncode == 0, timeout_s=15,
                   what="a moved under org once empty")
        assert cluster.ctl("queues", "set", "hq", "--parent", "a", "--gpus", "0").returncode == 0

    def test_a_1200_deep_stored_chain_is_quarantined_and_the_leader_serves(
            self, cluster: Cluster, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """A 1,200-deep chain of queues written straight into etcd (with a quota beyond any GPU count) is moved
        under quarantine/ when a leader reads it; `queues`, `/metrics` and the scheduling cycle keep working."""
        keys = Keys(etcd_prefix)
        chain = [{"name": f"q{i}", **({"parent": f"q{i - 1}"} if i else {}), "members": ["*"],
                  "default_for": ["*"] if i == 1199 else [], "gpus": {"*": 99999999999999999999 if i == 0 else 0}}
                 for i in range(1200)]
        client = connect(etcd_server.endpoints, timeout_s=2.0)
        try:
            client.txn([], [op_put(keys.queues, json.dumps({"queue": chain}).encode())])
            cluster.start_coordinator("c1")
            cluster.wait_leader("c1")
            moved = [kv.key for kv in client.range_prefix(keys.quarantine_prefix)[0]]
            assert [k.rsplit("@", 1)[0] for k in moved] == [keys.quarantine_prefix + "queues"]
            assert client.get(keys.queues) is None
        finally:
            client.close()
        queues = cluster.ctl_json("queues")
        assert queues["managed"] is False and [q["name"] for q in queues["queues"]] == ["default"]
        assert keys.queues in cluster.ctl_json("status")["quarantined_keys"]
        with urllib.request.urlopen(f"http://{cluster.metrics_address('c1')}/metrics", timeout=5) as resp:
            assert resp.status == 200 and 'gptrm_etcd_quarantined_total{prefix="queues"} 1.0' in resp.read().decode()
        cluster.start_agent("n1", *ROOT_TASKS_AGENT)
        task = cluster.submit(*ROOT_TASKS_SUBMIT, "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1", "--", "true")
        wait_until(lambda: cluster.task(task)["state"] == "succeeded", timeout_s=30, what="a task scheduled and run")


class _Witness(Queue):
    """A queue that notes the thread each validation of it runs on."""

    threads: ClassVar[set[int]] = set()

    def validate(self, where: str) -> None:
        _Witness.threads.add(threading.get_ident())
        super().validate(where)


def test_set_queue_validates_the_tree_off_the_event_loop(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """SetQueue's work that grows with the tree (building and validating it whole) runs in a worker thread, so
    the leader's event loop keeps serving (heartbeats, GetStatus) however large the tree is."""
    keys = Keys(etcd_prefix)
    stored = {"queue": [{"name": f"q{i}", "members": ["*"]} for i in range(MAX_QUEUES - 1)]}
    client = connect(etcd_server.endpoints, timeout_s=2.0)
    try:
        client.txn([], [op_put(keys.queues, json.dumps(stored).encode())])
    finally:
        client.close()

    async def scenario(app: App) -> None:
        assert len(app.queue_admin.views().queues) == MAX_QUEUES - 1
        loop_thread = threading.get_ident()
        _Witness.threads.clear()
        done = await app.queue_admin.set(_Witness("last", gpus={"*": 1}, members=("*",)))
        assert done.queue.name == "last" and done.existing_work == "No existing task changed queue."
        assert _Witness.threads and loop_thread not in _Witness.threads
        with pytest.raises(ValidationError) as excinfo:       # one more is past the bound, named
            await app.queue_admin.set(Queue("one-too-many"))
        assert excinfo.value.field == "queue" and f"at most {MAX_QUEUES}" in excinfo.value.problem

    asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario))
