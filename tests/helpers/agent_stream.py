"""An AgentGateway served on loopback and an AgentStream run against it, for the agent's stream tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc.aio

from agent.stream import AgentStream
from common.pb.gptrm.v1 import agent_pb2, agent_pb2_grpc


@contextlib.asynccontextmanager
async def serving(gateway: agent_pb2_grpc.AgentGatewayServicer) -> AsyncIterator[str]:
    """Serve ``gateway`` on a free loopback port for the block; yields its address (``127.0.0.1:port``)."""
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentGatewayServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


@contextlib.asynccontextmanager
async def running(stream: AgentStream) -> AsyncIterator[None]:
    """Run ``stream`` for the block, then stop it and wait for it to end (10 s at most)."""
    stop = asyncio.Event()
    runner = asyncio.create_task(stream.run(stop))
    try:
        yield
    finally:
        stop.set()
        stream.kick()
        await asyncio.wait_for(runner, 10)


async def accept(decision: agent_pb2.Decision) -> agent_pb2.DecisionAck:
    """A decision handler that accepts every decision."""
    return agent_pb2.DecisionAck(decision_id=decision.decision_id, ok=True)
