"""A coordinator recovering from etcd with corrupt values still leads and serves."""

from __future__ import annotations

import json
import urllib.request

from common.etcd_embedded import EtcdCluster
from common.pb.gptrm.v1 import types_pb2
from coordinator.sync import Keys
from coordinator.sync.client import connect, op_put
from tests.integration.harness import Cluster, wait_until


class TestCorruptEtcdValues:
    def test_garbage_task_value_is_quarantined_and_leader_serves(self, cluster: Cluster, etcd_server: EtcdCluster,
                                                                 etcd_prefix: str) -> None:
        """Garbage bytes in tasks/<id> and nodes/<id>: the coordinator moves them under quarantine/, leads,
        reports it as an event, counts it in /metrics, and accepts and runs new work."""
        keys = Keys(etcd_prefix)
        client = connect(etcd_server.endpoints, timeout_s=2.0)
        try:
            good = types_pb2.Task(id="t-good", state=1, spec=types_pb2.TaskSpec(name="kept", argv=["true"]))
            client.txn([], [op_put(keys.task("t-bad"), b"\x08\xff\xff garbage \xff"),
                            op_put(keys.node("n-bad"), b"\xffnot a node"),
                            op_put(keys.task("t-good"), good.SerializeToString())])
            cluster.start_coordinator("c1")
            status = cluster.wait_leader("c1")
            assert status.is_leader and status.leader_id == "c1"
            moved = {kv.key.rsplit("@", 1)[0] for kv in client.range_prefix(keys.quarantine_prefix)[0]}
            assert moved == {keys.quarantine_prefix + "tasks/t-bad", keys.quarantine_prefix + "nodes/n-bad"}
        finally:
            client.close()
        tasks = json.loads(cluster.ctl("-o", "json", "tasks").stdout)["tasks"]
        assert [t["task_id"] for t in tasks] == ["t-good"]
        status = json.loads(cluster.ctl("-o", "json", "status").stdout)
        assert sorted(status["quarantined_keys"]) == sorted([keys.task("t-bad"), keys.node("n-bad")])
        assert "quarantined   2 corrupt etcd value(s)" in cluster.ctl("status").stdout
        events = cluster.ctl("-o", "json", "events")
        assert events.returncode == 0 and "quarantine" in events.stdout
        res = cluster.ctl("-o", "json", "submit", "--name", "after", "--gpus", "1", "--gpu-mem-gib", "1",
                          "--cpu", "0.1", "--", "true")
        assert res.returncode == 0, res.stderr
        cluster.start_agent("n1")
        tid = json.loads(res.stdout)["task_id"]
        wait_until(lambda: json.loads(cluster.ctl("-o", "json", "tasks", tid).stdout)["state"] == "succeeded",
                   what="new task succeeded")
        text = urllib.request.urlopen(f"http://{cluster.metrics_address('c1')}/metrics", timeout=5).read().decode()
        assert 'gptrm_etcd_quarantined_total{prefix="tasks"} 1.0' in text
        assert 'gptrm_etcd_quarantined_total{prefix="nodes"} 1.0' in text
