"""Several coordinator processes on one real etcd: election, failover, fencing, chaos."""

from __future__ import annotations

import signal
import time
import uuid

import grpc
import pytest

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from tests.integration.harness import Cluster, assert_gpus_held_once, wait_until


def _leaders(c: Cluster, names: list[str]) -> list[str]:
    out = []
    for n in names:
        if not c.proc(n).alive:
            continue
        try:
            if c.status(n).is_leader:
                out.append(n)
        except grpc.RpcError:
            pass
    return out


def _one_leader(c: Cluster, names: list[str], timeout_s: float = 20.0) -> str:
    return wait_until(lambda: (ls := _leaders(c, names)) and len(ls) == 1 and ls[0], timeout_s, 0.05, "one leader")


def _leader_and_standby(c: Cluster) -> tuple[str, str]:
    """Coordinators c1 and c2 started: (the one that leads, the other)."""
    names = ["c1", "c2"]
    for n in names:
        c.start_coordinator(n)
    leader = _one_leader(c, names)
    return leader, next(n for n in names if n != leader)


class TestElection:
    def test_kill9_failover(self, cluster: Cluster) -> None:
        """With two replicas exactly one leads; after kill -9 of the leader the standby leads (how fast is
        measured by tests/bench/bench_failover.py)."""
        names = ["c1", "c2"]
        for n in names:
            cluster.start_coordinator(n)
        leader = _one_leader(cluster, names)
        for _ in range(20):   # polled repeatedly: never two leaders
            assert len(_leaders(cluster, names)) == 1
        survivor = next(n for n in names if n != leader)
        cluster.proc(leader).kill()
        wait_until(lambda: _leaders(cluster, [survivor]) == [survivor], 30, 0.05, "standby to lead")
        res = cluster.ctl("status", coordinator=cluster.address(survivor))
        assert res.returncode == 0 and f"leader        {survivor}" in res.stdout

    def test_clean_stop_resigns_and_a_standby_takes_over(self, cluster: Cluster) -> None:
        """A leader that stops cleanly resigns (deletes its key rather than leaving it to expire), and one of
        two standbys leads (how fast is measured by tests/bench/bench_failover.py)."""
        names = ["c1", "c2", "c3"]
        for n in names:
            cluster.start_coordinator(n)
        leader = _one_leader(cluster, names)
        cluster.proc(leader).stop()
        assert '"event": "leadership_resigned"' in cluster.proc(leader).log(), cluster.proc(leader).tail()
        rest = [n for n in names if n != leader]
        new = _one_leader(cluster, rest, timeout_s=30)
        assert new in rest
        status = cluster.status(next(n for n in rest if n != new))
        assert status.leader_id == new and not status.is_leader

    def test_standby_redirects_writes(self, cluster: Cluster) -> None:
        """A standby refuses writes with the leader's address, and gptrmctl follows it."""
        leader, standby = _leader_and_standby(cluster)
        wait_until(lambda: cluster.status(standby).leader_id == leader, 20, 0.1, "standby to see the leader")
        with pytest.raises(grpc.RpcError) as err:
            cluster.admin(standby).SetPolicy(types_pb2.Policy(name="load-balancing", threshold=0.8), timeout=5)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert ("gptrm-leader-address", cluster.address(leader)) in tuple(err.value.trailing_metadata())
        res = cluster.ctl("policy", "set", "load-balancing", "--threshold", "0.8",
                          coordinator=cluster.address(standby))
        assert res.returncode == 0, res.stderr
        assert cluster.admin(leader).GetPolicy(admin_pb2.GetPolicyRequest(), timeout=5).name == "load-balancing"


class TestFencing:
    def test_paused_leader_cannot_write(self, cluster: Cluster) -> None:
        """A leader stopped (SIGSTOP) past its lease is deposed; resumed, it commits nothing and steps down."""
        names = ["c1", "c2"]
        for n in names:
            cluster.start_coordinator(n)
        old = _one_leader(cluster, names)
        new = next(n for n in names if n != old)
        cluster.proc(old).signal(signal.SIGSTOP)
        wait_until(lambda: _leaders(cluster, [new]) == [new], 10, 0.05, "standby to lead")
        cluster.admin(new).SetPolicy(types_pb2.Policy(name="power-efficient", threshold=0.7), timeout=5)
        cluster.proc(old).signal(signal.SIGCONT)
        try:
            cluster.admin(old).SetPolicy(types_pb2.Policy(name="round-robin", threshold=0.5), timeout=5)
        except grpc.RpcError as e:
            assert e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE)
        wait_until(lambda: not cluster.status(old).is_leader, 5, 0.05, "old leader to step down")
        policy = cluster.admin(new).GetPolicy(admin_pb2.GetPolicyRequest(), timeout=5)
        assert (policy.name, round(policy.threshold, 2)) == ("power-efficient", 0.7)
        assert _leaders(cluster, names) == [new]


