"""GPU and node health as gptrmctl shows it (coordinator/ctl/render.py, human.py): the HEALTH column, each GPU's
state, reason, evidence and history in ``nodes NODE``, health events, a task's fault moves and application XIDs;
every ``-o json`` document validates against its schema."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.ctl import human, render
from coordinator.ctl.jsondoc import enum_labels, load_schemas
from tests.helpers.ctl_schema import validate

NOW = 2.0e9
G = types_pb2.GpuHealthState
C = types_pb2.HealthCheckState
_NHC = "ERROR:  nhc:  Health check failed:  check_hw_ib:  Device ib0 not found"


def now() -> float:
    return NOW


def view(gpus: int = 4, *, sample: bool = True) -> admin_pb2.NodeView:
    """A ready node whose agent reports every GPU healthy (when ``sample``)."""
    inv = types_pb2.NodeInventory(node_id="n1", hostname="h", cpu_cores=64, gpu_backend="nvml")
    for i in range(gpus):
        inv.gpus.add(index=i, uuid=f"GPU-{i}", model="H100-80GB", mem_total_bytes=80 << 30, power_limit_w=700)
    v = admin_pb2.NodeView(record=types_pb2.NodeRecord(inventory=inv), state=types_pb2.NODE_STATE_READY)
    if sample:
        v.has_latest = True
        v.latest.time_unix_s = NOW
        for i in range(gpus):
            v.latest.gpus.add(index=i, uuid=f"GPU-{i}", healthy=True).health.state = G.GPU_HEALTH_STATE_HEALTHY
    return v


def degraded(v: admin_pb2.NodeView, index: int, reason: str = "thermal slowdown") -> admin_pb2.NodeView:
    v.latest.gpus[index].health.CopyFrom(types_pb2.GpuHealth(
        state=G.GPU_HEALTH_STATE_DEGRADED, reason=reason, evidence="clocks_event_reasons=0x40", since_unix_s=NOW - 300))
    return v


def unhealthy(v: admin_pb2.NodeView, index: int, reason: str = "xid 79", *,
              simulated: bool = False) -> admin_pb2.NodeView:
    v.latest.gpus[index].health.CopyFrom(types_pb2.GpuHealth(
        state=G.GPU_HEALTH_STATE_UNHEALTHY, action=types_pb2.GPU_HEALTH_ACTION_REPLACE, reason=reason,
        evidence="xid=79", since_unix_s=NOW - 120, simulated=simulated))
    return v


def fence(v: admin_pb2.NodeView, index: int, reason: str = "xid 79") -> admin_pb2.NodeView:
    v.record.gpu_fences.add(gpu_index=index, gpu_uuid=f"GPU-{index}", action=types_pb2.GPU_HEALTH_ACTION_REPLACE,
                            reason=reason, evidence="xid=79", since_unix_s=NOW - 120)
    return v


def check(v: admin_pb2.NodeView, state: types_pb2.HealthCheckState, message: str = "",
          exit_code: int = 0) -> admin_pb2.NodeView:
    v.latest.health_check.CopyFrom(types_pb2.NodeHealthCheck(state=state, message=message, ran_unix_s=NOW - 30,
                                                             exit_code=exit_code))
    return v


def drained(v: admin_pb2.NodeView, reason: str) -> admin_pb2.NodeView:
    v.record.health_drained = True
    v.record.health_drain_reason = reason
    return v


def older_agent_lost(v: admin_pb2.NodeView, index: int) -> admin_pb2.NodeView:
    """An agent without the health classification: only ``healthy=false`` and its reason."""
    g = v.latest.gpus[index]
    g.ClearField("health")
    g.healthy = False
    g.health_reason = "GPU is lost"
    return v


Setup = Callable[[admin_pb2.NodeView], object]


class TestSummary:
    @pytest.mark.parametrize(("setup", "summary"), [
        (lambda v: None, "ok"),
        (lambda v: check(v, C.HEALTH_CHECK_STATE_OK, "fine"), "ok"),
        (lambda v: check(v, C.HEALTH_CHECK_STATE_PENDING), "check pending"),
        (lambda v: check(v, C.HEALTH_CHECK_STATE_FAILED, _NHC, 1), f"check failed: {_NHC}"),
        (lambda v: check(v, C.HEALTH_CHECK_STATE_FAILED, "", 3), "check failed: exit code 3"),
        (lambda v: degraded(v, 1), "GPU 1 degraded: thermal slowdown"),
        (lambda v: (degraded(v, 1), degraded(v, 2, "power brake")), "2 GPUs degraded (1, 2)"),
        (lambda v: unhealthy(v, 3), "GPU 3 unhealthy: xid 79"),
        (lambda v: unhealthy(v, 3, simulated=True), "GPU 3 unhealthy: xid 79 (simulated)"),
        (lambda v: (unhealthy(v, 0), unhealthy(v, 2, "row remap failure")), "2 GPUs unhealthy (0, 2)"),
        (lambda v: fence(v, 2), "GPU 2 unhealthy: xid 79"),   # fenced while its agent sees it healthy again
        (lambda v: older_agent_lost(v, 0), "GPU 0 unhealthy: GPU is lost"),
        (lambda v: (drained(v, f"health check failed: {_NHC}"), check(v, C.HEALTH_CHECK_STATE_FAILED, _NHC, 1)),
         f"drained: health check failed: {_NHC}"),
        (lambda v: (unhealthy(v, 3), degraded(v, 1), check(v, C.HEALTH_CHECK_STATE_FAILED, "disk full", 1)),
         "GPU 3 unhealthy: xid 79; check failed: disk full; GPU 1 degraded: thermal slowdown"),
    ])
    def test_one_function_from_the_node_view(self, setup: Setup, summary: str) -> None:
        """The summary reads the fences, the health drain and the latest sample's GPU health and health check; it
        is the JSON's health.summary and the table's HEALTH cell."""
        v = view()
        setup(v)
        doc = render.node_dict(v)
        validate(doc, "node")
        assert render.health_summary(v) == doc["health"]["summary"] == summary
        row = human.nodes_table([doc], wide=True).splitlines()[1]
        assert summary in row

    def test_unknown_before_any_sample(self) -> None:
        doc = render.node_dict(view(sample=False))
        validate(doc, "node")
        assert doc["health"]["summary"] == "unknown" and doc["health"]["check"] is None
        assert doc["gpus"][0]["health"]["state"] == "unknown"

    def test_table_cuts_a_long_cell_after_a_word(self) -> None:
        v = view()
        unhealthy(v, 3)
        check(v, C.HEALTH_CHECK_STATE_FAILED, _NHC, 1)
        lines = human.nodes_table([render.node_dict(v)]).splitlines()
        assert lines[0].split()[:3] == ["NODE", "STATE", "HEALTH"]
        cell = re.split(r"\s{2,}", lines[1])[2]
        assert cell.startswith("GPU 3 unhealthy: xid 79; check") and cell.endswith("…")
        assert len(cell) <= human.HEALTH_WIDTH


class TestNodeDetail:
    def _view(self) -> admin_pb2.NodeView:
        v = view()
        degraded(v, 1)
        fence(v, 3)
        unhealthy(v, 3)
        app = v.latest.gpus[2].health
        app.app_xid_count, app.app_xid_last, app.app_xid_unix_s = 2, 13, NOW - 60
        check(v, C.HEALTH_CHECK_STATE_OK, "all checks passed")
        v.record.gpu_health_history.add(time_unix_s=NOW - 600, gpu_index=3, state=G.GPU_HEALTH_STATE_UNHEALTHY,
                                        reason="xid 79", evidence="xid=79", by="agent")
        v.record.gpu_health_history.add(time_unix_s=NOW - 60, gpu_index=3, state=G.GPU_HEALTH_STATE_HEALTHY,
                                        reason="resumed after repair", by="alice")
        return v

    def test_json(self) -> None:
        """Each GPU's health (fence over sample) and the node's check, fences and history are in -o json."""
        doc = render.node_dict(self._view())
        validate(doc, "node")
        g1, g3 = doc["gpus"][1]["health"], doc["gpus"][3]["health"]
        assert (g1["state"], g1["reason"], g1["fenced"]) == ("degraded", "thermal slowdown", False)
        assert (g3["state"], g3["action"], g3["fenced"], g3["since_unix_s"]) == ("unhealthy", "replace", True,
                                                                                NOW - 120)
        assert doc["gpus"][2]["telemetry"]["health"]["app_xid_last"] == 13
        h = doc["health"]
        assert h["check"]["state"] == "ok" and h["check"]["message"] == "all checks passed"
        assert [f["gpu_index"] for f in h["fences"]] == [3]
        assert [(e["gpu_index"], e["state"], e["by"]) for e in h["history"]] == [(3, "unhealthy", "agent"),
                                                                                 (3, "healthy", "alice")]

    def test_human(self) -> None:
        """Each GPU's state in the GPU table; the GPUs not simply healthy with reason, evidence, since when and
        what brings them back; the history, oldest first."""
        text = human.node_detail(render.node_dict(self._view()), now)
        assert "health        GPU 3 unhealthy: xid 79; GPU 1 degraded: thermal slowdown" in text
        assert "health check  ok, ran 30s ago: all checks passed" in text
        gpu_table = text.split("\n\n")[1].splitlines()
        assert gpu_table[0].split()[-1] == "HEALTH"
        assert [line.split("  ")[-1] for line in gpu_table[1:]] == ["healthy", "degraded", "healthy",
                                                                     "unhealthy (fenced)"]
        health = text.split("gpu health\n", 1)[1].split("\n\n")[0].splitlines()
        assert health[0].split() == ["GPU", "STATE", "REASON", "EVIDENCE", "SINCE", "BACK", "AFTER", "APP", "XIDS"]
        assert health[1].split()[:5] == ["1", "degraded", "thermal", "slowdown", "clocks_event_reasons=0x40"]
        assert "5m ago" in health[1]
        assert "2 (last xid 13, 1m ago)" in health[2]
        assert "xid=79" in health[3] and "repair (gptrmctl gpus resume)" in health[3]
        history = text.split("gpu health history\n", 1)[1].splitlines()
        assert history[1].split() == ["10m", "ago", "3", "unhealthy", "xid", "79", "xid=79", "agent"]
        assert history[2].split() == ["1m", "ago", "3", "healthy", "resumed", "after", "repair", "-", "alice"]

    @pytest.mark.parametrize(("state", "message", "code", "line"), [
        (C.HEALTH_CHECK_STATE_PENDING, "", 0, "pending: no verdict yet since its agent started"),
        (C.HEALTH_CHECK_STATE_FAILED, _NHC, 1, f"failed (exit code 1), ran 30s ago: {_NHC}"),
        (C.HEALTH_CHECK_STATE_FAILED, "timed out after 60 s", -1, "failed (timed out), ran 30s ago: timed out after"),
    ])
    def test_check_verdicts(self, state: types_pb2.HealthCheckState, message: str, code: int,
                            line: str) -> None:
        v = view()
        check(v, state, message, code)
        assert f"health check  {line}" in human.node_detail(render.node_dict(v), now)

    def test_health_drain_and_no_program(self) -> None:
        v = view()
        drained(v, "3 GPUs unhealthy")
        text = human.node_detail(render.node_dict(v), now)
        assert "drained       by health (lifted when health comes back): 3 GPUs unhealthy" in text
        assert "health check" not in text and "gpu health" not in text   # no program, every GPU healthy


class TestEvents:
    def test_schema_knows_every_kind(self) -> None:
        """events -o json: every EventKind the coordinator can send (health included) validates."""
        assert load_schemas()["event.json"]["properties"]["kind"]["enum"] == enum_labels(admin_pb2.EventKind)

    def test_health_event(self) -> None:
        e = admin_pb2.Event(seq=7, time_unix_s=NOW - 5, kind=admin_pb2.EVENT_KIND_HEALTH, node_id="n1", task_id="t1",
                            message="GPU 3 unhealthy (xid 79): task moved", fields={"gpu_index": "3",
                                                                                   "simulated": "true"})
        d = render.event_dict(e)
        validate(d, "event")
        assert human.event_line(d, now).split(None, 4) == [
            "7", "5s", "health", "n1:3", "GPU 3 unhealthy (xid 79): task moved (task t1) [simulated]"]

    def test_other_events_unchanged(self) -> None:
        e = admin_pb2.Event(seq=8, time_unix_s=NOW, kind=admin_pb2.EVENT_KIND_NODE_STATE, node_id="n1",
                            task_id="t1", message="node n1 ready", fields={"gpu_index": "3"})
        assert human.event_line(render.event_dict(e), now).split(None, 4)[3:] == ["n1", "node n1 ready"]


class TestTask:
    def test_fault_moves_and_app_xids(self) -> None:
        t = types_pb2.Task(id="t1", state=types_pb2.TASK_STATE_RUNNING, submit_unix_s=NOW, gpu_fault_moves=2)
        t.spec.argv.append("train")
        t.app_xids.add(time_unix_s=NOW - 5, node_id="n1", gpu_index=2, xid=13)
        d = render.task_dict(t)
        validate(d, "task")
        assert d["gpu_fault_moves"] == 2
        assert d["app_xids"] == [{"time_unix_s": NOW - 5, "node_id": "n1", "gpu_index": 2, "xid": 13}]
        text = human.task_detail(d, now)
        assert "gpu faults    moved 2 time(s) off a GPU that turned unhealthy (not counted as restarts)" in text
        assert "app xids      xid 13 on n1 GPU 2 (5s ago)" in text

    def test_absent_when_none(self) -> None:
        t = types_pb2.Task(id="t1", state=types_pb2.TASK_STATE_RUNNING, submit_unix_s=NOW)
        d = render.task_dict(t)
        validate(d, "task")
        assert (d["gpu_fault_moves"], d["app_xids"]) == (0, [])
        text = human.task_detail(d, now)
        assert "gpu faults" not in text and "app xids" not in text
