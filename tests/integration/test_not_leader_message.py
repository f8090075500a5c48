"""The refusal a client gets from a replica that does not lead names the right replicas: the one that
answered, and the one it sees as leader (itself, while it is still taking over)."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Iterator

import grpc
import grpc.aio
import pytest

from common.errors import NotLeader
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.api.admin import AdminService, _rpc, not_leader_message
from coordinator.etcd_embedded import EtcdCluster
from coordinator.events import EventBus
from coordinator.sync import EtcdClient, Keys, connect
from coordinator.sync.leadership import Leadership
from tests.helpers.inproc import admin_stub


@pytest.fixture
def client(etcd_server: EtcdCluster) -> Iterator[EtcdClient]:
    c = connect(etcd_server.endpoints, timeout_s=2.0)
    yield c
    c.close()


class _SlowTakeOver:
    """A leader role whose take-over waits until the test lets it finish."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def take_over(self, record: types_pb2.LeaderRecord) -> bool:
        self.entered.set()
        await self.release.wait()
        return True

    def start_leading(self) -> None:
        pass

    def stand_down(self, reason: str) -> None:
        pass


class _Admin(AdminService):
    """The Admin service over one replica's leadership only: GetPolicy needs the leader."""

    def __init__(self, leadership: Leadership) -> None:
        super().__init__(types.SimpleNamespace(leadership=leadership))  # type: ignore[arg-type]

    @_rpc
    async def GetPolicy(self, request: admin_pb2.GetPolicyRequest, context: grpc.aio.ServicerContext) -> None:
        self._app.leadership.require_leader()


async def _refusal(leadership: Leadership) -> grpc.aio.AioRpcError:
    async with admin_stub(_Admin(leadership)) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetPolicy(admin_pb2.GetPolicyRequest(), timeout=10)
        return info.value


class TestNotLeaderMessage:
    def test_taking_over_and_standby(self, client: EtcdClient, etcd_prefix: str) -> None:
        """A replica still taking over says so (not "c1 is not the leader; the leader is c1"); a standby
        names itself and the leader."""
        keys = Keys(etcd_prefix)

        async def scenario() -> None:
            loop = asyncio.get_running_loop()
            c1 = Leadership(client, keys, "c1", "127.0.0.1:7001", ttl_s=5.0, events=EventBus())
            c2 = Leadership(client, keys, "c2", "127.0.0.1:7002", ttl_s=5.0, events=EventBus())
            role = _SlowTakeOver()
            c1.start(role, loop)
            try:
                await asyncio.wait_for(role.entered.wait(), 30)
                err = await _refusal(c1)
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert err.details() == "c1 is taking over as leader; try again"
                c2.start(_SlowTakeOver(), loop)
                err = await _refusal(c2)
                assert err.details().startswith("c2 is not the leader; the leader is c1")
            finally:
                role.release.set()
                await c2.resign()
                await c1.resign()

        asyncio.run(scenario())

    def test_lost_lease_with_own_record(self) -> None:
        """A replica that names itself but no longer holds the lease says it lost the leadership."""
        err = NotLeader("c1 is not the leader; the leader is c1 at x:1", "c1", "x:1")
        text = not_leader_message("c1", err, holds_lease=False)
        assert text.startswith("c1 has just lost the leadership") and "leader is c1" not in text
        other = NotLeader("c2 is not the leader; the leader is c1 at x:1", "c1", "x:1")
        assert not_leader_message("c2", other, holds_lease=False) == str(other)
