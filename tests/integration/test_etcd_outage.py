"""etcd unreachable: the leader stops scheduling and writes, serves stale reads, and resumes by itself.

Each test has its own single-member etcd (not the shared one), which it SIGKILLs and restarts
on the same ports with the same data directory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.etcd_embedded import EtcdCluster
from tests.integration.harness import Cluster, wait_until


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    etcd = EtcdCluster(tmp_path / "etcd", size=1).start()
    yield etcd
    etcd.stop()


@pytest.fixture
def outage_cluster(tmp_path: Path, own_etcd: EtcdCluster, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    c = Cluster(tmp_path, own_etcd.endpoints, "/gptrm-outage/")
    yield c
    c.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(c.logs())


def _json(c: Cluster, *args: str) -> dict:
    res = c.ctl("-o", "json", *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _submit(c: Cluster, name: str) -> str:
    return _json(c, "submit", "--name", name, "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1", "--",
                 "sleep", "300")["task_id"]


def _task_state(c: Cluster, task_id: str) -> str:
    return _json(c, "tasks", task_id)["state"]


def _start(c: Cluster, *coordinator_flags: str) -> str:
    c.start_coordinator("c1", "--etcd-timeout", "1", *coordinator_flags)
    c.wait_leader("c1")
    c.start_agent("n1")
    wait_until(lambda: _json(c, "nodes")["nodes"] and _json(c, "nodes")["nodes"][0]["state"] == "ready",
               what="node READY")
    task = _submit(c, "before")
    wait_until(lambda: _task_state(c, task) == "running", what="first task RUNNING")
    return task


def _assert_outage_behaviour(c: Cluster, running: str) -> None:
    """During the outage: reads answer from memory marked stale; a write waits until its deadline (exit 3,
    naming etcd) and stores nothing."""
    status = wait_until(lambda: (s := _json(c, "status"))["stale"] and s, 30, what="status marked stale")
    assert sum(status["tasks_by_state"].values()) == 1, status
    tasks = _json(c, "tasks")
    assert tasks["stale"] is True
    assert [t["task_id"] for t in tasks["tasks"]] == [running]
    table = c.ctl("tasks")
    assert table.returncode == 0 and running in table.stdout and "[stale]" in table.stderr, table
    nodes = _json(c, "nodes")
    assert nodes["stale"] is True and [n["node_id"] for n in nodes["nodes"]] == ["n1"]
    res = c.ctl("-o", "json", "--timeout", "2", "submit", "--name", "during", "--gpus", "1", "--", "sleep", "1")
    assert res.returncode == 3, (res.returncode, res.stdout, res.stderr)   # waited out until its deadline
    assert "etcd" in res.stderr or "leader" in res.stderr, res.stderr


def _assert_resumed(c: Cluster, running: str) -> None:
    """After etcd returns: not stale, leading, the old task untouched, the refused one never stored, new work runs."""
    wait_until(lambda: (s := _json(c, "status"))["is_leader"] and not s["stale"], 60, 0.2, what="recovered leader")
    after = _submit(c, "after")
    wait_until(lambda: _task_state(c, after) == "running", what="task submitted after the outage RUNNING")
    assert _task_state(c, running) == "running"
    names = sorted(t["name"] for t in _json(c, "tasks")["tasks"])
    assert names == ["after", "before"]


class TestEtcdOutage:
    def test_short_outage_keeps_leadership(self, outage_cluster: Cluster, own_etcd: EtcdCluster) -> None:
        """An outage shorter than the lease TTL: the leader stays leader, goes stale, and resumes."""
        c = outage_cluster
        running = _start(c, "--lease-ttl", "30")
        own_etcd.kill_member(0)
        _assert_outage_behaviour(c, running)
        assert _json(c, "status")["is_leader"] is True
        own_etcd.start_member(own_etcd.members[0])
        _assert_resumed(c, running)
        assert "etcd_unreachable" in c.proc("c1").log() and "etcd_recovered" in c.proc("c1").log()

    @pytest.mark.slow
    def test_outage_longer_than_lease(self, outage_cluster: Cluster, own_etcd: EtcdCluster) -> None:
        """An outage past the 2 s lease: the leader steps down, keeps answering reads (stale), and leads
        again once etcd is back, with its running task kept."""
        c = outage_cluster
        running = _start(c)
        own_etcd.kill_member(0)
        _assert_outage_behaviour(c, running)
        wait_until(lambda: not _json(c, "status")["is_leader"], 10, what="leader to step down")
        own_etcd.start_member(own_etcd.members[0])
        _assert_resumed(c, running)
