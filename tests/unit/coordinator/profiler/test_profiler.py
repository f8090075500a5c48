"""Tests for the GPT Task Profiler, spec validation and spec parsing (coordinator/profiler.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskKind
from coordinator.domain import ModelSpecData, QosData, Resources, TaskSpecData
from coordinator.profiler.profiler import (
    Profiler,
    estimate_gpu_memory_bytes,
    model_shape,
    spec_data,
    spec_from_mapping,
    spec_to_proto,
    validate_spec,
)

GIB = 1024**3


def make_spec(
    kind: TaskKind = TaskKind.INFERENCE,
    params_b: float = 7.0,
    *,
    precision: str = "bf16",
    context: int = 4096,
    batch: int = 1,
    layers: int = 32,
    hidden: int = 4096,
    **kwargs: Any,
) -> TaskSpecData:
    """A plain spec for a model of ``params_b`` billion parameters (LLaMA-7B shape by default)."""
    model = ModelSpecData("llama", params_b, precision, context, batch, layers, hidden)
    return TaskSpecData(name="t", kind=kind, model=model, argv=("python", "serve.py"), **kwargs)


class TestMemoryEstimate:
    """The documented formulas, checked by hand."""

    @pytest.mark.parametrize(
        ("kind", "precision", "expected"),
        [
            # weights 7e9 · 2 = 14e9; KV 2 · 32 · 4096 · 4096 · 1 · 2 = 2,147,483,648
            (TaskKind.INFERENCE, "bf16", 14e9 + 2 * 32 * 4096 * 4096 * 2),
            # int4: weights 7e9 · 0.5 = 3.5e9; KV 2 · 32 · 4096 · 4096 · 0.5
            (TaskKind.INFERENCE, "int4", 3.5e9 + 2 * 32 * 4096 * 4096 * 0.5),
            # Adam 16 · 7e9 = 112e9; activations 34 · 32 · 4096 · 4096 · 1
            (TaskKind.TRAINING, "bf16", 112e9 + 34 * 32 * 4096 * 4096),
            # LoRA: frozen 14e9 + 0.01 · 16 · 7e9 = 1.12e9 + the same activations
            (TaskKind.FINE_TUNING, "bf16", 14e9 + 1.12e9 + 34 * 32 * 4096 * 4096),
        ],
    )
    def test_formulas(self, kind: TaskKind, precision: str, expected: float) -> None:
        """Weights, KV cache, optimizer state and activations add up as documented."""
        assert estimate_gpu_memory_bytes(make_spec(kind, precision=precision)) == pytest.approx(expected)

    @pytest.mark.parametrize(("params_b", "layers", "hidden"), [(7, 33, 4224), (70, 71, 9088), (1, 17, 2176)])
    def test_shape_estimate(self, params_b: float, layers: int, hidden: int) -> None:
        """Unknown layers/hidden come from P ≈ 12·L·H² with H = 128·L."""
        assert model_shape(params_b) == (layers, hidden)
        assert model_shape(7, 32, 0) == (32, 4224) and model_shape(7, 0, 4096) == (35, 4096)


class TestProfile:
    """Demand vectors: GPU rounding, shares, gangs, host defaults, overrides, QoS."""

    def test_inference_fits_one_gpu(self) -> None:
        """A 7B bf16 inference needs 16.1e9 · 1.1 bytes: one 80 GiB GPU with 1 GiB of context on top."""
        profile = Profiler().profile(make_spec())
        total = (14e9 + 2 * 32 * 4096 * 4096 * 2) * 1.1
        assert profile.demand.gpus == 1.0
        assert profile.gpu_mem_per_gpu_bytes == math.ceil(total) + GIB
        assert profile.demand.gpu_mem_total_bytes == profile.gpu_mem_per_gpu_bytes
        # 2 + 4 cores per GPU; 16 GiB + weights + 8 GiB per GPU; 10 GiB + weights of disk.
        assert profile.demand.cpu_cores == 6.0
        assert profile.demand.mem_bytes == math.ceil(24 * GIB + 14e9)
        assert profile.demand.disk_bytes == math.ceil(10 * GIB + 14e9)

    def test_shared_inference_gets_a_sixteenth_multiple(self) -> None:
        """With sharing, 17.7e9 + 1 GiB of 80 GiB = 0.218… → 4/16 of a GPU."""
        profile = Profiler().profile(make_spec(allow_gpu_sharing=True))
        assert profile.demand.gpus == 0.25 and profile.allow_sharing
        assert profile.demand.cpu_cores == 4.0

    def test_training_rounds_to_a_power_of_two(self) -> None:
        """7B training: (112e9 + 18.3e9) · 1.1 = 143 GB > 79 GiB usable → 2 GPUs."""
        profile = Profiler().profile(make_spec(TaskKind.TRAINING))
        assert profile.demand.gpus == 2.0
        # 70B training needs ceil(1.3 TB / 79 GiB) = 16 GPUs; on one node that rounds to 16.
        assert Profiler().profile(make_spec(TaskKind.TRAINING, 70.0, layers=80, hidden=8192)).demand.gpus == 16.0

    def test_gang_spreads_gpus_over_nodes(self) -> None:
        """A 70B training gang of 2 nodes takes 16 / 2 = 8 GPUs per node."""
        spec = make_spec(TaskKind.TRAINING, 70.0, layers=80, hidden=8192, nodes=2)
        profile = Profiler().profile(spec)
        assert (profile.nodes, profile.demand.gpus) == (2, 8.0)
        assert profile.gpu_mem_per_gpu_bytes <= 80 * GIB

    def test_gpus_per_node_is_respected(self) -> None:
        """gpus_per_node fixes the count; memory is divided over all GPUs of the gang."""
        profile = Profiler().profile(make_spec(TaskKind.TRAINING, gpus_per_node=4))
        assert profile.demand.gpus == 4.0 and profile.demand.gpu_mem_total_bytes == 4 * profile.gpu_mem_per_gpu_bytes

    def test_explicit_demand_overrides_set_fields(self) -> None:
        """Non-zero explicit fields win; zero fields keep the profile."""
        explicit = Resources(gpus=2.0, gpu_mem_total_bytes=2 * 30 * GIB, cpu_cores=0.0, mem_bytes=0, disk_bytes=5 * GIB)
        profile = Profiler().profile(make_spec(demand=explicit))
        assert profile.demand.gpus == 2.0 and profile.gpu_mem_per_gpu_bytes == 30 * GIB
        assert profile.demand.disk_bytes == 5 * GIB and profile.demand.cpu_cores == 6.0

    def test_qos_requirements(self) -> None:
        """Zero QoS fields mean no target; priority is carried over."""
        spec = make_spec(priority=5, qos=QosData(deadline_unix_s=100.0, max_latency_ms=0.0, min_tokens_per_s=50.0))
        qos = Profiler().profile(spec).qos
        assert (qos.priority, qos.deadline_s, qos.max_latency_ms, qos.min_tokens_per_s) == (5, 100.0, None, 50.0)

    def test_proto_spec_and_wire_vector(self) -> None:
        """A protobuf spec profiles like its plain form; to_proto carries memory per GPU."""
        data = make_spec(TaskKind.TRAINING)
        profiler = Profiler()
        assert profiler.profile(spec_to_proto(data)) == profiler.profile(data)
        wire = profiler.profile(data).to_proto()
        assert wire.gpus == 2.0 and wire.gpu_mem_bytes == profiler.profile(data).gpu_mem_per_gpu_bytes

    def test_request(self) -> None:
        """request() carries the profile, constraints and queue fields."""
        spec = make_spec(priority=3, gpu_model="H100", node_selector={"zone": "a"})
        req = Profiler().request("task-1", spec, submit_s=12.0)
        assert (req.task_id, req.priority, req.submit_s, req.gpu_model) == ("task-1", 3, 12.0, "H100")
        assert req.node_selector == {"zone": "a"} and req.demand.gpus == 1.0


class TestLearning:
    """Exponentially weighted corrections per model name."""

    def test_memory_correction_applies_to_later_tasks(self) -> None:
        """A task that used twice its predicted memory raises the next estimate by 1 + 0.3 · (2 - 1)."""
        profiler, spec = Profiler(), make_spec(TaskKind.TRAINING)
        before = profiler.profile(spec)
        profiler.observe(spec, 2 * before.gpu_mem_per_gpu_bytes, 0.9)
        assert profiler.correction("llama") == pytest.approx(1.3)
        after = profiler.profile(spec).estimated_gpu_mem_bytes
        assert after == pytest.approx(1.3 * before.estimated_gpu_mem_bytes, rel=1e-6)
        other = replace(spec, model=replace(spec.model, name="other"))
        assert profiler.profile(other).estimated_gpu_mem_bytes == before.estimated_gpu_mem_bytes

    def test_observe_by_name_and_clamping(self) -> None:
        """A name alone uses the last prediction for it; absurd ratios are clamped to 4."""
        profiler, spec = Profiler(), make_spec()
        predicted = profiler.profile(spec).gpu_mem_per_gpu_bytes
        profiler.observe("llama", 100 * predicted, 0.5)
        assert profiler.correction("llama") == pytest.approx(0.7 + 0.3 * 4.0)
        profiler.observe("never-seen", 10 * GIB, 0.5)
        assert profiler.correction("never-seen") == 1.0

    def test_learned_utilization_floors_a_share(self) -> None:
        """A shared model measured at 60 % utilization gets at least 10/16 of a GPU afterwards."""
        profiler, spec = Profiler(), make_spec(allow_gpu_sharing=True)
        profiler.observe(spec, 1, 0.6)
        assert profiler.profile(spec).demand.gpus == 0.625


VALID = {"name": "serve", "kind": "inference", "model": {"name": "llama", "params_billions": 7}, "argv": ["serve"]}


def with_(path: str, value: Any) -> dict[str, Any]:
    """VALID with one dotted key set."""
    doc: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in VALID.items()}
    *parents, leaf = path.split(".")
    target = doc
    for key in parents:
        target = target.setdefault(key, {})
    target[leaf] = value
    return doc


class TestValidateSpec:
    """Every invalid case names its dotted field."""

    def test_valid_spec_passes(self) -> None:
        """The baseline document is valid."""
        validate_spec(spec_from_mapping(VALID), max_gpus_per_node=8)

    @pytest.mark.parametrize(
        ("path", "value", "field"),
        [
            ("argv", [], "spec.argv"),
            ("argv", [" "], "spec.argv"),
            ("model.params_billions", 0, "spec.model.params_billions"),
            ("model.params_billions", -7, "spec.model.params_billions"),
            ("model.params_billions", math.nan, "spec.model.params_billions"),
            ("model.params_billions", math.inf, "spec.model.params_billions"),
            ("model.params_billions", 1e9, "spec.model.params_billions"),
            ("model.precision", "fp64", "spec.model.precision"),
            ("demand.gpus", -1, "spec.demand.gpus"),
            ("demand.gpus", math.nan, "spec.demand.gpus"),
            ("demand.gpus", 5000, "spec.demand.gpus"),
            ("demand.gpus", 16, "spec.demand.gpus"),
            ("demand.gpus", 1.5, "spec.demand.gpus"),
            ("demand.gpus", 0.5, "spec.demand.gpus"),
            ("demand.gpu_mem_bytes", "2PiB", "spec.demand.gpu_mem_bytes"),
            ("demand.mem_bytes", 2 * 1024**5, "spec.demand.mem_bytes"),
            ("demand.disk_bytes", "1.5PiB", "spec.demand.disk_bytes"),
            ("demand.cpu_cores", -2, "spec.demand.cpu_cores"),
            ("demand.cpu_cores", math.inf, "spec.demand.cpu_cores"),
            ("demand.gpu_mem_bytes", 0, "spec.demand"),
            ("gpus_per_node", 9, "spec.gpus_per_node"),
            ("gpus_per_node", 5000, "spec.gpus_per_node"),
            ("nodes", 5000, "spec.nodes"),
            ("qos.deadline_unix_s", -1, "spec.qos.deadline_unix_s"),
            ("qos.max_latency_ms", math.nan, "spec.qos.max_latency_ms"),
            ("stop_grace_s", -1, "spec.stop_grace_s"),
            ("max_restarts", 1_000_000, "spec.max_restarts"),
            ("name", "x" * 1_500_000, "spec.name"),
            ("name", "x" * 300, "spec.name"),
            ("argv", ["sh", "x" * 40_000], "spec.argv[1]"),
            ("argv", ["a"] * 2000, "spec.argv"),
            ("env", {f"K{i}": "v" * 1000 for i in range(200)}, "spec.env"),
            ("env", {"K": "v" * 40_000}, "spec.env.K"),
            ("env", {f"K{i}": "v" for i in range(300)}, "spec.env"),
            ("labels", {f"l{i}": "v" for i in range(100)}, "spec.labels"),
        ],
    )
    def test_invalid_values(self, path: str, value: Any, field: str) -> None:
        """Negative, NaN/inf, absurd, zero-where-positive and too-many-GPUs values are refused."""
        with pytest.raises(ValidationError) as info:
            validate_spec(spec_from_mapping(with_(path, value)), max_gpus_per_node=8)
        assert info.value.field == field

    def test_vanishing_gpu_share(self) -> None:
        """A shared GPU demand of 5e-324 is refused even with sharing allowed; 0.25 is accepted."""
        doc = with_("demand", {"gpus": 5e-324, "cpu_cores": 1})
        doc["allow_gpu_sharing"] = True
        with pytest.raises(ValidationError, match="smallest share") as info:
            validate_spec(spec_from_mapping(doc), max_gpus_per_node=8)
        assert info.value.field == "spec.demand.gpus"
        doc["demand"]["gpus"] = 0.25
        validate_spec(spec_from_mapping(doc), max_gpus_per_node=8)

    def test_huge_model_refused_after_profiling(self) -> None:
        """A 100,000 B-parameter fp32 model with a 10M-token context passes the spec checks but its profiled
        demand is refused naming spec.model; an ordinary model's demand passes and converts to the wire form."""
        from coordinator.profiler import validate_profiled_demand
        doc = with_("model", {"name": "m", "params_billions": 1e5, "precision": "fp32", "context_length": 10_000_000,
                              "batch_size": 1_000_000})
        doc["kind"] = "training"
        spec = spec_from_mapping(doc)
        validate_spec(spec, max_gpus_per_node=8)
        with pytest.raises(ValidationError) as info:
            validate_profiled_demand(Profiler().profile(spec).demand)
        assert info.value.field == "spec.model"
        ok = Profiler().profile(spec_from_mapping(VALID))
        validate_profiled_demand(ok.demand)
        ok.to_proto()

    def test_unknown_restart_policy_number(self) -> None:
        """A restart policy number outside the enum (99) is refused by field."""
        spec = spec_from_mapping(VALID)
        spec.restart_policy = 99
        with pytest.raises(ValidationError) as info:
            validate_spec(spec, max_gpus_per_node=8)
        assert info.value.field == "spec.restart_policy"

    def test_spec_limits_fit_etcd(self) -> None:
        """The whole-spec bound leaves a task record far below etcd's 1.5 MiB request limit."""
        from coordinator.profiler.taskspec import MAX_SPEC_BYTES
        assert MAX_SPEC_BYTES * 4 < 1536 * 1024

    def test_gpu_memory_without_gpus(self) -> None:
        """GPU memory with zero GPUs is refused."""
        doc = with_("demand", {"gpus": 0, "gpu_mem_bytes": "10GiB", "cpu_cores": 2})
        with pytest.raises(ValidationError) as info:
            validate_spec(spec_from_mapping(doc), max_gpus_per_node=8)
        assert info.value.field == "spec.demand.gpu_mem_bytes"

    def test_unknown_kind_in_proto(self) -> None:
        """An unknown kind number is refused."""
        spec = spec_from_mapping(VALID)
        spec.kind = 7
        with pytest.raises(ValidationError) as info:
            validate_spec(spec, max_gpus_per_node=8)
        assert info.value.field == "spec.kind"

    def test_unspecified_kind_is_profiled_as_inference(self) -> None:
        """A spec without a kind is accepted, stays unspecified, and gets the inference profile."""
        undeclared = spec_from_mapping({k: v for k, v in VALID.items() if k != "kind"})
        validate_spec(undeclared, max_gpus_per_node=8)
        assert spec_data(undeclared).kind == TaskKind.UNSPECIFIED
        profiler = Profiler()
        assert profiler.profile(undeclared).demand == profiler.profile(spec_from_mapping(VALID)).demand

    def test_plain_spec_and_unknown_node_sizes(self) -> None:
        """A plain spec validates too; max_gpus_per_node ≤ 0 skips the node-size check."""
        validate_spec(make_spec(gpus_per_node=64), max_gpus_per_node=0)
        with pytest.raises(ValidationError):
            validate_spec(make_spec(replicas=0), max_gpus_per_node=8)


