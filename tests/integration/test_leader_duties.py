"""The leader's duties under their supervisor, in real coordinator processes on a real etcd.

Faults are injected with ``GPTRM_FAULT_DUTY`` (see ``coordinator.supervisor``): the duty's
end-of-pass hook raises once, or on every pass.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import grpc

from common.pb.gptrm.v1 import admin_pb2
from tests.integration.harness import Cluster, assert_gpus_held_once, wait_until

DUTIES = ("cycle", "power", "reconcile", "qos", "retention", "lost_nodes", "services", "usage",
          "capping", "health", "time_limits")
_SMALL = ("--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1", "--", "sleep", "0.3")


def _duties(c: Cluster, name: str) -> dict[str, dict[str, Any]]:
    res = c.ctl("-o", "json", "status", coordinator=c.address(name))
    assert res.returncode == 0, res.stderr
    return {d["name"]: d for d in json.loads(res.stdout)["leader_duties"]}


def _failures_metric(c: Cluster, name: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{c.metrics_address(name)}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("gptrm_leader_duty_failures_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('duty="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def _recovered(d: dict[str, Any]) -> bool:
    """Failed once, then ran again (a one-shot duty ends ``done`` once its second run completed)."""
    return d["failures"] == 1 and d["last_pass_age_s"] is not None and d["state"] in ("running", "done")


class TestLeaderDutySupervisor:
    def test_each_duty_failing_once_is_restarted_counted_and_shown(self, cluster: Cluster) -> None:
        """Every leader duty raises an unexpected exception once: each is restarted, counted in
        gptrm_leader_duty_failures_total and listed by gptrmctl status; the replica keeps leading and
        schedules afterwards."""
        cluster.start_coordinator("c1", "--power-capping", "on", "--task-grace", "1", "--finished-retention", "8",
                                  "--service-interval", "1",
                                  env={"GPTRM_FAULT_DUTY": ",".join(f"{d}:once" for d in DUTIES)})
        cluster.wait_leader("c1")
        duties = wait_until(lambda: (ds := _duties(cluster, "c1")) and all(_recovered(ds[d]) for d in DUTIES) and ds,
                            60, 0.2, "every duty to fail once and run again")
        assert set(duties) == set(DUTIES)
        assert all(d["last_error"].startswith("InjectedFault") for d in duties.values())
        assert {d: duties[d]["state"] for d in DUTIES} == {**{d: "running" for d in DUTIES}, "reconcile": "done"}
        assert _failures_metric(cluster, "c1") == {d: 1.0 for d in DUTIES}
        assert cluster.status("c1").is_leader
        text = cluster.ctl("status").stdout
        for d in DUTIES:
            assert any(line[14:].split()[:4] == [d, duties[d]["state"], "failures", "1"]
                       for line in text.splitlines()), text
        log = cluster.proc("c1").log()
        assert all(f'"duty": "{d}"' in log or f"duty={d}" in log for d in DUTIES)
        assert "leader_duty_failed" in log and "Traceback" in log
        # The restarted scheduling cycle still places work.
        cluster.start_agent("n1")
        task_id = cluster.submit(*_SMALL)
        wait_until(lambda: cluster.task_in(task_id, "running", "succeeded"), 60, 0.2, "the task to be placed")

    def test_duty_failing_on_every_pass_hands_leadership_to_a_standby(self, cluster: Cluster) -> None:
        """A scheduling cycle that raises on every pass makes c1 give its lease up; c2 takes over and
        every task runs exactly once, no GPU held twice."""
        cluster.start_coordinator("c1", "--task-grace", "60", env={"GPTRM_FAULT_DUTY": "cycle:always"})
        cluster.wait_leader("c1")
        cluster.start_coordinator("c2", "--task-grace", "60")
        addrs = [cluster.address("c1"), cluster.address("c2")]
        cluster.start_agent("n1", coordinators=addrs)
        cluster.start_agent("n2", coordinators=addrs)
        submitted = [cluster.submit(*_SMALL) for _ in range(6)]
        wait_until(lambda: _leads(cluster, "c2"), 60, 0.1, "c2 to take over")
        c1 = wait_until(lambda: (s := cluster.status("c1")) and not s.is_leader and s, 30, 0.1, "c1 to stand by")
        assert c1.leader_id == "c2"
        duties = _duties(cluster, "c1")
        assert duties["cycle"]["state"] == "stopped" and duties["cycle"]["failures"] == 5
        assert _failures_metric(cluster, "c1")["cycle"] == 5.0
        log = cluster.proc("c1").log()
        assert "leader_duty_gave_up" in log and "leader_stepping_down" in log
        assert all(d["failures"] == 0 for d in _duties(cluster, "c2").values())
        assert set(_failures_metric(cluster, "c2").values()) == {0.0}   # every duty's series, at 0
        submitted += [cluster.submit(*_SMALL) for _ in range(2)]
        for tid in submitted:
            wait_until(lambda t=tid: cluster.task_in(t, "succeeded"), 90, 0.2, f"{tid} to succeed")
        tasks = cluster.admin("c2").ListTasks(admin_pb2.ListTasksRequest(), timeout=10).tasks
        assert sorted(t.id for t in tasks) == sorted(submitted)
        assert all(t.restarts == 0 for t in tasks)
        assert_gpus_held_once(list(tasks))
        assert cluster.status("c2").is_leader


def _leads(c: Cluster, name: str) -> bool:
    try:
        return c.status(name).is_leader
    except grpc.RpcError:
        return False
