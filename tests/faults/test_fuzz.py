"""Property-based and fuzz tests: the task-spec parser, the Admin API and the agent stream.

The parser runs in process. The Admin API and the agent stream are a real coordinator (and a
real agent, so tasks are placed and run) over real gRPC on loopback: each hostile request
must get an answer with a status a client can act on (never UNKNOWN or INTERNAL), the
coordinator must stay up and keep its lease (same leader epoch), and the invariant checker
must be green over what the requests left in etcd. Example counts are printed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import ValidationError
from common.pb.gptrm.v1 import admin_pb2, agent_pb2, agent_pb2_grpc, types_pb2
from coordinator.etcd_embedded import EtcdCluster
from coordinator.profiler.taskspec import spec_from_mapping
from coordinator.profiler.validation import validate_spec
from tests.faults.invariants import InvariantChecker
from tests.faults.proto_strategies import HOSTILE_TEXT, message
from tests.integration.harness import Cluster, wait_until

_ANSWERABLE = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
               grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.RESOURCE_EXHAUSTED,
               grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ABORTED, grpc.StatusCode.OUT_OF_RANGE}
_SPEC_KEYS = [f.name for f in types_pb2.TaskSpec.DESCRIPTOR.fields] + ["deadline", "gpus", "gpu_mem", "x"]
_JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), HOSTILE_TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(HOSTILE_TEXT, inner, max_size=4)),
    max_leaves=12)


class TestTaskSpecParser:
    @settings(max_examples=400, deadline=None)
    @given(st.dictionaries(st.one_of(st.sampled_from(_SPEC_KEYS), HOSTILE_TEXT), _JSONISH, max_size=8))
    def test_any_mapping_parses_or_is_refused_naming_a_field(self, mapping: dict[str, Any]) -> None:
        """Any JSON-like mapping becomes a spec or raises ValidationError naming a field; never anything else."""
        try:
            spec = spec_from_mapping(mapping, now=lambda: 1_700_000_000.0)
        except ValidationError as e:
            assert str(e)
            return
        try:
            validate_spec(spec, 8)
        except ValidationError as e:
            assert str(e)


@pytest.fixture
def live(tmp_path: Path, etcd_server: EtcdCluster, etcd_prefix: str,
         request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """One coordinator and one agent (4 simulated GPUs) on the shared etcd."""
    c = Cluster(tmp_path, etcd_server.endpoints, etcd_prefix)
    c.start_coordinator("c1", "--lost-grace", "5")
    c.wait_leader("c1")
    c.start_agent("n1")
    wait_until(lambda: any(n.state == types_pb2.NODE_STATE_READY for n in c.admin().ListNodes(
        admin_pb2.ListNodesRequest(), timeout=5).nodes), 30, what="n1 ready")
    yield c
    c.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(c.logs())


def _code(fn: Any, req: Any) -> tuple[grpc.StatusCode, Any]:
    try:
        return grpc.StatusCode.OK, fn(req, timeout=20)
    except grpc.RpcError as e:
        return e.code(), e.details()


def _argv() -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just(["sleep", "0.2"]), st.just(["true"]), st.lists(HOSTILE_TEXT, max_size=4))


_SPEC = message(types_pb2.TaskSpec.DESCRIPTOR, types_pb2.TaskSpec, depth=3,
                overrides={"gptrm.v1.TaskSpec.argv": _argv(),
                           "gptrm.v1.TaskSpec.run_as_user": st.just("")})
_CALLS = st.one_of(
    st.tuples(st.just("SubmitTask"), st.builds(lambda spec, rid: admin_pb2.SubmitTaskRequest(spec=spec, request_id=rid),
                                               _SPEC, st.one_of(st.just(""), st.uuids().map(str), HOSTILE_TEXT))),
    st.tuples(st.sampled_from(["CancelTask", "PauseTask", "ResumeTask", "GetTask"]),
              message(admin_pb2.TaskRef.DESCRIPTOR, admin_pb2.TaskRef)),
    st.tuples(st.sampled_from(["CordonNode", "UncordonNode", "GetNode"]),
              message(admin_pb2.NodeRef.DESCRIPTOR, admin_pb2.NodeRef)),
    st.tuples(st.just("SetPolicy"), message(types_pb2.Policy.DESCRIPTOR, types_pb2.Policy)),
    st.tuples(st.just("ListTasks"), message(admin_pb2.ListTasksRequest.DESCRIPTOR, admin_pb2.ListTasksRequest)),
    st.tuples(st.just("ListNodes"), message(admin_pb2.ListNodesRequest.DESCRIPTOR, admin_pb2.ListNodesRequest)),
)


class TestAdminApi:
    def test_hostile_requests_get_answers_and_leave_the_cluster_sound(self, live: Cluster) -> None:
        """Hostile Admin requests: every answer is actionable, the leader keeps its lease, invariants hold."""
        admin = live.admin()
        epoch = live.status().leader_epoch
        accepted: dict[str, str] = {}
        codes: dict[str, int] = {}
        bad: list[str] = []

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
        @given(_CALLS)
        def call(c: tuple[str, Any]) -> None:
            method, req = c
            code, res = _code(getattr(admin, method), req)
            codes[code.name] = codes.get(code.name, 0) + 1
            if code not in _ANSWERABLE:
                bad.append(f"{method}: {code.name} {res!r:.300}")
            if method == "SubmitTask" and code == grpc.StatusCode.OK:
                accepted[req.request_id or uuid.uuid4().hex] = res.id

        call()
        print(f"\nAdmin API: 300 examples, answers {codes}")
        assert bad == [], bad[:5]
        status = live.status()
        assert live.proc("c1").alive and status.is_leader and status.leader_epoch == epoch
        chk = InvariantChecker(live.etcd.replace("http://", "").split(","), live.prefix,
                               {"n1": live.tmp / "agent-n1"})
        violations = chk.settle(accepted, grace_s=30)
        assert violations == [], "\n".join(map(str, violations))


def _stream(target: str, messages: list[agent_pb2.AgentMessage]) -> grpc.StatusCode:
    with grpc.insecure_channel(target) as ch:
        stub = agent_pb2_grpc.AgentGatewayStub(ch)
        try:
            for _ in stub.Connect(iter(messages), timeout=3):
                pass
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


_NODE_IDS = st.one_of(st.sampled_from(["fz-1", "fz-2", "n1"]), HOSTILE_TEXT)
_AGENT_MSG = message(agent_pb2.AgentMessage.DESCRIPTOR, agent_pb2.AgentMessage, depth=4,
                     overrides={"gptrm.v1.NodeInventory.node_id": _NODE_IDS})


def _register(node_id: str, gpus: int) -> agent_pb2.AgentMessage:
    inv = types_pb2.NodeInventory(node_id=node_id, hostname=node_id, cpu_cores=16, mem_total_bytes=64 << 30,
                                  simulated=True, gpu_backend="simulated")
    for i in range(gpus):
        inv.gpus.add(index=i, uuid=f"GPU-{node_id}-{i}", model="H100", mem_total_bytes=80 << 30,
                     power_limit_w=700, power_min_w=200, power_max_w=700, power_default_w=700)
    return agent_pb2.AgentMessage(register=agent_pb2.Register(inventory=inv, boot_id=1))


# Half the streams start with a well-formed registration (so the fuzzed messages after it reach the
# telemetry, status and ack paths), half with anything at all.
_STREAMS = st.one_of(
    st.lists(_AGENT_MSG, min_size=1, max_size=5),
    st.builds(lambda first, rest: [first, *rest],
              st.builds(_register, st.sampled_from(["fz-1", "fz-2"]), st.integers(0, 4)),
              st.lists(_AGENT_MSG.filter(lambda m: m.WhichOneof("body") != "register"), min_size=1, max_size=6)),
)


class TestAgentStream:
    @pytest.mark.slow
    def test_fuzzed_agent_streams_never_hurt_the_coordinator(self, live: Cluster) -> None:
        """Random agent streams (registers as anyone, random telemetry, statuses, acks): the coordinator stays up,
        keeps its lease, the real agent keeps its stream, and invariants hold."""
        epoch = live.status().leader_epoch
        codes: dict[str, int] = {}
        sub = live.ctl("-o", "json", "submit", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1", "--",
                       "sleep", "30")
        assert sub.returncode == 0, sub.stderr

        @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
        @given(_STREAMS)
        def connect(msgs: list[agent_pb2.AgentMessage]) -> None:
            code = _stream(live.address(), msgs)
            codes[code.name] = codes.get(code.name, 0) + 1
            assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), code

        connect()
        print(f"\nagent stream: 200 examples, stream ends {codes}")
        status = live.status()
        assert live.proc("c1").alive and status.is_leader and status.leader_epoch == epoch
        assert live.agents["n1"].log().count("stream_connected") == 1
        chk = InvariantChecker(live.etcd.replace("http://", "").split(","), live.prefix,
                               {"n1": live.tmp / "agent-n1"})
        violations = chk.settle(None, grace_s=30)
        assert violations == [], "\n".join(map(str, violations))
