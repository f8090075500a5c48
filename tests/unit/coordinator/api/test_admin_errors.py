"""Admin API error translation over real gRPC on loopback: unexpected errors are INTERNAL with an id."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from common.errors import EtcdUnavailable
from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from coordinator.api.admin import SERVED_BY, AdminService, Served, _rpc


class _Broken(AdminService):
    """An Admin service whose GetPolicy hits a bug and whose SetPolicy finds etcd down."""

    def __init__(self) -> None:   # no app: the overridden methods use none
        pass

    def _route(self, method: str) -> Served:   # leads: every method is answered here
        return SERVED_BY[method]

    @_rpc
    async def GetPolicy(self, request: admin_pb2.GetPolicyRequest, context: grpc.aio.ServicerContext) -> None:
        raise RuntimeError("cannot reach etcd at http://10.20.30.40:2379 (secret detail)")

    @_rpc
    async def SetPolicy(self, request: types_pb2.Policy, context: grpc.aio.ServicerContext) -> None:
        raise EtcdUnavailable("all endpoints failed: 10.20.30.40:2379 connection refused")


async def _call(method: str, request: object) -> grpc.aio.AioRpcError:
    server = grpc.aio.server()
    admin_pb2_grpc.add_AdminServicer_to_server(_Broken(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await getattr(stub, method)(request, timeout=10)
            return info.value
    finally:
        await server.stop(None)


class TestAdminErrors:
    def test_unexpected_error_is_internal_with_correlation_id(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A bug answers INTERNAL naming a correlation id, without the exception's text; the log has both."""
        err = asyncio.run(_call("GetPolicy", admin_pb2.GetPolicyRequest()))
        assert err.code() == grpc.StatusCode.INTERNAL
        assert "correlation id" in err.details()
        assert "10.20.30.40" not in err.details() and "secret" not in err.details()
        cid = err.details().split("correlation id ")[1].split(";")[0]
        logged = capsys.readouterr()
        text = logged.out + logged.err
        assert cid in text and "admin_rpc_failed" in text and "Traceback" in text

    def test_etcd_error_hides_addresses(self) -> None:
        """An etcd outage answers UNAVAILABLE without etcd's address."""
        err = asyncio.run(_call("SetPolicy", types_pb2.Policy(name="x")))
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert "10.20.30.40" not in err.details() and "etcd unavailable" in err.details()


def test_every_admin_method_says_where_it_is_answered() -> None:
    """SERVED_BY lists exactly the Admin service's methods: none is left to each handler to route."""
    methods = {m.name for m in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods}
    assert set(SERVED_BY) == methods
