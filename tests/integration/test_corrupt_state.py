"""A coordinator recovering from etcd with corrupt values still leads and serves."""

from __future__ import annotations

import json
import sys
import urllib.request
from dataclasses import dataclass, field

import pytest

from common.pb.gptrm.v1 import types_pb2
from coordinator.etcd_embedded import EtcdCluster
from coordinator.sync import Keys
from coordinator.sync.client import connect, op_put
from tests.integration.harness import AS_ROOT, ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until


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


SLEEPER = "import time; time.sleep(600)"


def _service(*, lo: int = 1, hi: int = 1, service_id: str = "", target_util: float = 0.5) -> types_pb2.Service:
    """A stored one-GPU service record as the controller writes it (``desired`` at MIN)."""
    spec = types_pb2.TaskSpec(name=f"svc-{service_id}", argv=[sys.executable, "-c", SLEEPER],
                              kind=types_pb2.TASK_KIND_INFERENCE, has_demand=True,
                              demand=types_pb2.ResourceVector(gpus=1, cpu_cores=0.1),
                              run_as_user="root" if AS_ROOT else "")
    spec.service.min_replicas, spec.service.max_replicas, spec.service.target_util = lo, hi, target_util
    return types_pb2.Service(id=service_id, spec=spec, desired=lo, reason="created at MIN replicas")


@dataclass(frozen=True)
class Corruption:
    """Values the leader must refuse under one key collection.

    :ivar before: key (below the prefix) → bytes written before the leader takes over.
    :ivar after: key → bytes written once it leads (read on demand, e.g. a submit's request id).
    :ivar bad: keys (below the prefix) expected under ``quarantine/``.
    :ivar good_services: service ids stored alongside that must get their replica.
    :ivar request_ids: submitted once the ``after`` values are written (each must create a task).
    """

    before: dict[str, bytes] = field(default_factory=dict)
    after: dict[str, bytes] = field(default_factory=dict)
    bad: tuple[str, ...] = ()
    good_services: tuple[str, ...] = ()
    request_ids: tuple[str, ...] = ()


GARBAGE = b"\xff\x00 not a protobuf \xff"
_HIST_OK = _service(service_id="s-hist1").SerializeToString()
_HIST_OK2 = _service(service_id="s-hist2").SerializeToString()
CORRUPTIONS = {
    "tasks": Corruption(
        before={"tasks/t-bad": GARBAGE,
                "tasks/t-inv": types_pb2.Task(id="t-inv", state=99).SerializeToString()},
        bad=("tasks/t-bad", "tasks/t-inv")),
    "nodes": Corruption(
        before={"nodes/n-bad": GARBAGE,
                "nodes/n-inv": types_pb2.NodeRecord(inventory=types_pb2.NodeInventory(node_id="n-other"))
                .SerializeToString()},
        bad=("nodes/n-bad", "nodes/n-inv")),
    "allocations": Corruption(
        before={"allocations/t-bad": GARBAGE,
                "allocations/t-inv": types_pb2.Allocation(task_id="t-other").SerializeToString()},
        bad=("allocations/t-bad", "allocations/t-inv")),
    "services": Corruption(
        before={"services/s-bad": GARBAGE,
                "services/s-inv": _service(service_id="s-inv", lo=3, hi=1).SerializeToString(),
                "services/s-ok": _service(service_id="s-ok").SerializeToString()},
        bad=("services/s-bad", "services/s-inv"), good_services=("s-ok",)),
    "service-history": Corruption(
        before={"services/s-hist1": _HIST_OK, "services/s-hist2": _HIST_OK2,
                "service-history/s-hist1": GARBAGE,
                "service-history/s-hist2": types_pb2.ServiceLoadHistory(
                    service_id="s-hist2", bucket_s=60.0, capacity=float("nan")).SerializeToString()},
        bad=("service-history/s-hist1", "service-history/s-hist2"), good_services=("s-hist1", "s-hist2")),
    "policy-garbage": Corruption(before={"policy": GARBAGE}, bad=("policy",)),
    "policy-invalid": Corruption(
        before={"policy": types_pb2.Policy(name="no-such-policy", threshold=0.5).SerializeToString()},
        bad=("policy",)),
    "requests": Corruption(
        after={"requests/r-bad": GARBAGE, "requests/r-inv": b"tasks/../x"},
        bad=("requests/r-bad", "requests/r-inv"), request_ids=("r-bad", "r-inv")),
    "queues-garbage": Corruption(before={"queues": GARBAGE}, bad=("queues",)),
    "queues-invalid": Corruption(   # a limit below the quota: the tree does not validate
        before={"queues": json.dumps({"queue": [{"name": "a", "gpus": {"*": 4}, "limit": {"*": 1}}]}).encode()},
        bad=("queues",)),
}


def _running_replicas(c: Cluster, service_id: str) -> bool:
    res = c.ctl("-o", "json", "tasks", service_id)
    return res.returncode == 0 and any(r["state"] == "running" for r in json.loads(res.stdout)["replicas"])


