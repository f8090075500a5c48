"""The agent's answer to a decision about a task it does not run says so explicitly."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.runtime import TaskRuntime
from common.pb.gptrm.v1 import agent_pb2


class TestUnknownTask:
    def test_stop_pause_resume_of_an_unknown_task_are_refused_as_unknown(self, tmp_path: Path) -> None:
        """Stop, pause and resume of a task this agent never ran are refused with task_unknown set."""
        rt = TaskRuntime(tmp_path, lambda status: None, gpus=None)
        for i, action in enumerate(("stop", "pause", "resume")):
            d = agent_pb2.Decision(decision_id=f"d{i}")
            getattr(d, action).task_id = "ghost"
            ack = asyncio.run(rt.handle(d))
            assert (ack.ok, ack.task_unknown, ack.task_id) == (False, True, "ghost")
            assert "not running on this node" in ack.reason

    def test_other_refusals_are_not_marked_unknown(self, tmp_path: Path) -> None:
        """A start refused for its own reasons (empty argv) does not claim the task is unknown."""
        rt = TaskRuntime(tmp_path, lambda status: None, gpus=None)
        d = agent_pb2.Decision(decision_id="s")
        d.start.task_id = "t"
        ack = asyncio.run(rt.handle(d))
        assert not ack.ok and not ack.task_unknown and "empty argv" in ack.reason
