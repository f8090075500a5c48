"""Finished tasks are removed from etcd after their retention time or beyond the retained count."""

from __future__ import annotations

import json

from coordinator.etcd_embedded import EtcdCluster
from coordinator.sync import Keys
from coordinator.sync.client import connect
from tests.integration.harness import Cluster, wait_until


def _tasks(c: Cluster) -> list[dict]:
    res = c.ctl("-o", "json", "tasks")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["tasks"]


def _submit(c: Cluster, name: str, *argv: str) -> str:
    res = c.ctl("-o", "json", "submit", "--name", name, "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1", "--",
                *argv)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["task_id"]


class TestFinishedTaskRetention:
    def test_finished_tasks_removed_running_kept(self, cluster: Cluster, etcd_server: EtcdCluster,
                                                 etcd_prefix: str) -> None:
        """With a 1 s retention, finished tasks disappear from the list and from etcd; a running one stays."""
        cluster.start_coordinator("c1", "--finished-retention", "1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        done = [_submit(cluster, f"quick{i}", "true") for i in range(3)]
        running = _submit(cluster, "long", "sleep", "60")
        wait_until(lambda: {t["task_id"] for t in _tasks(cluster)} == {running}, what="finished tasks removed")
        client = connect(etcd_server.endpoints, timeout_s=2.0)
        try:
            keys = Keys(etcd_prefix)
            stored = [kv.key for kv in client.range_prefix(keys.tasks_prefix)[0]]
            assert stored == [keys.task(running)]
            assert all(client.get(keys.allocation(t)) is None for t in done)
        finally:
            client.close()
        assert "task_removed" in cluster.proc("c1").log()

    def test_count_bound(self, cluster: Cluster) -> None:
        """With at most one finished task retained, only the newest finished task stays listed."""
        cluster.start_coordinator("c1", "--finished-retention", "3600", "--finished-retention-count", "1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        ids = []
        for i in range(3):
            ids.append(_submit(cluster, f"q{i}", "true"))
            wait_until(lambda: any(t["task_id"] == ids[-1] and t["state"] == "succeeded" for t in _tasks(cluster)),
                       what="task finished")
        wait_until(lambda: [t["task_id"] for t in _tasks(cluster)] == [ids[-1]], what="only the newest kept")