class TestSpecFromMapping:
    """YAML/JSON documents become TaskSpec messages; unknown keys are named."""

    def test_full_document(self) -> None:
        """Labels, sizes, enums, maps and lists land in the right fields."""
        spec = spec_from_mapping({
            **VALID, "kind": "fine-tuning", "restart_policy": "on-failure", "env": {"A": "1"},
            "demand": {"gpus": 2, "gpu_mem_bytes": "40GiB"}, "constraints": {"node_selector": {"zone": 3}},
            "qos": {"deadline_unix_s": 10}, "priority": -2,
        })  # fmt: skip
        assert spec.kind == types_pb2.TASK_KIND_FINE_TUNING
        assert spec.restart_policy == types_pb2.RESTART_POLICY_ON_FAILURE
        assert spec.has_demand and spec.demand.gpu_mem_bytes == 40 * GIB and spec.demand.gpus == 2.0
        assert dict(spec.constraints.node_selector) == {"zone": "3"} and spec.priority == -2
        assert spec_data(spec).demand == Resources(2.0, 80 * GIB, 0.0, 0, 0)

    @pytest.mark.parametrize(
        ("doc", "field"),
        [
            ({"nmae": "x"}, "spec.nmae"),
            ({"model": {"params": 7}}, "spec.model.params"),
            ({"demand": {"gpu": 1}}, "spec.demand.gpu"),
            ({"kind": "pretraining"}, "spec.kind"),
            ({"kind": 3}, "spec.kind"),
            ({"argv": "python x.py"}, "spec.argv"),
            ({"argv": ["python", 3]}, "spec.argv[1]"),
            ({"nodes": -1}, "spec.nodes"),
            ({"nodes": 1.5}, "spec.nodes"),
            ({"nodes": True}, "spec.nodes"),
            ({"priority": 2**31}, "spec.priority"),
            ({"allow_gpu_sharing": "yes"}, "spec.allow_gpu_sharing"),
            ({"model": "llama"}, "spec.model"),
            ({"env": ["A=1"]}, "spec.env"),
            ({"demand": {"mem_bytes": "12 parsecs"}}, "spec.demand.mem_bytes"),
            ({"restart_policy": "sometimes"}, "spec.restart_policy"),
        ],
    )
    def test_rejects(self, doc: dict[str, Any], field: str) -> None:
        """Unknown keys and mistyped values are refused with their dotted path."""
        with pytest.raises(ValidationError) as info:
            spec_from_mapping(doc)
        assert info.value.field == field

    def test_not_a_mapping(self) -> None:
        """A list at the top level is refused."""
        with pytest.raises(ValidationError):
            spec_from_mapping(["serve"])  # type: ignore[arg-type]
