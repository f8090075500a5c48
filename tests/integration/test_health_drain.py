"""End to end, real processes: the leader drains a node whose agent's site health check fails (coordinator/health),
with the check's last line as the reason, lifts only its own drain when the check passes again (an admin's drain
stays), and places nothing on the node while the check has no verdict yet."""

from __future__ import annotations

from pathlib import Path

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from tests.helpers.health_check import NHC_FAILURE, gated_check
from tests.integration.harness import Cluster, wait_until


class TestHealthDrain:
    def test_failed_check_drains_passing_lifts_only_its_own_drain(self, cluster: Cluster, tmp_path: Path) -> None:
        check = gated_check(tmp_path)
        program, go, broken = check.program, check.go, check.broken
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1", "--health-check-program", str(program), "--health-check-interval", "1",
                            "--health-check-timeout", "30")
        admin = cluster.admin("c1")

        def record() -> types_pb2.NodeRecord | None:
            try:
                return admin.GetNode(admin_pb2.GetNodeRequest(node_id="n1"), timeout=5).record
            except Exception:   # not registered yet
                return None

        wait_until(record, what="n1 registered")
        task = cluster.submit("--name", "waits", "--gpus", "1", "--cpu", "0.1", "--", "sleep", "600")
        wait_until(lambda: "n1 health check pending" in cluster.task(task)["reason"], what="pending check named")
        assert cluster.task(task)["state"] == "pending"

        go.touch()
        drained = wait_until(lambda: (r := record()) is not None and r.health_drained and r, what="health drain")
        assert drained.health_drain_reason == NHC_FAILURE and not drained.draining
        wait_until(lambda: f"n1 drained by health: {NHC_FAILURE}" in cluster.task(task)["reason"],
                   what="the drain named in the reason")
        assert cluster.ctl("drain", "n1").returncode == 0          # an admin's drain on top

        broken.unlink()
        lifted = wait_until(lambda: (r := record()) is not None and not r.health_drained and r, what="drain lifted")
        assert lifted.draining and lifted.cordoned                   # the admin's drain stays
        assert cluster.task(task)["state"] == "pending"
        assert cluster.ctl("uncordon", "n1").returncode == 0
        wait_until(lambda: cluster.task_in(task, "running"), what="the task runs once the admin uncordons")
        events = cluster.ctl("events").stdout
        assert "drained by health" in events and "undrained by health" in events
