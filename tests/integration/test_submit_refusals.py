"""Submit validation through a real coordinator on the real etcd: SubmitTask refuses what CreateService
refuses in a spec's service part, and what the agent could not run, naming the field; gptrmctl submits
a bare command as the README describes."""

from __future__ import annotations

import json
import math

import grpc
import pytest

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from tests.integration.harness import Cluster


def _spec(**fields: object) -> types_pb2.TaskSpec:
    spec = types_pb2.TaskSpec(**{"name": "t", "argv": ["true"], **fields})  # type: ignore[arg-type]
    spec.demand.cpu_cores = 0.1
    spec.has_demand = True
    return spec


def _refusal(cluster: Cluster, method: str, spec: types_pb2.TaskSpec) -> str:
    with pytest.raises(grpc.RpcError) as info:
        getattr(cluster.admin(), method)(admin_pb2.SubmitTaskRequest(spec=spec), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return info.value.details()


class TestSubmitValidation:
    def test_refused_at_submit_naming_the_field(self, cluster: Cluster) -> None:
        """A bad target utilization is refused by SubmitTask as by CreateService; NUL bytes, invalid env
        names and an oversized argument are refused naming the field; nothing is stored."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        for target in (math.nan, math.inf, -1.0, 1e300):
            spec = _spec(service=types_pb2.ServiceSpec(min_replicas=1, max_replicas=2, target_util=target))
            for method in ("SubmitTask", "CreateService"):
                assert _refusal(cluster, method, spec).startswith("spec.service.target_util:"), (method, target)
        assert _refusal(cluster, "SubmitTask", _spec(argv=["sh", "-c", "a\0b"])) == \
            "spec.argv[2]: contains a NUL byte"
        assert _refusal(cluster, "SubmitTask", _spec(env={"A=B": "1"})).startswith(
            "spec.env: key 'A=B' is not a valid variable name")
        assert _refusal(cluster, "SubmitTask", _spec(env={"A": "x\0"})) == "spec.env.A: value contains a NUL byte"
        assert _refusal(cluster, "SubmitTask", _spec(argv=["sh", "x" * 300_000])).startswith("spec.argv[1]:")
        res = cluster.ctl("-o", "json", "tasks")
        assert res.returncode == 0 and json.loads(res.stdout)["tasks"] == []

    def test_bare_command_gets_one_core(self, cluster: Cluster) -> None:
        """`gptrmctl submit -- true` (no model, no demand) is accepted with the documented default of one CPU
        core and nothing else; an absurd GPU count is refused by the coordinator (exit 1, field named)."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        res = cluster.ctl("-o", "json", "submit", "--", "true")
        assert res.returncode == 0, res.stderr
        demand = json.loads(res.stdout)["demand"]
        assert demand["cpu_cores"] == 1 and demand["gpus"] == 0 and demand["mem_bytes"] == 0
        res = cluster.ctl("submit", "--gpus", "99999999999999999999", "--", "true")
        assert res.returncode == 1 and "spec.demand.gpus" in res.stderr and "Traceback" not in res.stderr
