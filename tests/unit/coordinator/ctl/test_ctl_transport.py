"""gptrmctl's transport during a leader change, against real gRPC servers on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from coordinator.ctl.transport import EXIT_NO_COORDINATOR, EXIT_REFUSED, CtlError, Transport
from coordinator.rpc_metadata import LEADER_METADATA_KEY, NOT_LEADER_METADATA_KEY
from tests.helpers.ports import free_port


class _Replica(admin_pb2_grpc.AdminServicer):
    """A coordinator replica that refuses as a standby until ``leading`` is set, naming ``leader_hint``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.leading = threading.Event()
        self.leader_hint = ""
        self.request_ids: list[str] = []
        self.refuse_with = ""

    def SubmitTask(self, request: admin_pb2.SubmitTaskRequest, context: grpc.ServicerContext) -> types_pb2.Task:
        self.request_ids.append(request.request_id)
        if self.refuse_with:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, self.refuse_with)
        if not self.leading.is_set():
            md = [(NOT_LEADER_METADATA_KEY, "1")]
            if self.leader_hint:
                md.append((LEADER_METADATA_KEY, self.leader_hint))
            context.set_trailing_metadata(tuple(md))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{self.name} is not the leader")
        return types_pb2.Task(id=f"t-{request.request_id}")


@pytest.fixture
def replicas() -> Iterator[tuple[list[_Replica], list[str]]]:
    servers, reps, addrs = [], [], []
    for name in ("a", "b"):
        rep = _Replica(name)
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        admin_pb2_grpc.add_AdminServicer_to_server(rep, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        reps.append(rep)
        addrs.append(f"127.0.0.1:{port}")
    yield reps, addrs
    for s in servers:
        s.stop(None)


class _FakeTime:
    """A clock that advances only when the transport sleeps (so the test never waits for real)."""

    def __init__(self, on_sleep: object = None) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s
        if callable(self.on_sleep):
            self.on_sleep(len(self.sleeps))


def _submit(t: Transport) -> types_pb2.Task:
    return t.call("SubmitTask", admin_pb2.SubmitTaskRequest(request_id="r-42", spec=types_pb2.TaskSpec(name="x")),
                  write=True)


class TestLeaderChange:
    def test_redirect_to_standby_is_retried_until_a_leader_answers(
            self, replicas: tuple[list[_Replica], list[str]]) -> None:
        """Both replicas name a dead leader at first; the write is re-sent with the same request id, with
        growing pauses, and succeeds once one replica leads."""
        (a, b), addrs = replicas
        dead = f"127.0.0.1:{free_port()}"
        a.leader_hint = b.leader_hint = dead
        fake = _FakeTime(on_sleep=lambda n: b.leading.set() if n == 4 else None)
        t = Transport(addrs, timeout_s=30.0, clock=fake.clock, sleep=fake.sleep)
        try:
            task = _submit(t)
        finally:
            t.close()
        assert task.id == "t-r-42"
        assert t.passes == 5
        assert fake.sleeps == sorted(fake.sleeps) and fake.sleeps[-1] > fake.sleeps[0]
        assert set(a.request_ids + b.request_ids) == {"r-42"}

    def test_gives_up_with_exit_3_only_at_the_deadline(self, replicas: tuple[list[_Replica], list[str]]) -> None:
        """With no leader for the whole deadline, the error is exit code 3 after backoffs adding up to the deadline."""
        _, addrs = replicas
        fake = _FakeTime()
        t = Transport(addrs, timeout_s=10.0, clock=fake.clock, sleep=fake.sleep)
        try:
            with pytest.raises(CtlError) as e:
                _submit(t)
        finally:
            t.close()
        assert e.value.code == EXIT_NO_COORDINATOR and "no leader answered" in str(e.value)
        assert 5.0 <= sum(fake.sleeps) <= 10.0
        assert max(fake.sleeps) <= Transport.BACKOFF_MAX_S

    def test_real_refusal_is_not_retried(self, replicas: tuple[list[_Replica], list[str]]) -> None:
        """A refusal that is not about leadership exits 1 at once, without retrying."""
        (a, _b), addrs = replicas
        a.refuse_with = "spec.name: too long"
        fake = _FakeTime()
        t = Transport(addrs[:1], timeout_s=10.0, clock=fake.clock, sleep=fake.sleep)
        try:
            with pytest.raises(CtlError) as e:
                _submit(t)
        finally:
            t.close()
        assert e.value.code == EXIT_REFUSED and fake.sleeps == [] and a.request_ids == ["r-42"]
