"""An agent refuses what it does not understand and goes on: a real AgentStream and TaskRuntime against a
coordinator stand-in on loopback gRPC that sends a message kind newer than the agent, an unset action, an action
newer than the agent, then a stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agent.outbox import Outbox
from agent.runtime import TaskRuntime
from agent.stream import AgentStream, Backoff
from common.pb.gptrm.v1 import agent_pb2, agent_pb2_grpc
from common.types import TaskState
from tests.helpers.agent_stream import running, serving

# Field 42 of Decision, length-delimited and empty: an action a newer coordinator might send.
_NEWER_ACTION = b"\xd2\x02\x00"
# Field 90 of CoordinatorMessage: a kind of message a newer coordinator might send.
_NEWER_MESSAGE = b"\xd2\x05\x00"


def _newer(decision_id: str) -> agent_pb2.Decision:
    return agent_pb2.Decision.FromString(agent_pb2.Decision(decision_id=decision_id).SerializeToString()
                                         + _NEWER_ACTION)


class _Coordinator(agent_pb2_grpc.AgentGatewayServicer):
    """Welcomes the agent, sends ``decisions`` one by one and records every ack."""

    def __init__(self, decisions: list[agent_pb2.Decision]) -> None:
        self.decisions = decisions
        self.connects = 0
        self.acks: list[agent_pb2.DecisionAck] = []
        self.all_acked = asyncio.Event()

    async def Connect(self, request_iterator: Any, context: Any) -> AsyncIterator[agent_pb2.CoordinatorMessage]:
        self.connects += 1
        await anext(request_iterator)
        yield agent_pb2.CoordinatorMessage(welcome=agent_pb2.Welcome(coordinator_id="stand-in",
                                                                     heartbeat_interval_s=5))
        yield agent_pb2.CoordinatorMessage.FromString(_NEWER_MESSAGE)   # a message kind newer than the agent
        for d in self.decisions:
            yield agent_pb2.CoordinatorMessage(decision=d)
        async for msg in request_iterator:
            if msg.WhichOneof("body") == "decision_ack":
                self.acks.append(msg.decision_ack)
                if len(self.acks) == len(self.decisions):
                    self.all_acked.set()


class TestUnknownDecisions:
    def test_unset_and_newer_actions_are_refused_and_the_stop_after_them_runs(self, tmp_path: Path) -> None:
        """Refused acks naming the problem, one connection throughout, and the stop that follows carried out."""
        async def scenario() -> None:
            statuses: list[agent_pb2.TaskStatus] = []
            runtime = TaskRuntime(tmp_path / "state", statuses.append, gpus=None)
            start = agent_pb2.Decision(decision_id="d-start",
                                       start=agent_pb2.StartTask(task_id="t1", argv=["sleep", "300"]))
            assert (await runtime.handle(start)).ok
            coordinator = _Coordinator([
                agent_pb2.Decision(decision_id="d-unset"),
                _newer("d-newer"),
                agent_pb2.Decision(decision_id="d-stop", stop=agent_pb2.StopTask(task_id="t1", grace_s=2)),
            ])
            try:
                async with serving(coordinator) as address:
                    stream = AgentStream([address], lambda: agent_pb2.Register(), Outbox(100), runtime.handle,
                                         Backoff(0.05, 0.1))
                    async with running(stream):
                        await asyncio.wait_for(coordinator.all_acked.wait(), 30)
            finally:
                await runtime.shutdown()
            unset, newer, stopped = coordinator.acks
            assert (unset.decision_id, unset.ok) == ("d-unset", False) and "no action" in unset.reason
            assert (newer.decision_id, newer.ok) == ("d-newer", False) and "field 42" in newer.reason
            assert stopped.decision_id == "d-stop" and stopped.ok, stopped.reason
            assert stopped.resulting_state == int(TaskState.CANCELLED)
            assert coordinator.connects == 1
            assert TaskState(statuses[-1].state) == TaskState.CANCELLED

        asyncio.run(scenario())

    def test_an_unexpected_error_is_a_refused_ack(self, tmp_path: Path) -> None:
        """An error no handler expects, raised while carrying out a decision, becomes a refusal naming it."""
        async def scenario() -> agent_pb2.DecisionAck:
            runtime = TaskRuntime(tmp_path / "state", lambda s: None, gpus=object())   # no set_power_limit
            try:
                return await runtime.handle(agent_pb2.Decision(
                    decision_id="d-pl", set_power_limit=agent_pb2.SetPowerLimit(gpu_index=0, power_limit_w=300)))
            finally:
                await runtime.shutdown()

        ack = asyncio.run(scenario())
        assert not ack.ok and "AttributeError" in ack.reason and "set_power_limit" in ack.reason
