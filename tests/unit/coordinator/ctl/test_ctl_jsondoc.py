"""gptrmctl's JSON dialect: the converter, the shipped schemas, and the documents render builds."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.ctl import render
from coordinator.ctl.jsondoc import enum_label, load_schemas, proto_dict, proto_schemas
from tests.helpers.ctl_schema import validate


def make_node_view(*, with_telemetry: bool = True) -> admin_pb2.NodeView:
    """A node with two GPUs, GPU 0 idle (all-zero readings) and 64-bit figures everywhere."""
    inv = types_pb2.NodeInventory(node_id="n1", hostname="h", cpu_cores=112, mem_total_bytes=2 << 40,
                                  simulated=True, host_simulated=True, gpu_backend="simulated")
    for i in range(2):
        inv.gpus.add(index=i, uuid=f"GPU-{i}", model="H100-80GB", mem_total_bytes=80 << 30, power_limit_w=700)
    v = admin_pb2.NodeView(record=types_pb2.NodeRecord(inventory=inv), state=types_pb2.NODE_STATE_NOT_READY)
    if with_telemetry:
        v.has_latest = True
        v.latest.time_unix_s = 1.0e9
        v.latest.gpus.add(index=0, uuid="GPU-0", util_gpu=0.0, mem_used_bytes=0, ecc_corrected_total=0, healthy=True)
        v.latest.gpus.add(index=1, uuid="GPU-1", util_gpu=0.5, mem_used_bytes=40 << 30, healthy=True)
        v.latest.host.mem_total_bytes = 2 << 40
    return v


def make_task(kind: int = 0) -> types_pb2.Task:
    """A running task without an explicit demand."""
    t = types_pb2.Task(id="t1", state=types_pb2.TASK_STATE_RUNNING, submit_unix_s=1.0e9)
    t.spec.name = "j"
    t.spec.kind = kind
    t.spec.argv.append("sleep")
    t.demand.gpus = 1
    t.demand.gpu_mem_bytes = 10 << 30
    t.history.add(state=types_pb2.TASK_STATE_PENDING, time_unix_s=1.0e9)
    return t


class TestEnumLabel:
    @pytest.mark.parametrize(("enum", "value", "label"), [
        (types_pb2.TaskKind, types_pb2.TASK_KIND_FINE_TUNING, "fine-tuning"),
        (types_pb2.TaskKind, types_pb2.TASK_KIND_UNSPECIFIED, "unspecified"),
        (types_pb2.TaskState, types_pb2.TASK_STATE_RUNNING, "running"),
        (types_pb2.NodeState, types_pb2.NODE_STATE_NOT_READY, "not-ready"),
        (admin_pb2.EventKind, admin_pb2.EVENT_KIND_SCALE_OUT, "scale-out"),
        (types_pb2.RestartPolicy, types_pb2.RESTART_POLICY_ON_FAILURE, "on-failure"),
        (types_pb2.TaskKind, 42, "42"),
    ])
    def test_one_spelling(self, enum: object, value: int, label: str) -> None:
        """Every enum is written lowercase, prefix removed, words joined by '-'."""
        assert enum_label(enum, value) == label


class TestProtoDict:
    def test_sixty_four_bit_ints_are_numbers(self) -> None:
        """uint64 fields come out as ints, not strings."""
        d = proto_dict(types_pb2.GpuInfo(mem_total_bytes=80 << 30))
        assert d["mem_total_bytes"] == 80 << 30 and isinstance(d["mem_total_bytes"], int)

    def test_zero_fields_present(self) -> None:
        """Fields equal to zero (index 0, false, empty) are present."""
        d = proto_dict(types_pb2.GpuSample(index=0))
        assert d["index"] == 0 and d["healthy"] is False and d["processes"] == [] and d["uuid"] == ""

    def test_unset_optional_is_null(self) -> None:
        """An optional reading that was never set is null; one set to zero is zero."""
        d = proto_dict(types_pb2.GpuSample(util_gpu=0.0))
        assert d["util_gpu"] == 0.0 and d["power_w"] is None

    def test_non_finite_float_is_null(self) -> None:
        """NaN cannot be written as JSON, so it is null."""
        assert proto_dict(types_pb2.ResourceVector(gpus=math.nan))["gpus"] is None

    def test_flagged_message_is_null_when_unset(self) -> None:
        """TaskSpec.demand is null without has_demand, an object with it; the flag itself is not printed."""
        spec = types_pb2.TaskSpec()
        assert proto_dict(spec)["demand"] is None and "has_demand" not in proto_dict(spec)
        spec.has_demand = True
        assert proto_dict(spec)["demand"]["gpus"] == 0.0

    def test_enums_in_nested_messages(self) -> None:
        """Enums inside nested messages use the same labels as top-level fields."""
        d = render.task_dict(make_task(types_pb2.TASK_KIND_INFERENCE))
        assert d["kind"] == d["spec"]["kind"] == "inference"
        assert d["history"][0]["state"] == "pending"


class TestSchemas:
    def test_committed_proto_schema_is_current(self) -> None:
        """schemas/proto.json equals what the descriptors generate (run python -m coordinator.ctl.jsondoc)."""
        assert load_schemas()["proto.json"] == json.loads(json.dumps(proto_schemas()))

    def test_documents_validate(self) -> None:
        """render's documents validate, with and without telemetry, with and without a declared kind."""
        validate(render.node_dict(make_node_view()), "node")
        validate({"nodes": [render.node_dict(make_node_view(with_telemetry=False))], "stale": False}, "nodes")
        validate(render.task_dict(make_task()), "task")
        validate(render.status_dict(admin_pb2.ClusterStatus()), "status")
        validate(render.status_dict(admin_pb2.ClusterStatus(telemetry_rate=admin_pb2.TelemetryRateStatus(
            report_interval_s=10, sampling_interval_s=1, ingest_budget_per_s=3000, ingest_per_s=2990.5,
            reporting_nodes=30000))), "status")
        validate(render.policy_dict(types_pb2.Policy(name="p", threshold=0.9)), "policy")
        validate(render.event_dict(admin_pb2.Event(seq=0, kind=admin_pb2.EVENT_KIND_ETCD)), "event")

    @pytest.mark.parametrize("mutate", [
        lambda d: d["gpus"][0].update(mem_total_bytes=str(d["gpus"][0]["mem_total_bytes"])),
        lambda d: d["gpus"][0]["telemetry"].pop("index"),
        lambda d: d.update(state="NODE_STATE_READY"),
        lambda d: d.update(nodeId="n1"),
    ])
    def test_schema_rejects_other_dialects(self, mutate: object) -> None:
        """Ints as strings, a dropped zero field, proto enum names and camelCase keys all fail validation."""
        doc = render.node_dict(make_node_view())
        mutate(doc)  # type: ignore[operator]
        with pytest.raises(jsonschema.ValidationError):
            validate(doc, "node")


class TestJsonAlwaysValid:
    def test_status_with_nan_is_valid_json(self) -> None:
        """A status whose objectives or threshold are NaN or infinite still dumps as strict JSON (null)."""
        s = admin_pb2.ClusterStatus(coordinator_id="c1")
        s.objectives.energy_j = math.nan
        s.policy.threshold = math.inf
        text = render.dump_json(render.status_dict(s))
        doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
        assert doc["policy"]["threshold"] is None
