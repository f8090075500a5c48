"""AgentStream and the coordinator's telemetry rate, against a real grpc.aio AgentGateway on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from agent.outbox import Outbox
from agent.stream import AgentStream, Backoff
from common.pb.gptrm.v1 import agent_pb2, agent_pb2_grpc, types_pb2
from tests.helpers.agent_stream import accept, running, serving

SAMPLING_S = 0.05
REPORT_S = 0.5


class _Gateway(agent_pb2_grpc.AgentGatewayServicer):
    """Welcomes at every sample (an older coordinator's Welcome), then pushes a longer report interval."""

    def __init__(self) -> None:
        self.messages: list[agent_pb2.AgentMessage] = []

    async def Connect(self, request_iterator: Any, context: Any) -> AsyncIterator[agent_pb2.CoordinatorMessage]:
        await anext(request_iterator)
        yield agent_pb2.CoordinatorMessage(welcome=agent_pb2.Welcome(coordinator_id="t", heartbeat_interval_s=0.1))
        yield agent_pb2.CoordinatorMessage(telemetry_rate=agent_pb2.TelemetryRate(report_interval_s=REPORT_S))
        async for msg in request_iterator:
            self.messages.append(msg)


async def _run(seconds: float) -> list[agent_pb2.AgentMessage]:
    gateway = _Gateway()
    outbox = Outbox(100, sampling_interval_s=SAMPLING_S)
    async with serving(gateway) as address:
        stream = AgentStream([address], lambda: agent_pb2.Register(), outbox, accept, Backoff(0.05, 0.1))
        async with running(stream):
            await asyncio.wait_for(stream.connected.wait(), 10)
            deadline = time.monotonic() + 10
            while outbox.report_interval_s != REPORT_S and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            t = time.time()
            end = time.monotonic() + seconds
            while time.monotonic() < end:   # the sampler: one sample per sampling interval
                outbox.add_sample(types_pb2.TelemetrySample(time_unix_s=t, gpus=[types_pb2.GpuSample(index=0,
                                                                                                    util_gpu=0.5)]))
                t += SAMPLING_S
                await asyncio.sleep(SAMPLING_S)
    return gateway.messages


class TestTelemetryRate:
    def test_push_turns_samples_into_summaries_and_quiets_heartbeats(self) -> None:
        """After a TelemetryRate push the agent sends summaries of ~10 samples, and its heartbeat follows the
        report interval (0.1 s heartbeats would be ~30 over the same time)."""
        messages = asyncio.run(_run(3.0))
        telemetry = [s for m in messages if m.WhichOneof("body") == "telemetry" for s in m.telemetry.samples]
        heartbeats = sum(1 for m in messages if m.WhichOneof("body") == "heartbeat")
        assert 4 <= len(telemetry) <= 8, len(telemetry)            # 3 s / 0.5 s = 6
        assert all(s.summarised_samples >= 1 for s in telemetry)
        assert all(s.summarised_samples == 10 for s in telemetry[1:-1]), [s.summarised_samples for s in telemetry]
        assert telemetry[1].gpus[0].util_gpu_max == 0.5
        assert heartbeats <= 6, heartbeats
