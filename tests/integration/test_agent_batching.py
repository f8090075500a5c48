"""The agent stream's batching against a real coordinator process (real etcd, real gRPC): an agent that reads
Decisions gets the starts placed together in one message, and its Reports (acks and events together) run the
tasks to their end; an agent that does not gets one Decision each; a Reports message over the limit ends the
stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio

from common.pb.gptrm.v1 import agent_pb2, agent_pb2_grpc, types_pb2
from common.types import MAX_REPORTS
from tests.integration.harness import Cluster

GIB = 1024**3


def _register(node_id: str, *, reads_decisions: bool) -> agent_pb2.AgentMessage:
    inv = types_pb2.NodeInventory(node_id=node_id, hostname=node_id, cpu_cores=64, mem_total_bytes=256 * GIB,
                                  simulated=True, gpu_backend="simulated", advertise_address="127.0.0.1")
    for i in range(8):
        inv.gpus.add(index=i, uuid=f"GPU-{node_id}-{i}", model="H100-80GB", mem_total_bytes=80 * GIB)
    return agent_pb2.AgentMessage(register=agent_pb2.Register(inventory=inv, boot_id=1,
                                                              reads_decisions=reads_decisions))


class _RawAgent:
    """One agent stream spoken by the test itself: what the coordinator sent, and the start decisions in it."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.got: list[agent_pb2.CoordinatorMessage] = []
        self.acked = 0

    def starts(self) -> list[agent_pb2.Decision]:
        out: list[agent_pb2.Decision] = []
        for m in self.got:
            out += list(m.decisions.decisions) if m.HasField("decisions") else [m.decision] if m.HasField("decision") \
                else []
        return [d for d in out if d.HasField("start")]

    async def read_until(self, done: Callable[[_RawAgent], bool], timeout_s: float = 30.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not done(self):
                msg = await self.call.read()
                assert msg is not grpc.aio.EOF, "the coordinator ended the stream"
                self.got.append(msg)
                if msg.HasField("event_ack"):
                    self.acked = max(self.acked, msg.event_ack.up_to_seq)


def _states(cluster: Cluster, array_id: str) -> list[str]:
    return sorted(e["state"] for e in cluster.ctl_json("tasks", array_id)["tasks"])


def test_decisions_and_reports_carry_tasks_to_their_end(cluster: Cluster) -> None:
    addr = cluster.start_coordinator("c1")
    cluster.wait_leader("c1")

    async def run() -> tuple[list[agent_pb2.CoordinatorMessage], str]:
        async with grpc.aio.insecure_channel(addr) as ch:
            agent = _RawAgent(agent_pb2_grpc.AgentGatewayStub(ch).Connect())
            await agent.call.write(_register("b1", reads_decisions=True))
            welcome = await agent.call.read()
            assert welcome.welcome.accepts_reports
            res = await asyncio.to_thread(cluster.ctl, "-o", "json", "submit", "--array", "0-3", "--gpus", "1",
                                          "--gpu-mem-gib", "1", "--cpu", "0.1", "--", "true")
            assert res.returncode == 0, res.stderr
            array_id = json.loads(res.stdout)["array_id"]
            await agent.read_until(lambda a: len(a.starts()) == 4)
            starts = agent.starts()
            # One message: every ack, then each task's STARTING and RUNNING.
            statuses = [agent_pb2.TaskStatus(task_id=d.start.task_id, state=state, decision_id=d.decision_id,
                                             event_seq=1 + 2 * k + j, pids=[1000 + k])
                        for k, d in enumerate(starts)
                        for j, state in enumerate((types_pb2.TASK_STATE_STARTING, types_pb2.TASK_STATE_RUNNING))]
            acks = [agent_pb2.DecisionAck(decision_id=d.decision_id, ok=True, task_id=d.start.task_id)
                    for d in starts]
            await agent.call.write(agent_pb2.AgentMessage(reports=agent_pb2.Reports(decision_acks=acks,
                                                                                    statuses=statuses)))
            await agent.read_until(lambda a: a.acked == 8)
            ends = [agent_pb2.TaskStatus(task_id=d.start.task_id, state=types_pb2.TASK_STATE_SUCCEEDED,
                                         decision_id=d.decision_id, event_seq=9 + k, has_exit_code=True, exit_code=0)
                    for k, d in enumerate(starts)]
            await agent.call.write(agent_pb2.AgentMessage(reports=agent_pb2.Reports(statuses=ends)))
            await agent.read_until(lambda a: a.acked == 12)
            agent.call.cancel()
            return agent.got, array_id

    got, array_id = asyncio.run(run())
    batches = [m for m in got if m.HasField("decisions")]
    assert batches and max(len(m.decisions.decisions) for m in batches) > 1   # placed together, sent together
    assert _states(cluster, array_id) == ["succeeded"] * 4
    # Each start came with its running in one message: both stored in one write (one time for both history entries).
    for index in range(4):
        task = cluster.ctl_json("tasks", f"{array_id}:{index}")
        history = [(h["state"], h["time_unix_s"]) for h in task["history"]]
        states = [state for state, _t in history]
        at = states.index("starting")
        assert states[at:at + 2] == ["starting", "running"] and history[at][1] == history[at + 1][1], history


def test_an_agent_that_does_not_read_decisions_gets_one_each(cluster: Cluster) -> None:
    addr = cluster.start_coordinator("c1")
    cluster.wait_leader("c1")

    async def run() -> list[agent_pb2.CoordinatorMessage]:
        async with grpc.aio.insecure_channel(addr) as ch:
            agent = _RawAgent(agent_pb2_grpc.AgentGatewayStub(ch).Connect())
            await agent.call.write(_register("b2", reads_decisions=False))
            await agent.call.read()
            res = await asyncio.to_thread(cluster.ctl, "submit", "--array", "0-3", "--gpus", "1", "--gpu-mem-gib", "1",
                                          "--cpu", "0.1", "--", "true")
            assert res.returncode == 0, res.stderr
            await agent.read_until(lambda a: len(a.starts()) == 4)
            agent.call.cancel()
            return agent.got

    got = asyncio.run(run())
    assert not any(m.HasField("decisions") for m in got)
    assert sum(m.HasField("decision") for m in got) >= 4


def test_reports_over_the_limit_end_the_stream(cluster: Cluster) -> None:
    addr = cluster.start_coordinator("c1")
    cluster.wait_leader("c1")

    async def run() -> bool:
        async with grpc.aio.insecure_channel(addr) as ch:
            call = agent_pb2_grpc.AgentGatewayStub(ch).Connect()
            await call.write(_register("b3", reads_decisions=True))
            await call.read()
            too_many = [agent_pb2.TaskStatus(task_id=f"t-{i:010d}", state=types_pb2.TASK_STATE_RUNNING, event_seq=i + 1)
                        for i in range(MAX_REPORTS + 1)]
            await call.write(agent_pb2.AgentMessage(reports=agent_pb2.Reports(statuses=too_many)))
            async with asyncio.timeout(30):
                while True:
                    try:
                        msg = await call.read()
                    except grpc.aio.AioRpcError:
                        return True
                    if msg is grpc.aio.EOF:
                        return True
                    assert not msg.HasField("event_ack"), "an event of a refused message was acknowledged"

    assert asyncio.run(run())
    assert "at most 256" in cluster.logs()
