"""A task that ended by itself reports its own end, even when a stop arrives after it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agent.runtime import TaskRuntime
from common.pb.gptrm.v1 import agent_pb2
from common.types import TaskState
from tests.helpers.builders import start_decision


async def _ended(statuses: list[agent_pb2.TaskStatus], timeout_s: float = 20.0) -> agent_pb2.TaskStatus:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = [s for s in statuses if s.has_exit_code]
        if done:
            return done[-1]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no end reported within {timeout_s}s")


class TestOwnEnd:
    def test_a_missing_program_fails_with_its_reason_even_when_stopped_after(self, tmp_path: Path) -> None:
        """A part whose launcher is missing exits 127; a stop that comes after (a gang's other part failed the
        same way) does not turn it into "cancelled": it is FAILED, and its reason says what was missing."""
        async def scenario() -> None:
            statuses: list[agent_pb2.TaskStatus] = []
            rt = TaskRuntime(tmp_path / "state", statuses.append, gpus=None)
            # The agent finishes the task's end only once the stop has come, so the stop meets a task whose
            # exit code is recorded but not yet reported (the window a gang's other part hits).
            stop_came = asyncio.Event()
            known, end_processes = rt._known, rt._end_processes

            def _known(task_id: str):  # type: ignore[no-untyped-def]
                stop_came.set()
                return known(task_id)

            async def _end_processes(rec):  # type: ignore[no-untyped-def]
                await stop_came.wait()
                await end_processes(rec)

            rt._known, rt._end_processes = _known, _end_processes  # type: ignore[method-assign]
            assert (await rt.handle(start_decision("t1", ["torchrun-missing", "train.py"]))).ok
            rec = rt.table.tasks["t1"]
            deadline = time.monotonic() + 20
            while not Path(rec.exit_file).exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            stop = agent_pb2.Decision(decision_id="stop-t1")
            stop.stop.task_id = "t1"
            ack = await rt.handle(stop)
            end = await _ended(statuses)
            await rt.shutdown()
            assert ack.ok and ack.resulting_state == int(TaskState.FAILED)
            assert end.state == int(TaskState.FAILED) and end.exit_code == 127
            assert "torchrun-missing: not found on the task's PATH" in end.reason, end.reason
            assert [s.state for s in statuses].count(int(TaskState.CANCELLED)) == 0

        asyncio.run(scenario())

    def test_a_running_task_stopped_is_cancelled(self, tmp_path: Path) -> None:
        """A stop that reaches a task still running ends it CANCELLED, as before."""
        async def scenario() -> None:
            statuses: list[agent_pb2.TaskStatus] = []
            rt = TaskRuntime(tmp_path / "state", statuses.append, gpus=None)
            assert (await rt.handle(start_decision("t2", ["sleep", "60"]))).ok
            stop = agent_pb2.Decision(decision_id="stop-t2")
            stop.stop.task_id = "t2"
            stop.stop.grace_s = 5.0
            assert (await rt.handle(stop)).ok
            end = await _ended(statuses)
            await rt.shutdown()
            assert end.state == int(TaskState.CANCELLED) and end.reason == "stopped by the coordinator"

        asyncio.run(scenario())
