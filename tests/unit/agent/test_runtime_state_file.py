"""The agent never runs a task it could not record in its state file: it refuses the start and says why."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import psutil

from agent.runtime import TaskRuntime
from agent.tasktable import TaskTable
from common.pb.gptrm.v1 import agent_pb2
from common.types import TaskState


def start(task_id: str) -> agent_pb2.Decision:
    """A start decision for a long-running task."""
    return agent_pb2.Decision(decision_id=f"d-{task_id}", start=agent_pb2.StartTask(task_id=task_id,
                                                                                   argv=["sleep", "300"]))


def sleepers() -> list[psutil.Process]:
    """This test process's children running ``sleep 300``."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.cmdline()[-2:] == ["sleep", "300"]:
                out.append(p)
        except psutil.Error:
            continue
    return out


class _FillingTable(TaskTable):
    """A task table on a disk that fills up: saves succeed until ``saves_left`` reaches 0, then fail with ENOSPC."""

    saves_left = 1

    def save(self) -> None:
        if self.saves_left <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.saves_left -= 1
        super().save()


class TestUnrecordableStart:
    def test_unwritable_state_file_refuses_start(self, tmp_path: Path) -> None:
        """With the state file unwritable the start is refused naming the state file, and no process starts."""
        statuses: list[agent_pb2.TaskStatus] = []
        rt = TaskRuntime(tmp_path / "state", statuses.append, gpus=None)
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("")
        rt.table.path = blocker / "tasks.json"   # its parent is a file: every save fails (as root too)

        ack = asyncio.run(rt.handle(start("t1")))

        assert not ack.ok and "state file" in ack.reason and "t1" in ack.reason
        assert ack.task_id == "t1"
        assert statuses == [] and rt.table.tasks == {}
        assert sleepers() == []

    def test_save_failing_after_spawn_kills_task(self, tmp_path: Path) -> None:
        """If the record cannot be saved once the process runs, the task is killed, reported FAILED with the cause,
        and the start refused."""
        statuses: list[agent_pb2.TaskStatus] = []
        rt = TaskRuntime(tmp_path / "state", statuses.append, gpus=None)
        rt.table = _FillingTable(rt.table.path)   # the check before the start passes; the save after it fails

        ack = asyncio.run(rt.handle(start("t2")))

        assert not ack.ok and "state file" in ack.reason
        assert [TaskState(s.state) for s in statuses][-1] == TaskState.FAILED
        assert "could not record" in statuses[-1].reason and statuses[-1].has_exit_code
        assert {s.decision_id for s in statuses} == {"d-t2"}   # every report names the run's start decision
        assert rt.table.tasks == {}
        assert sleepers() == []

    def test_writable_state_file_starts(self, tmp_path: Path) -> None:
        """With a writable state file the same start runs and is recorded."""
        statuses: list[agent_pb2.TaskStatus] = []

        async def run() -> None:
            rt = TaskRuntime(tmp_path / "state", statuses.append, gpus=None)
            ack = await rt.handle(start("t3"))
            assert ack.ok
            assert "t3" in TaskTable.load(rt.table.path).tasks
            await rt.handle(agent_pb2.Decision(decision_id="s", stop=agent_pb2.StopTask(task_id="t3", grace_s=1)))
            await rt.shutdown()

        asyncio.run(run())
        assert TaskState(statuses[-1].state) == TaskState.CANCELLED
