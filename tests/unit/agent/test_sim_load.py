"""Simulated GPUs follow each task's own load, end to end in one agent: real task processes started by the
runtime, their CPU usage read by the host collector, the sampler feeding it to the simulated GPUs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from agent.collectors.host import HostCollector
from agent.collectors.simulated import SimulatedGpus
from agent.runtime import TaskRuntime
from agent.sampler import Sampler
from common.pb.gptrm.v1 import agent_pb2
from tests.integration.harness import wait_until


def _start(task_id: str, gpu: int, argv: list[str], env: dict[str, str] | None = None) -> agent_pb2.Decision:
    return agent_pb2.Decision(decision_id=f"d-{task_id}", start=agent_pb2.StartTask(
        task_id=task_id, argv=argv, gpu_indices=[gpu], env=env or {}, stop_grace_s=1))


def test_sleeping_task_idle_busy_task_busy_declared_task_at_its_load(tmp_path: Path) -> None:
    """``sleep`` leaves its simulated GPU idle; a busy loop drives its GPU up; GPTRM_SIM_LOAD=60% holds 0.6."""
    gpus = SimulatedGpus("4xH100-80GB", "n1", jitter=0.0)

    async def scenario() -> tuple[float, float, float]:
        runtime = TaskRuntime(tmp_path / "state", lambda status: None, gpus=gpus, cgroups=False)
        sampler = Sampler(gpus, [HostCollector(task_pids=runtime.task_pids, rescan_every=1)],
                          log=structlog.get_logger())
        try:
            for decision in (_start("sleeper", 0, ["sleep", "300"]),
                             _start("busy", 1, ["sh", "-c", "while :; do :; done"]),
                             _start("declared", 2, ["sleep", "300"], {"GPTRM_SIM_LOAD": "60%"})):
                ack = await runtime.handle(decision)
                assert ack.ok, ack.reason

            def utils() -> list[float]:
                return [g.util_gpu for g in sampler.sample_once().gpus]

            busy = await asyncio.to_thread(wait_until, lambda: u if (u := utils())[1] > 0.3 else None,
                                           30, 0.2, "the busy task's GPU busy")
            return busy[0], busy[2], busy[3]
        finally:
            for task_id in ("sleeper", "busy", "declared"):
                await runtime.handle(agent_pb2.Decision(decision_id=f"s-{task_id}",
                                                        stop=agent_pb2.StopTask(task_id=task_id, grace_s=1)))
            await runtime.shutdown()

    sleeper, declared, unused = asyncio.run(scenario())
    assert sleeper == 0.0 and unused == 0.0
    assert abs(declared - 0.6) < 1e-9
