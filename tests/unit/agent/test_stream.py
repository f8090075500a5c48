"""AgentStream against a real grpc.aio AgentGateway on loopback: heartbeats only when telemetry is silent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc.aio

from agent.outbox import Outbox
from agent.stream import AgentStream, Backoff
from common.pb.gptrm.v1 import agent_pb2, agent_pb2_grpc, types_pb2
from tests.helpers.agent_stream import accept, running, serving

HEARTBEAT_S = 0.3


class _Gateway(agent_pb2_grpc.AgentGatewayServicer):
    """Welcomes the agent and records the kind of every message after Register."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    async def Connect(self, request_iterator: Any, context: Any) -> AsyncIterator[agent_pb2.CoordinatorMessage]:
        first = await anext(request_iterator)
        assert first.WhichOneof("body") == "register"
        yield agent_pb2.CoordinatorMessage(welcome=agent_pb2.Welcome(coordinator_id="test",
                                                                     heartbeat_interval_s=HEARTBEAT_S))
        async for msg in request_iterator:
            self.kinds.append(msg.WhichOneof("body"))


async def _stream_for(seconds: float, telemetry_every_s: float | None) -> list[str]:
    gateway = _Gateway()
    outbox = Outbox(100)
    async with serving(gateway) as address:
        stream = AgentStream([address], lambda: agent_pb2.Register(), outbox, accept, Backoff(0.05, 0.1))
        async with running(stream):
            await asyncio.wait_for(stream.connected.wait(), 10)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if telemetry_every_s is not None:
                    outbox.add_sample(types_pb2.TelemetrySample(time_unix_s=time.time()))
                    stream.kick()
                await asyncio.sleep(telemetry_every_s or 0.05)
            await asyncio.sleep(0.05)
    return gateway.kinds


class TestHeartbeats:
    def test_no_heartbeat_while_telemetry_flows(self) -> None:
        """Telemetry more often than the heartbeat interval proves liveness: no separate heartbeats."""
        kinds = asyncio.run(_stream_for(6 * HEARTBEAT_S, telemetry_every_s=HEARTBEAT_S / 3))
        assert kinds.count("telemetry") >= 5
        assert kinds.count("heartbeat") <= 1, kinds   # at most one, before the first sample

    def test_heartbeats_when_telemetry_is_silent(self) -> None:
        """With nothing to send, a heartbeat goes out every interval."""
        kinds = asyncio.run(_stream_for(6 * HEARTBEAT_S, telemetry_every_s=None))
        assert "telemetry" not in kinds
        assert 2 <= kinds.count("heartbeat") <= 8, kinds   # ~6; loose for a loaded machine


class _Standby(agent_pb2_grpc.AgentGatewayServicer):
    """A standby that names a leader (itself, as a restarted dead leader would) and closes."""

    def __init__(self) -> None:
        self.address = ""
        self.connects = 0

    async def Connect(self, request_iterator: Any, context: Any) -> AsyncIterator[agent_pb2.CoordinatorMessage]:
        await anext(request_iterator)
        self.connects += 1
        yield agent_pb2.CoordinatorMessage(redirect=agent_pb2.Redirect(leader_address=self.address))


class TestRedirectLoop:
    def test_redirect_to_itself_backs_off(self) -> None:
        """A standby that redirects to its own address is not hammered: after two redirects in a row the
        agent backs off, so the connects in half a second stay few."""
        async def scenario() -> int:
            standby = _Standby()
            async with serving(standby) as address:
                standby.address = address
                stream = AgentStream([address], lambda: agent_pb2.Register(), Outbox(10), accept, Backoff(0.2, 0.4))
                async with running(stream):
                    await asyncio.sleep(0.5)
            return standby.connects
        # 3 connects per round, rounds apart by at least 0.1, 0.2, 0.2 s: at most 4 rounds; a loop makes hundreds.
        assert asyncio.run(scenario()) <= 12


class _Flaky(agent_pb2_grpc.AgentGatewayServicer):
    """Welcomes each connect with a new leader epoch and breaks the first two sessions right after."""

    def __init__(self) -> None:
        self.lost: list[int] = []    # Register.lost_leader_epoch of every connect

    async def Connect(self, request_iterator: Any, context: Any) -> AsyncIterator[agent_pb2.CoordinatorMessage]:
        first = await anext(request_iterator)
        self.lost.append(first.register.lost_leader_epoch)
        epoch = 7 + len(self.lost)
        yield agent_pb2.CoordinatorMessage(welcome=agent_pb2.Welcome(coordinator_id="test", leader_epoch=epoch))
        if len(self.lost) <= 2:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "leader went away")
        async for _ in request_iterator:
            pass


class TestLostLeaderEpoch:
    def test_a_broken_session_names_its_leader_epoch_at_the_next_register(self) -> None:
        """After a welcomed session breaks, the next Register carries that session's leader epoch (so a
        standby holds the agent instead of sending it back); a welcome clears it."""
        async def scenario() -> list[int]:
            gateway = _Flaky()
            async with serving(gateway) as address:
                stream = AgentStream([address], lambda: agent_pb2.Register(), Outbox(10), accept, Backoff(0.02, 0.05))
                async with running(stream):
                    deadline = time.monotonic() + 10
                    while len(gateway.lost) < 3 or not stream.connected.is_set():
                        assert time.monotonic() < deadline, gateway.lost
                        await asyncio.sleep(0.02)
            return gateway.lost
        assert asyncio.run(scenario()) == [0, 8, 9]
