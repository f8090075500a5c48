"""Submit validation: the service part, argv and environment, size errors that name their field, and
the default for a spec without a model or a demand."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.adaptor import services
from coordinator.profiler import Profiler, spec_from_mapping, validate_spec
from coordinator.profiler.validation import validate_argv_env, validate_service

BASE: dict[str, Any] = {"name": "serve", "kind": "inference", "argv": ["serve"],
                        "demand": {"gpus": 1, "cpu_cores": 1}}


def _spec(**fields: Any) -> types_pb2.TaskSpec:
    return spec_from_mapping({**BASE, **fields})


def _refused(spec: types_pb2.TaskSpec) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        validate_spec(spec, max_gpus_per_node=8)
    return info.value


class TestServicePart:
    @pytest.mark.parametrize("target", [math.nan, math.inf, -math.inf, -1.0, 1.5, 1e300])
    def test_submit_refuses_a_bad_target_util(self, target: float) -> None:
        """A task spec carrying a service part with a target utilization outside (0, 1] is refused by the
        submit validation, naming the field."""
        spec = _spec(service={"min_replicas": 1, "max_replicas": 2, "target_util": target})
        assert _refused(spec).field == "spec.service.target_util"

    def test_submit_refuses_what_create_service_refuses(self) -> None:
        """The submit validation and the service controller use the same check of the service part."""
        assert services.validate_service is validate_service
        for service, field in (({"min_replicas": 0, "max_replicas": 2, "target_util": 0.5},
                                "spec.service.min_replicas"),
                               ({"min_replicas": 3, "max_replicas": 2, "target_util": 0.5},
                                "spec.service.max_replicas"),
                               ({"min_replicas": 1, "max_replicas": 65, "target_util": 0.5},
                                "spec.service.max_replicas"),
                               ({"min_replicas": 1, "max_replicas": 2}, "spec.service")):
            spec = _spec(service=service)
            assert _refused(spec).field == field
            with pytest.raises(ValidationError) as info:
                validate_service(spec, cluster_gpus=16, gpus_per_replica=1)
            assert info.value.field == field

    def test_valid_service_part_passes(self) -> None:
        """A service part with one signal in range passes both."""
        spec = _spec(service={"min_replicas": 1, "max_replicas": 2, "target_util": 0.7})
        validate_spec(spec, max_gpus_per_node=8)
        validate_service(spec, cluster_gpus=16, gpus_per_replica=1)

    def test_cluster_size_is_checked_when_known(self) -> None:
        """More replicas than the cluster's GPUs could hold is refused when the cluster size is given."""
        spec = _spec(service={"min_replicas": 1, "max_replicas": 8, "target_util": 0.7})
        with pytest.raises(ValidationError) as info:
            validate_service(spec, cluster_gpus=4, gpus_per_replica=1)
        assert info.value.field == "spec.service.max_replicas"


class TestVanishingDemands:
    @pytest.mark.parametrize(
        ("demand", "field"),
        [
            ({"cpu_cores": 1e-9}, "spec.demand.cpu_cores"),
            ({"cpu_cores": 5e-324}, "spec.demand.cpu_cores"),
            ({"cpu_cores": 0.009}, "spec.demand.cpu_cores"),
            ({"cpu_cores": 1, "mem_bytes": 1}, "spec.demand.mem_bytes"),
            ({"cpu_cores": 1, "disk_bytes": 1000}, "spec.demand.disk_bytes"),
            ({"gpus": 1, "gpu_mem_bytes": 5}, "spec.demand.gpu_mem_bytes"),
            ({"gpus": 0.001}, "spec.demand.gpus"),
        ],
    )
    def test_a_demand_below_the_minimum_is_refused(self, demand: dict[str, Any], field: str) -> None:
        """A CPU, memory, GPU memory or disk demand above 0 but below the smallest one (0.01 cores, 1 MiB;
        a 0.01 share of a GPU) is refused naming the field: it would let tasks pile up without limit."""
        err = _refused(_spec(demand=demand, allow_gpu_sharing=True))
        assert err.field == field and "below the smallest" in str(err)

    def test_the_smallest_demands_pass(self) -> None:
        """0 (none) and the minimum itself pass."""
        validate_spec(_spec(demand={"cpu_cores": 0.01, "mem_bytes": 1024**2, "disk_bytes": 0}), max_gpus_per_node=8)


