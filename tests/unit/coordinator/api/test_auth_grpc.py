"""The auth interceptor over real gRPC on loopback with mutual TLS: the principal a servicer sees
(``current_principal``), and a queue refusal raised by a handler, answered and audited."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest

from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from common.tls import ClientTls, ServerTls, TlsFiles
from coordinator import certs
from coordinator.api.admin import SERVED_BY, AdminService, Served, _rpc
from coordinator.api.audit import AuditLog
from coordinator.api.auth import Authenticator, Principal, Security, current_principal, queue_refusal
from coordinator.tokens import TokenFile, new_token, token_line

T = TypeVar("T")
_KINDS = "gptrm.test.Kinds"
_BOB_TOKEN = new_token()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    certs.create_ca(d)
    certs.issue(d, "coordinator", ["localhost", "127.0.0.1"])
    certs.issue(d, "admin", ["alice"], queues=["team-a", "team-b"])
    certs.issue(d, "admin", ["carol"])
    certs.issue(d, "viewer", ["eve"], queues=["team-a"])
    (d / "tokens").write_text(token_line("bob", "admin", _BOB_TOKEN, queues=["team-c"]) + "\n")
    return d


class _Admin(AdminService):
    """An Admin service (no app) whose methods report the principal they see or refuse by queue.

    CancelTask treats its task id as the queue asked for; ListNodes (a viewer read, not audited
    as a write) raises the refusal itself, without the ``_rpc`` translation.
    """

    def __init__(self) -> None:
        self.seen: list[Principal | None] = []

    def _route(self, method: str) -> Served:   # leads: every method is answered here
        return SERVED_BY[method]

    @_rpc
    async def GetStatus(self, request: admin_pb2.GetStatusRequest,
                        context: grpc.aio.ServicerContext) -> admin_pb2.ClusterStatus:
        self.seen.append(current_principal())
        return admin_pb2.ClusterStatus(coordinator_id="c1")

    async def StreamEvents(self, request: admin_pb2.StreamEventsRequest,
                           context: grpc.aio.ServicerContext) -> AsyncIterator[admin_pb2.Event]:
        for seq in (1, 2):
            await asyncio.sleep(0)   # let other tasks run between items: the principal stays this call's
            self.seen.append(current_principal())
            yield admin_pb2.Event(seq=seq)

    @_rpc
    async def CancelTask(self, request: admin_pb2.TaskRef, context: grpc.aio.ServicerContext) -> types_pb2.Task:
        refusal = queue_refusal(current_principal(), request.task_id)
        if refusal is not None:
            raise refusal
        return types_pb2.Task(id=request.task_id)

    async def TaskLogs(self, request: admin_pb2.TaskLogsRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[admin_pb2.TaskLogChunk]:
        yield admin_pb2.TaskLogChunk(data=b"hello\n")

    async def ListNodes(self, request: admin_pb2.ListNodesRequest,
                        context: grpc.aio.ServicerContext) -> admin_pb2.ListNodesResponse:
        refusal = queue_refusal(current_principal(), "team-z")
        if refusal is not None:
            raise refusal
        return admin_pb2.ListNodesResponse()


def _name() -> bytes:
    p = current_principal()
    return p.name.encode() if p is not None else b"<none>"


async def _uu(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return _name()


async def _us(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    yield _name()


async def _su(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
    async for _ in requests:
        pass
    return _name()


async def _ss(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    async for _ in requests:
        yield _name()


def _kinds_handler() -> grpc.GenericRpcHandler:
    """One method of each handler kind, answering the name of the principal it sees (raw bytes)."""
    return grpc.method_handlers_generic_handler(_KINDS, {
        "UU": grpc.unary_unary_rpc_method_handler(_uu), "US": grpc.unary_stream_rpc_method_handler(_us),
        "SU": grpc.stream_unary_rpc_method_handler(_su), "SS": grpc.stream_stream_rpc_method_handler(_ss)})


def _serve(pki: Path, audit: Path, admin: _Admin, client: str,
           body: Callable[[grpc.aio.Channel], Awaitable[T]]) -> T:
    """Run ``body`` with a channel that presents ``client``'s certificate to a real mTLS server."""
    async def main() -> T:
        authn = Authenticator(tls=True, tokens=TokenFile(pki / "tokens"))
        server_files = TlsFiles(str(pki / "coordinator-localhost.crt"), str(pki / "coordinator-localhost.key"),
                                str(pki / "ca.crt"))
        security = Security(ServerTls(server_files), authn, AuditLog(audit))
        server = grpc.aio.server(interceptors=[security.interceptor])
        admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
        server.add_generic_rpc_handlers((_kinds_handler(),))
        port = security.add_port(server, "127.0.0.1:0")
        await server.start()
        creds = ClientTls(TlsFiles(str(pki / f"{client}.crt"), str(pki / f"{client}.key"),
                                   str(pki / "ca.crt"))).credentials()
        try:
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as channel:
                return await body(channel)
        finally:
            await server.stop(None)
            security.audit.close()
    return asyncio.run(main())