def _metric(c: Cluster, name: str) -> str:
    with urllib.request.urlopen(f"http://{c.metrics_address('c1')}/metrics", timeout=5) as resp:
        return next((line for line in resp.read().decode().splitlines() if line.startswith(name)), "")


class TestEveryLeaderReadIsQuarantined:
    @pytest.mark.parametrize("case", sorted(CORRUPTIONS))
    def test_corrupt_value_is_moved_aside_and_the_leader_keeps_working(
            self, case: str, cluster: Cluster, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """Garbage bytes and a well-formed value that does not validate, under one collection the leader
        reads: each is moved under quarantine/ with its original bytes (gone from its collection), listed by
        ``gptrmctl status``, counted per collection in /metrics and published as an event; the leader keeps
        its lease, places a task submitted afterwards, and scales a service created afterwards (and the good
        services stored alongside)."""
        corruption = CORRUPTIONS[case]
        keys = Keys(etcd_prefix)
        client = connect(etcd_server.endpoints, timeout_s=2.0)
        try:
            if corruption.before:
                client.txn([], [op_put(etcd_prefix + k, v) for k, v in corruption.before.items()])
            written = {k: client.get(etcd_prefix + k) for k in corruption.before}
            cluster.start_coordinator("c1")
            epoch = cluster.wait_leader("c1").leader_epoch
            cluster.start_agent("n1", *ROOT_TASKS_AGENT)
            wait_until(lambda: "n1" in cluster.ctl("nodes").stdout, what="node n1 registered")
            if corruption.after:
                client.txn([], [op_put(etcd_prefix + k, v) for k, v in corruption.after.items()])
                written |= {k: client.get(etcd_prefix + k) for k in corruption.after}
            requested: dict[str, str] = {}
            for rid in corruption.request_ids:
                res = cluster.ctl("-o", "json", "submit", "--request-id", rid, "--name", rid, "--cpu", "0.1",
                                  "--", "true")
                assert res.returncode == 0, res.stderr
                requested[f"requests/{rid}"] = json.loads(res.stdout)["task_id"]

            res = cluster.ctl("-o", "json", "submit", "--name", "after", "--gpus", "1", "--gpu-mem-gib", "1",
                              "--cpu", "0.1", "--", "true")
            assert res.returncode == 0, res.stderr
            tid = json.loads(res.stdout)["task_id"]
            wait_until(lambda: json.loads(cluster.ctl("-o", "json", "tasks", tid).stdout)["state"] == "succeeded",
                       timeout_s=45, what="a task submitted afterwards to be placed and succeed")
            res = cluster.ctl("-o", "json", "submit", "--name", "llm", "--replicas", "1:1", "--target-util", "0.5",
                              "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1", *ROOT_TASKS_SUBMIT, "--",
                              sys.executable, "-c", SLEEPER)
            assert res.returncode == 0, res.stderr
            services = (json.loads(res.stdout)["service_id"], *corruption.good_services)
            for sid in services:
                wait_until(lambda sid=sid: _running_replicas(cluster, sid), timeout_s=45,
                           what=f"service {sid} to run its replica")

            moved = {kv.key: kv.value for kv in client.range_prefix(keys.quarantine_prefix)[0]}
            for rel in corruption.bad:
                kv = written[rel]
                assert moved.get(f"{keys.quarantine_prefix}{rel}@{kv.mod_revision}") == kv.value, rel
                now = client.get(etcd_prefix + rel)
                if rel == "policy":   # the configured policy took its place
                    assert now is not None and types_pb2.Policy.FromString(now.value).name != "no-such-policy"
                elif rel in requested:   # the request id now names the task its submit created
                    assert now is not None and now.value.decode() == requested[rel]
                else:
                    assert now is None, f"{rel} still in its collection"
        finally:
            client.close()
        bad_keys = sorted(etcd_prefix + rel for rel in corruption.bad)
        status = json.loads(cluster.ctl("-o", "json", "status").stdout)
        assert sorted(status["quarantined_keys"]) == bad_keys
        assert status["is_leader"] and status["leader_id"] == "c1" and status["leader_epoch"] == epoch
        events = [e for e in map(json.loads, cluster.ctl("-o", "json", "events").stdout.splitlines())
                  if e["kind"] == "etcd"]
        assert sorted(e["fields"].get("key") for e in events) == bad_keys
        prefix = corruption.bad[0].split("/")[0]
        assert _metric(cluster, f'gptrm_etcd_quarantined_total{{prefix="{prefix}"}}').endswith(
            f" {float(len(corruption.bad))}")
        log = cluster.proc("c1").log()
        assert log.count("etcd_value_quarantined") == len(corruption.bad)
        assert "service_tick_failed" not in log and "recovery_failed" not in log
        if prefix == "policy":
            assert "policy_fallback" in log
