"""End to end: a real gptrm-agent runs the site's health-check program (agent/health_check.py) and its verdict
reaches the coordinator in the node's latest sample: PENDING until the first run ends, then FAILED with the
program's last line (NHC's own output), then OK once the problem is gone. What the coordinator does with the
verdict (draining the node) is tested with the coordinator's node health. ``gptrmctl nodes`` shows it."""

from __future__ import annotations

from pathlib import Path

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from tests.helpers.health_check import NHC_FAILURE, gated_check
from tests.integration.harness import Cluster, wait_until

S = types_pb2.HealthCheckState


class TestHealthCheckProgram:
    def test_verdict_reaches_the_coordinator(self, cluster: Cluster, tmp_path: Path) -> None:
        check = gated_check(tmp_path)
        program, go, broken = check.program, check.go, check.broken
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1", "--health-check-program", str(program), "--health-check-interval", "1",
                            "--health-check-timeout", "30")
        admin = cluster.admin("c1")

        def check() -> types_pb2.NodeHealthCheck | None:
            try:
                view = admin.GetNode(admin_pb2.GetNodeRequest(node_id="n1"), timeout=5)
            except Exception:   # not registered yet
                return None
            return view.latest.health_check if view.has_latest else None

        def state_is(state: int) -> types_pb2.NodeHealthCheck | None:
            found = check()
            return found if found is not None and found.state == state else None

        wait_until(lambda: state_is(S.HEALTH_CHECK_STATE_PENDING), what="PENDING before the first verdict")
        go.touch()
        failed = wait_until(lambda: state_is(S.HEALTH_CHECK_STATE_FAILED), what="the FAILED verdict")
        assert failed is not None and (failed.message, failed.exit_code) == (NHC_FAILURE, 1)
        doc = cluster.ctl_json("nodes", "n1")
        assert (doc["health"]["check"]["state"], doc["health"]["check"]["message"]) == ("failed", NHC_FAILURE)
        assert NHC_FAILURE in doc["health"]["summary"]
        table = cluster.ctl("-o", "wide", "nodes")
        assert table.returncode == 0 and "HEALTH" in table.stdout and NHC_FAILURE in table.stdout
        broken.unlink()
        ok = wait_until(lambda: state_is(S.HEALTH_CHECK_STATE_OK), what="the OK verdict")
        assert ok is not None and (ok.message, ok.exit_code) == ("all checks passed", 0)
        assert ok.ran_unix_s >= failed.ran_unix_s > 0
