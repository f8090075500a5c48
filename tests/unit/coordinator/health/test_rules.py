"""The GPU health rules (coordinator/health/rules.py): fences, their lifting, history, health drains, app XIDs."""

from __future__ import annotations

import pytest

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.health import rules

H, D, U = rules.HEALTHY, rules.DEGRADED, rules.UNHEALTHY


def record(gpus: int = 8) -> types_pb2.NodeRecord:
    return types_pb2.NodeRecord(inventory=types_pb2.NodeInventory(
        node_id="n1", gpus=[types_pb2.GpuInfo(index=i, uuid=f"GPU-{i}") for i in range(gpus)]))


def health(state: int, action: int = 0, reason: str = "", since: float = 0.0) -> types_pb2.GpuHealth:
    return types_pb2.GpuHealth(state=state, action=action, reason=reason, evidence=reason.replace(" ", "="),
                               since_unix_s=since)


class TestEffective:
    def test_older_agent_unhealthy_counts_as_replace(self) -> None:
        """An older agent's healthy=false (no health state) is UNHEALTHY/REPLACE with its health_reason."""
        h = rules.effective(types_pb2.GpuSample(index=2, healthy=False, health_reason="fell off the bus"))
        assert (h.state, h.action, h.reason) == (U, rules.REPLACE, "fell off the bus")
        assert rules.effective(types_pb2.GpuSample(index=2, healthy=True)).state == H

    def test_agent_classification_wins(self) -> None:
        sample = types_pb2.GpuSample(index=1, healthy=False, health=health(D, reason="thermal slowdown"))
        assert rules.effective(sample).state == D


class TestFences:
    def test_unhealthy_gpu_is_fenced_with_history(self) -> None:
        """An UNHEALTHY report fences that GPU only, records it and describes it for pending reasons."""
        r = record()
        changes = rules.apply_reports(r, {3: health(U, rules.REPLACE, "xid 79", since=5.0), 4: health(H)}, 10.0,
                                      uuids={3: "GPU-3"})
        assert [(c.gpu, c.state, c.action) for c in changes] == [(3, "unhealthy", "replace")]
        fence = rules.fence_of(r, 3)
        assert fence is not None and fence.gpu_uuid == "GPU-3" and fence.since_unix_s == 5.0
        assert rules.fence_of(r, 4) is None and list(rules.fenced(r)) == [3]
        assert rules.describe_fence("n1", fence) == "n1 GPU 3 unhealthy: xid 79"
        assert [(e.gpu_index, e.state, e.by) for e in r.gpu_health_history] == [(3, U, "agent")]
        assert rules.apply_reports(r, {3: health(U, rules.REPLACE, "xid 79", since=5.0)}, 11.0) == []

    def test_reset_fence_lifts_itself_replace_does_not(self) -> None:
        """A RESET fence is lifted when the GPU is reported healthy (or degraded); a REPLACE one stays."""
        r = record()
        rules.apply_reports(r, {1: health(U, rules.RESET, "row remap pending"),
                                2: health(U, rules.REPLACE, "xid 79")}, 10.0)
        changes = rules.apply_reports(r, {1: health(D, reason="thermal slowdown"), 2: health(H)}, 20.0)
        assert [(c.gpu, c.state, c.lifted) for c in changes] == [(1, "degraded", True)]
        assert list(rules.fenced(r)) == [2]

    def test_reset_escalates_to_replace(self) -> None:
        r = record()
        rules.apply_reports(r, {1: health(U, rules.RESET, "double-bit ecc")}, 10.0)
        rules.apply_reports(r, {1: health(U, rules.REPLACE, "row remap failure")}, 11.0)
        fence = rules.fence_of(r, 1)
        assert fence is not None and fence.action == rules.REPLACE and fence.reason == "row remap failure"
        assert rules.apply_reports(r, {1: health(H)}, 12.0) == [] and rules.fence_of(r, 1) is not None

    def test_degraded_recorded_on_change_only(self) -> None:
        """DEGRADED is not fenced; history records each change of state, not each report."""
        r = record()
        assert [c.state for c in rules.apply_reports(r, {0: health(D, reason="thermal slowdown")}, 1.0)] == ["degraded"]
        assert rules.apply_reports(r, {0: health(D, reason="thermal slowdown")}, 2.0) == []
        assert [c.state for c in rules.apply_reports(r, {0: health(H)}, 3.0)] == ["healthy"]
        assert not r.gpu_fences and len(r.gpu_health_history) == 2

    def test_history_is_bounded(self) -> None:
        r = record()
        for t in range(40):
            rules.apply_reports(r, {0: health(D if t % 2 == 0 else H)}, float(t))
        assert len(r.gpu_health_history) == rules.HISTORY_MAX
        assert r.gpu_health_history[-1].time_unix_s == 39.0