class TestChaos:
    @pytest.mark.faults   # a minute of leader kills: a fault scenario, run by `make test-faults`
    def test_twenty_leader_kills(self, cluster: Cluster) -> None:
        """20 leader kills during continuous submits: every task exists once, no GPU is double-booked, states legal."""
        names = ["c1", "c2", "c3"]
        for n in names:
            cluster.start_coordinator(n, "--task-grace", "60")
        _one_leader(cluster, names)
        cluster.start_agent("n1", coordinators=[cluster.address(n) for n in names])
        cluster.start_agent("n2", coordinators=[cluster.address(n) for n in names])
        submitted: dict[str, str] = {}   # request id → task id
        kills = 0
        while kills < 20:
            for _ in range(3):
                rid = uuid.uuid4().hex
                res = None
                for _attempt in range(100):
                    res = cluster.ctl("-o", "json", "--timeout", "3", "submit", "--request-id", rid, "--gpus", "1",
                                      "--gpu-mem-gib", "1", "--cpu", "0.1", "--", "sleep", "0.3")
                    if res.returncode == 0:
                        break
                    time.sleep(0.1)
                assert res is not None and res.returncode == 0, res.stderr if res else ""
                submitted[rid] = res.stdout
            leader = _one_leader(cluster, names)
            cluster.proc(leader).kill()
            kills += 1
            _one_leader(cluster, [n for n in names if n != leader])
            cluster.start_coordinator(leader, "--task-grace", "60")
        leader = _one_leader(cluster, names)
        tasks = cluster.admin(leader).ListTasks(admin_pb2.ListTasksRequest(), timeout=10).tasks
        assert len(tasks) == len(submitted) == 60
        assert len({t.id for t in tasks}) == len(tasks)
        legal = set(types_pb2.TaskState.values()) - {types_pb2.TASK_STATE_UNSPECIFIED}
        assert all(t.state in legal for t in tasks)
        assert_gpus_held_once(list(tasks))


class TestNoRefusalDuringFailover:
    def test_submit_right_after_leader_kill_succeeds_once(self, cluster: Cluster) -> None:
        """A submit issued just after kill -9 of the leader (restarted at once on its address, where it
        answers as a standby naming the dead leader) succeeds in one gptrmctl run, creating one task."""
        names = ["c1", "c2"]
        for n in names:
            cluster.start_coordinator(n)
        _one_leader(cluster, names)
        rids = []
        for _ in range(3):
            leader = _one_leader(cluster, names)
            cluster.proc(leader).kill()
            cluster.start_coordinator(leader)
            rid = uuid.uuid4().hex
            res = cluster.ctl("-o", "json", "--timeout", "25", "submit", "--request-id", rid, "--gpus", "1",
                              "--gpu-mem-gib", "1", "--cpu", "0.1", "--", "true")
            assert res.returncode == 0, res.stderr
            rids.append(rid)
        leader = _one_leader(cluster, names)
        tasks = cluster.admin(leader).ListTasks(admin_pb2.ListTasksRequest(), timeout=10).tasks
        assert len(tasks) == len(rids) == len({t.id for t in tasks})


class TestStandby:
    def test_submit_to_a_standby_with_queues_goes_to_the_leader(self, cluster: Cluster) -> None:
        """A submit sent to a standby only is redirected before the queue is checked (the standby holds no queue
        table): gptrmctl follows it and the leader accepts the task into its queue."""
        leader, standby = _leader_and_standby(cluster)
        wait_until(lambda: cluster.status(standby).leader_id == leader, 20, 0.1, "standby to see the leader")
        res = cluster.ctl("queues", "set", "b", "--gpus", "1", "--members", "*", coordinator=cluster.address(leader))
        assert res.returncode == 0, res.stderr
        task = cluster.ctl_json("submit", "--queue", "b", "--queue-unplaceable", "--gpus", "1", "--", "true",
                                coordinator=cluster.address(standby))
        stored = cluster.admin(leader).GetTask(admin_pb2.GetTaskRequest(task_id=task["task_id"]), timeout=5)
        assert stored.spec.queue == "b"

    def test_a_standby_shows_the_nodes_state(self, cluster: Cluster) -> None:
        """A standby lists a registered node ready (not not-ready), and cordoned once the leader cordoned it."""
        leader, standby = _leader_and_standby(cluster)
        cluster.start_agent("n1")

        def state_on_standby() -> int:
            nodes = cluster.admin(standby).ListNodes(admin_pb2.ListNodesRequest(), timeout=5).nodes
            return nodes[0].state if nodes else 0

        wait_until(lambda: state_on_standby() == types_pb2.NODE_STATE_READY, 30, 0.1, "n1 ready on the standby")
        cluster.admin(leader).CordonNode(admin_pb2.NodeRef(node_id="n1"), timeout=10)
        wait_until(lambda: state_on_standby() == types_pb2.NODE_STATE_CORDONED, 10, 0.1, "n1 cordoned on the standby")
        view = cluster.admin(standby).GetNode(admin_pb2.GetNodeRequest(node_id="n1"), timeout=5)
        assert view.state == types_pb2.NODE_STATE_CORDONED
