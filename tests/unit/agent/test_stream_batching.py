"""AgentStream's batching against a real grpc.aio AgentGateway on loopback: what is queued together goes as one
Reports message to a coordinator that reads them, one message each to one that does not; a Decisions message is
carried out in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agent.outbox import Outbox
from agent.stream import AgentStream, Backoff
from common.pb.gptrm.v1 import agent_pb2, agent_pb2_grpc, types_pb2
from tests.helpers.agent_stream import running, serving


class _Gateway(agent_pb2_grpc.AgentGatewayServicer):
    """Welcomes the agent (saying whether it reads Reports), sends ``decisions`` as one Decisions message, and
    records every message after Register."""

    def __init__(self, *, accepts_reports: bool, decisions: list[agent_pb2.Decision]) -> None:
        self.accepts_reports, self.decisions = accepts_reports, decisions
        self.register: agent_pb2.Register | None = None
        self.got: list[agent_pb2.AgentMessage] = []

    async def Connect(self, request_iterator: Any, context: Any) -> AsyncIterator[agent_pb2.CoordinatorMessage]:
        first = await anext(request_iterator)
        self.register = first.register
        yield agent_pb2.CoordinatorMessage(welcome=agent_pb2.Welcome(
            coordinator_id="test", heartbeat_interval_s=30.0, accepts_reports=self.accepts_reports))
        if self.decisions:
            yield agent_pb2.CoordinatorMessage(decisions=agent_pb2.Decisions(decisions=self.decisions))
        async for msg in request_iterator:
            self.got.append(msg)

    def statuses(self) -> list[tuple[str, int]]:
        out: list[agent_pb2.TaskStatus] = []
        for m in self.got:
            out += m.reports.statuses if m.HasField("reports") else [m.task_status] if m.HasField("task_status") else []
        return [(s.task_id, s.event_seq) for s in out]

    def acks(self) -> list[str]:
        out: list[agent_pb2.DecisionAck] = []
        for m in self.got:
            out += m.reports.decision_acks if m.HasField("reports") else \
                [m.decision_ack] if m.HasField("decision_ack") else []
        return [a.decision_id for a in out]


def _event(task_id: str) -> agent_pb2.TaskStatus:
    return agent_pb2.TaskStatus(task_id=task_id, state=types_pb2.TASK_STATE_RUNNING)


async def _session(gateway: _Gateway, events: int, until: Any) -> list[str]:
    """Queue ``events`` events before connecting, run the stream until ``until(gateway)``; returns the decision ids
    carried out, in order."""
    outbox = Outbox(100)
    for i in range(events):
        outbox.add_event(_event(f"t-{i}"))
    carried: list[str] = []

    async def decide(d: agent_pb2.Decision) -> agent_pb2.DecisionAck:
        carried.append(d.decision_id)
        return agent_pb2.DecisionAck(decision_id=d.decision_id, ok=True)

    async with serving(gateway) as address:
        stream = AgentStream([address], lambda: agent_pb2.Register(), outbox, decide, Backoff(0.05, 0.1))
        async with running(stream):
            await asyncio.wait_for(stream.connected.wait(), 10)
            async with asyncio.timeout(10):
                while not until(gateway):
                    await asyncio.sleep(0.02)
    return carried


def test_queued_events_and_acks_go_as_reports_to_a_coordinator_that_reads_them() -> None:
    decisions = [agent_pb2.Decision(decision_id=f"d-{i}") for i in range(3)]
    gateway = _Gateway(accepts_reports=True, decisions=decisions)
    carried = asyncio.run(_session(gateway, 5, lambda g: len(g.statuses()) == 5 and len(g.acks()) == 3))
    assert gateway.register is not None and gateway.register.reads_decisions
    assert carried == ["d-0", "d-1", "d-2"]   # the Decisions message, carried out in order
    assert gateway.statuses() == [(f"t-{i}", i + 1) for i in range(5)]
    assert gateway.acks() == ["d-0", "d-1", "d-2"]
    reports = [m for m in gateway.got if m.HasField("reports")]
    assert reports and len(reports[0].reports.statuses) == 5   # the five queued events in one message
    assert not any(m.HasField("task_status") for m in gateway.got)


def test_an_older_coordinator_gets_one_message_each() -> None:
    gateway = _Gateway(accepts_reports=False, decisions=[agent_pb2.Decision(decision_id="d-0"),
                                                          agent_pb2.Decision(decision_id="d-1")])
    carried = asyncio.run(_session(gateway, 4, lambda g: len(g.statuses()) == 4 and len(g.acks()) == 2))
    assert carried == ["d-0", "d-1"]
    assert not any(m.HasField("reports") for m in gateway.got)
    assert [m.WhichOneof("body") for m in gateway.got if m.WhichOneof("body") != "heartbeat"].count("task_status") == 4
    assert gateway.statuses() == [(f"t-{i}", i + 1) for i in range(4)]
