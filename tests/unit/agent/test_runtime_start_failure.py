"""A task whose wrapper fails before the task runs says why, in its log and in its reason."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agent.logstore import TaskLog
from agent.runtime import TaskRuntime
from common.pb.gptrm.v1 import agent_pb2
from common.types import TaskState


async def _run_until_ended(rt: TaskRuntime, statuses: list[agent_pb2.TaskStatus], task_id: str) -> None:
    ack = await rt.handle(agent_pb2.Decision(decision_id=f"d-{task_id}", start=agent_pb2.StartTask(
        task_id=task_id, argv=["echo", "never-printed"])))
    assert ack.ok, ack.reason
    deadline = time.monotonic() + 30
    while not any(s.has_exit_code for s in statuses):
        assert time.monotonic() < deadline, "the task never ended"
        await asyncio.sleep(0.05)
    await rt.shutdown()


class TestWrapperFailure:
    def test_a_wrapper_that_cannot_open_the_fifo_says_so(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A state directory given relative to the agent's directory (no longer possible from the configuration):
        the wrapper, in the task's working directory, cannot open the task's FIFO. The task fails with a reason
        that says it did not start and why, and its log holds the wrapper's message."""
        monkeypatch.chdir(tmp_path)
        statuses: list[agent_pb2.TaskStatus] = []
        rt = TaskRuntime(Path("relative-state"), statuses.append, gpus=None, cgroups=False)
        asyncio.run(_run_until_ended(rt, statuses, "t1"))

        [ended] = [s for s in statuses if s.has_exit_code]
        assert TaskState(ended.state) == TaskState.FAILED
        assert ended.reason.startswith("the task did not start: its wrapper exited with code ")
        assert "output.fifo" in ended.reason, ended.reason
        log, _ = TaskLog(tmp_path / "relative-state" / "tasks" / "t1" / "output.log").tail(0)
        assert b"output.fifo" in log and b"never-printed" not in log
        assert "output.fifo" in ended.log_tail