def _audit(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class TestCurrentPrincipal:
    def test_servicer_sees_the_certificate_principal_with_its_queues(self, pki: Path, tmp_path: Path) -> None:
        """A unary and a streaming Admin method see the caller's certificate principal and its queues."""
        admin = _Admin()

        async def body(channel: grpc.aio.Channel) -> None:
            stub = admin_pb2_grpc.AdminStub(channel)
            await stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)
            assert [e.seq async for e in stub.StreamEvents(admin_pb2.StreamEventsRequest(), timeout=10)] == [1, 2]
        _serve(pki, tmp_path / "audit.log", admin, "admin-alice", body)
        assert admin.seen == [Principal("alice", "admin", "certificate", ("team-a", "team-b"))] * 3
        assert admin.seen[0].default_queue == "team-a" and not admin.seen[0].any_queue

    def test_token_principal_replaces_the_certificate_queues(self, pki: Path, tmp_path: Path) -> None:
        """With a bearer token the servicer sees the token's principal and queues, not the certificate's."""
        admin = _Admin()

        async def body(channel: grpc.aio.Channel) -> None:
            await admin_pb2_grpc.AdminStub(channel).GetStatus(
                admin_pb2.GetStatusRequest(), metadata=(("authorization", f"Bearer {_BOB_TOKEN}"),), timeout=10)
        _serve(pki, tmp_path / "audit.log", admin, "viewer-eve", body)
        assert admin.seen == [Principal("bob", "admin", "token", ("team-c",))]

    def test_every_handler_kind_sees_the_principal(self, pki: Path, tmp_path: Path) -> None:
        """Unary-unary, unary-stream, stream-unary and stream-stream handlers all see the caller."""
        async def body(channel: grpc.aio.Channel) -> list[bytes]:
            async def requests() -> AsyncIterator[bytes]:
                yield b"x"
            uu = await channel.unary_unary(f"/{_KINDS}/UU")(b"", timeout=10)
            us = [m async for m in channel.unary_stream(f"/{_KINDS}/US")(b"", timeout=10)]
            su = await channel.stream_unary(f"/{_KINDS}/SU")(requests(), timeout=10)
            ss = [m async for m in channel.stream_stream(f"/{_KINDS}/SS")(requests(), timeout=10)]
            return [uu, *us, su, *ss]
        assert _serve(pki, tmp_path / "audit.log", _Admin(), "admin-carol", body) == [b"carol"] * 4

    def test_no_principal_outside_a_call(self) -> None:
        """Outside a call (and in servicers served without the interceptor) there is no current principal."""
        assert current_principal() is None


class TestReadsAudit:
    def test_log_reads_are_not_audited_their_refusals_are(self, pki: Path, tmp_path: Path) -> None:
        """An admin reading a task's logs (an admin-only read) leaves no audit record, however often; a viewer
        refused them leaves one refused record."""
        audit = tmp_path / "audit.log"

        async def read(channel: grpc.aio.Channel) -> list[bytes]:
            stub = admin_pb2_grpc.AdminStub(channel)
            return [c.data for _ in range(3)
                    async for c in stub.TaskLogs(admin_pb2.TaskLogsRequest(task_id="t-1"), timeout=10)]
        assert _serve(pki, audit, _Admin(), "admin-alice", read) == [b"hello\n"] * 3
        assert _audit(audit) == []

        async def refused(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await read(channel)
            return info.value
        assert _serve(pki, audit, _Admin(), "viewer-eve", refused).code() == grpc.StatusCode.PERMISSION_DENIED
        assert [(r["principal"], r["method"], r["target"], r["outcome"]) for r in _audit(audit)] == \
            [("eve", "TaskLogs", "t-1", "refused")]


class TestQueueRefusal:
    def test_refusal_is_permission_denied_and_audited_as_refused(self, pki: Path, tmp_path: Path) -> None:
        """A handler's queue refusal answers PERMISSION_DENIED naming the queues, and leaves one refused record."""
        audit = tmp_path / "audit.log"

        async def body(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError:
            stub = admin_pb2_grpc.AdminStub(channel)
            assert (await stub.CancelTask(admin_pb2.TaskRef(task_id="team-b"), timeout=10)).id == "team-b"
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.CancelTask(admin_pb2.TaskRef(task_id="team-x"), timeout=10)
            return info.value
        err = _serve(pki, audit, _Admin(), "admin-alice", body)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert err.details() == "queue 'team-x': 'alice' may submit to team-a, team-b"
        records = [(r["principal"], r["role"], r["method"], r["target"], r["outcome"]) for r in _audit(audit)]
        assert records == [("alice", "admin", "CancelTask", "team-b", "ok"),
                           ("alice", "admin", "CancelTask", "team-x", "refused")]
        assert _audit(audit)[1]["reason"] == "PERMISSION_DENIED: queue 'team-x': 'alice' may submit to team-a, team-b"

    def test_refusal_raised_untranslated_in_a_read_is_answered_and_audited(self, pki: Path, tmp_path: Path) -> None:
        """A PermissionDenied a handler raises itself is PERMISSION_DENIED, audited even for a read."""
        audit = tmp_path / "audit.log"

        async def body(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await admin_pb2_grpc.AdminStub(channel).ListNodes(admin_pb2.ListNodesRequest(), timeout=10)
            return info.value
        err = _serve(pki, audit, _Admin(), "viewer-eve", body)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert err.details() == "queue 'team-z': 'eve' may submit to team-a"
        assert [(r["principal"], r["role"], r["method"], r["outcome"]) for r in _audit(audit)] == \
            [("eve", "viewer", "ListNodes", "refused")]

    def test_a_credential_without_queues_is_never_refused(self, pki: Path, tmp_path: Path) -> None:
        """A certificate issued without queues may use any queue: the call succeeds and is audited ok."""
        audit = tmp_path / "audit.log"

        async def body(channel: grpc.aio.Channel) -> str:
            task = await admin_pb2_grpc.AdminStub(channel).CancelTask(admin_pb2.TaskRef(task_id="any"), timeout=10)
            return task.id
        assert _serve(pki, audit, _Admin(), "admin-carol", body) == "any"
        assert [r["outcome"] for r in _audit(audit)] == ["ok"]