class TestArgvAndEnv:
    @pytest.mark.parametrize(
        ("fields", "field", "words"),
        [
            ({"argv": ["sh", "-c", "a\0b"]}, "spec.argv[2]", "NUL byte"),
            ({"argv": ["\0"]}, "spec.argv[0]", "NUL byte"),
            ({"env": {"A=B": "1"}}, "spec.env", "'A=B' is not a valid variable name"),
            ({"env": {"1A": "1"}}, "spec.env", "not a valid variable name"),
            ({"env": {"A-B": "1"}}, "spec.env", "not a valid variable name"),
            ({"env": {"A\0": "1"}}, "spec.env", "NUL byte"),
            ({"env": {"A": "x\0y"}}, "spec.env.A", "NUL byte"),
        ],
    )
    def test_refused_naming_the_field(self, fields: dict[str, Any], field: str, words: str) -> None:
        """NUL bytes and keys the agent cannot set are refused at submit, naming the field."""
        err = _refused(_spec(**fields))
        assert err.field == field and words in str(err) and str(err).startswith(field + ":")

    def test_ordinary_argv_and_env_pass(self) -> None:
        """Names with letters, digits and underscores, and any value without NUL, pass."""
        validate_spec(_spec(argv=["sh", "-c", "echo $A_1 = é"], env={"_A_1": "x=y é", "PATH": ""}),
                      max_gpus_per_node=8)

    @settings(max_examples=300, deadline=None)
    @given(argv=st.lists(st.text(), min_size=1, max_size=4),
           env=st.dictionaries(st.text(), st.text(), max_size=4))
    def test_any_text_is_accepted_or_refused_by_field(self, argv: list[str], env: dict[str, str]) -> None:
        """Whatever text argv and env hold, the check passes or raises a ValidationError naming argv or env."""
        try:
            validate_argv_env(argv, env)
        except ValidationError as e:
            assert e.field.startswith(("spec.argv[", "spec.env"))
            assert any("\0" in a for a in argv) or any("\0" in k + v or not k.isidentifier()
                                                       or not k.isascii() for k, v in env.items())
        else:
            assert not any("\0" in a for a in argv)
            assert all("\0" not in v and k.isascii() and k.isidentifier() for k, v in env.items())


class TestSizesNameTheirField:
    def test_one_huge_argument_names_argv(self) -> None:
        """An argument larger than the whole-spec limit is refused naming spec.argv, not the spec."""
        err = _refused(_spec(argv=["sh", "x" * 300_000]))
        assert err.field == "spec.argv[1]"

    def test_huge_argv_in_all_names_argv(self) -> None:
        """Arguments within the per-argument limit whose total is over every limit name spec.argv."""
        err = _refused(_spec(argv=["sh"] + ["x" * 30_000] * 10))
        assert err.field == "spec.argv"

    def test_whole_spec_limit_still_applies(self) -> None:
        """Fields each within their limits but too large together are refused on the whole spec."""
        big = {"argv": ["sh"] + ["x" * 30_000] * 4, "env": {f"K{i}": "v" * 30_000 for i in range(4)},
               "labels": {f"l{i}": "v" * 1000 for i in range(64)}}
        assert _refused(_spec(**big)).field == "spec"


class TestNoModelNoDemand:
    def test_gets_one_core(self) -> None:
        """A spec with neither a model nor a demand is valid and profiled as one CPU core and nothing else."""
        spec = spec_from_mapping({"argv": ["true"]})
        validate_spec(spec, max_gpus_per_node=8)
        demand = Profiler().profile(spec).demand
        assert (demand.gpus, demand.cpu_cores, demand.mem_bytes, demand.gpu_mem_total_bytes) == (0, 1.0, 0, 0)

    def test_named_model_without_size_is_refused(self) -> None:
        """A named model without its size (and no demand) is still refused: it cannot be profiled."""
        err = _refused(spec_from_mapping({"argv": ["true"], "model": {"name": "llama"}}))
        assert err.field == "spec.model.params_billions"


TRAIN: dict[str, Any] = {"name": "train", "kind": "training", "argv": ["train"], "demand": {"gpus": 1}}


class TestElasticPart:
    def _spec(self, **fields: Any) -> types_pb2.TaskSpec:
        return spec_from_mapping({**TRAIN, **fields})

    def test_a_valid_range_passes(self) -> None:
        validate_spec(self._spec(elastic={"min_gpus": 1, "max_gpus": 8}), max_gpus_per_node=8)
        validate_spec(self._spec(elastic={"min_nodes": 1, "max_nodes": 4}, gpus_per_node=8), max_gpus_per_node=8)

    @pytest.mark.parametrize(("fields", "field"), [
        ({"elastic": {"min_gpus": 0, "max_gpus": 4}}, "spec.elastic.min_gpus"),
        ({"elastic": {"min_gpus": 4, "max_gpus": 2}}, "spec.elastic.max_gpus"),
        ({"elastic": {"min_gpus": 1, "max_gpus": 16}}, "spec.elastic.max_gpus"),
        ({"elastic": {"min_gpus": 1, "max_gpus": 2, "min_nodes": 1, "max_nodes": 2}}, "spec.elastic"),
        ({"elastic": {"min_nodes": 1, "max_nodes": 2}}, "spec.gpus_per_node"),
        ({"elastic": {"min_gpus": 1, "max_gpus": 2}, "kind": "inference"}, "spec.elastic"),
        ({"elastic": {"min_gpus": 1, "max_gpus": 2}, "nodes": 2}, "spec.nodes"),
        ({"elastic": {"min_gpus": 1, "max_gpus": 2, "throughput_counter": "samples_total"}},
         "spec.elastic.throughput_counter"),
        ({"elastic": {"min_gpus": 1, "max_gpus": 2, "throughput_counter": "bad name"}, "metrics_port": 9000},
         "spec.elastic.throughput_counter"),
    ])
    def test_bad_ranges_name_their_field(self, fields: dict[str, Any], field: str) -> None:
        with pytest.raises(ValidationError) as info:
            validate_spec(self._spec(**fields), max_gpus_per_node=8)
        assert info.value.field == field