class TestResume:
    def test_resume_lifts_named_fences_and_records_the_admin(self) -> None:
        r = record()
        rules.apply_reports(r, {3: health(U, rules.REPLACE, "xid 79", since=5.0),
                                5: health(U, rules.REPLACE, "gpu lost", since=5.0)}, 10.0)
        changes = rules.apply_resume(r, [3], "alice", 20.0)
        assert [(c.gpu, c.by, c.lifted) for c in changes] == [(3, "alice", True)]
        assert list(rules.fenced(r)) == [5]
        assert r.gpu_health_history[-1].by == "alice" and r.gpu_health_history[-1].state == H

    def test_resumed_episode_is_not_fenced_again_a_new_one_is(self) -> None:
        """The agent still reports the episode the admin cleared: no new fence; a fault after the resume: fenced."""
        r = record()
        rules.apply_reports(r, {3: health(U, rules.REPLACE, "xid 79", since=5.0)}, 10.0)
        rules.apply_resume(r, [], "alice", 20.0)
        assert rules.apply_reports(r, {3: health(U, rules.REPLACE, "xid 79", since=5.0)}, 21.0) == []
        assert not r.gpu_fences
        assert rules.apply_reports(r, {3: health(U, rules.REPLACE, "xid 79", since=25.0)}, 26.0)
        assert list(rules.fenced(r)) == [3]

    def test_bad_indices_change_nothing(self) -> None:
        r = record(4)
        rules.apply_reports(r, {1: health(U, rules.REPLACE, "xid 79")}, 10.0)
        before = r.SerializeToString()
        with pytest.raises(ValidationError, match=r"gpu_indices.*no GPU 9"):
            rules.apply_resume(r, [1, 9], "alice", 20.0)
        with pytest.raises(ValidationError, match=r"gpu_indices.*GPU 2 is not fenced"):
            rules.apply_resume(r, [2], "alice", 20.0)
        assert r.SerializeToString() == before
        rules.apply_resume(r, [], "alice", 20.0)
        with pytest.raises(ValidationError, match=r"node_id.*no fenced GPU"):
            rules.apply_resume(r, [], "alice", 21.0)


class TestDrain:
    def test_drain_at_n_fences_and_lift(self) -> None:
        r = record()
        rules.apply_reports(r, {0: health(U, rules.RESET, "xid 48")}, 1.0)
        assert rules.drain_cause(r, None, 2) == ""
        rules.apply_reports(r, {0: health(U, rules.RESET, "xid 48"), 1: health(U, rules.RESET, "xid 48")}, 2.0)
        assert rules.drain_cause(r, None, 2) == "2 GPUs unhealthy" and rules.drain_cause(r, None, 0) == ""
        change = rules.apply_drain(r, rules.drain_cause(r, None, 2))
        assert change is not None and r.health_drained and r.health_drain_reason == "2 GPUs unhealthy"
        assert rules.apply_drain(r, "2 GPUs unhealthy") is None

    def test_failed_check_drains_with_its_message_and_never_touches_an_admin_drain(self) -> None:
        r = record()
        r.draining = True   # an admin's
        failed = types_pb2.NodeHealthCheck(state=types_pb2.HEALTH_CHECK_STATE_FAILED, message="ERROR: nvlink down")
        rules.apply_drain(r, rules.drain_cause(r, failed, 2))
        assert r.health_drained and r.health_drain_reason == "ERROR: nvlink down"
        ok = types_pb2.NodeHealthCheck(state=types_pb2.HEALTH_CHECK_STATE_OK)
        change = rules.apply_drain(r, rules.drain_cause(r, ok, 2))
        assert change is not None and change.state == "undrained"
        assert not r.health_drained and r.draining


def test_app_xids_bounded_and_deduplicated() -> None:
    task = types_pb2.Task(id="t1")
    for t in range(20):
        assert rules.add_app_xid(task, types_pb2.AppXid(time_unix_s=float(t), node_id="n1", gpu_index=0, xid=13))
    assert not rules.add_app_xid(task, types_pb2.AppXid(time_unix_s=19.0, node_id="n1", gpu_index=0, xid=13))
    assert len(task.app_xids) == rules.APP_XIDS_MAX and task.app_xids[0].time_unix_s == 4.0
