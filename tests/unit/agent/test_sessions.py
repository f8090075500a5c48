"""Agent sessions: exec's command line (the root steps, then the task's credentials, never the task's environment
on it) and a session's output window."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agent import launch, sessions
from agent.sessions import TaskContext, exec_command
from common.errors import GptrmError
from common.pb.gptrm.v1 import agent_pb2

_PROGRAMS = launch.Programs(setpriv="/usr/bin/setpriv")


def _ctx(**kw: object) -> TaskContext:
    base: dict[str, object] = dict(pid=4242, own_namespaces=True, uid=1879048192, gid=1879048192, groups=(),
                                   cgroup="/sys/fs/cgroup/gptrm-x-t1", cwd="/work/t1", env={"HF_TOKEN": "secret"},
                                   agent_dir=Path("/state/tasks/t1"))
    base.update(kw)
    return TaskContext(**base)  # type: ignore[arg-type]


class TestExecCommand:
    @pytest.mark.skipif(os.geteuid() != 0, reason="a root agent drops to the task's user")
    def test_joins_cgroup_enters_namespaces_then_drops_to_the_tasks_user(self) -> None:
        argv = exec_command(_ctx(), ["nvidia-smi"], Path("/state/tasks/t1/exec-s.env"), _PROGRAMS,
                            nsenter="/usr/bin/nsenter", setsid="/usr/bin/setsid", pty=False)
        assert argv[:3] == ["/bin/sh", "-c", argv[2]] and argv[4:6] == ["/sys/fs/cgroup/gptrm-x-t1",
                                                                        "/state/tasks/t1/exec-s.env"]
        nsenter = argv.index("/usr/bin/nsenter")
        setpriv = argv.index("/usr/bin/setpriv")
        assert nsenter < setpriv < len(argv) - 1 and argv[-1] == "nvidia-smi"
        assert "--target=4242" in argv and "--reuid=1879048192" in argv and "--clear-groups" in argv
        assert "--no-new-privs" in argv and "/usr/bin/setsid" not in argv
        assert not any("secret" in a for a in argv)   # the environment goes through the 0600 file

    def test_a_task_without_namespaces_is_not_entered_and_pty_gets_a_session(self) -> None:
        argv = exec_command(_ctx(own_namespaces=False), ["bash"], Path("/e"), _PROGRAMS, nsenter="/usr/bin/nsenter",
                            setsid="/usr/bin/setsid", pty=True)
        assert "/usr/bin/nsenter" not in argv
        assert argv[argv.index("/usr/bin/setsid"):argv.index("/usr/bin/setsid") + 3] == [
            "/usr/bin/setsid", "--ctty", "--wait"]


    def test_a_task_bound_to_cpus_runs_its_exec_on_them(self) -> None:
        """The process runtime binds a task with taskset, which joining its cgroup does not carry: exec binds the
        command to the task's CPUs, as the task's user, right before it runs; an unbound task's command is not."""
        programs = launch.Programs(setpriv="/usr/bin/setpriv", taskset="/usr/bin/taskset")
        argv = exec_command(_ctx(cpus="0-3,8"), ["bash"], Path("/e"), programs, nsenter="/usr/bin/nsenter",
                            setsid="/usr/bin/setsid", pty=True)
        at = argv.index("/usr/bin/taskset")
        assert argv[at:at + 4] == ["/usr/bin/taskset", "--cpu-list", "0-3,8", "/bin/sh"]
        assert argv.index("/usr/bin/setsid") < at and argv[-1] == "bash"
        if "/usr/bin/setpriv" in argv:
            assert argv.index("/usr/bin/setpriv") < at
        unbound = exec_command(_ctx(), ["bash"], Path("/e"), programs, nsenter="/usr/bin/nsenter",
                               setsid="/usr/bin/setsid", pty=False)
        assert "/usr/bin/taskset" not in unbound
        with pytest.raises(GptrmError, match="bound to CPUs 0-3,8 needs taskset"):
            exec_command(_ctx(cpus="0-3,8"), ["bash"], Path("/e"), _PROGRAMS, nsenter="/usr/bin/nsenter",
                         setsid="/usr/bin/setsid", pty=False)

    @pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binding narrower than the agent needs two CPUs")
    def test_the_context_reads_the_programs_cpus(self, tmp_path: Path) -> None:
        """task_context reads the CPUs of the task's program (the wrapper's child); a program on all the agent's
        CPUs is not bound."""
        one = min(os.sched_getaffinity(0))
        assert _cpus_once(f"taskset --cpu-list {one} sleep 30", expect=str(one), agent_dir=tmp_path) == str(one)
        assert _cpus_once("sleep 30", expect="", agent_dir=tmp_path) == ""


def _cpus_once(program: str, *, expect: str, agent_dir: Path) -> str:
    """The ``cpus`` task_context reads for a wrapper running ``program``, once it has started and reads ``expect``
    (or what it reads when 10 s have passed)."""
    wrapper = subprocess.Popen(["/bin/sh", "-c", f"{program} & sleep 30; wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        cpus = None
        while time.monotonic() < deadline:
            try:
                cpus = sessions.task_context(wrapper.pid, "/sys/fs/cgroup/x", agent_dir).cpus
            except GptrmError:   # no child yet
                cpus = None
            if cpus == expect:
                break
            time.sleep(0.05)
        assert cpus is not None, "the wrapper never had a child"
        return cpus
    finally:
        os.killpg(wrapper.pid, signal.SIGKILL)
        wrapper.wait()


class TestOutputWindow:
    def test_a_silent_reader_ends_its_session_not_the_stream(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Past WINDOW unacknowledged chunks the session waits for acks; after SLOW_S without one it ends with an
        error (its last message), having sent no more than its window."""
        monkeypatch.setattr(sessions, "SLOW_S", 0.05)
        sent: list[agent_pb2.SessionChunk] = []

        async def send(chunk: agent_pb2.SessionChunk) -> None:
            sent.append(chunk)

        async def scenario() -> bool:
            s = sessions._Session("s-1", "t1", send)
            for _ in range(sessions.WINDOW):
                assert await s.output(b"x")
            return await s.output(b"one too many")

        assert asyncio.run(scenario()) is False
        assert len([c for c in sent if c.data]) == sessions.WINDOW
        assert "acknowledged nothing" in sent[-1].error

    def test_acknowledgements_make_room(self) -> None:
        sent: list[agent_pb2.SessionChunk] = []

        async def send(chunk: agent_pb2.SessionChunk) -> None:
            sent.append(chunk)

        async def scenario() -> bool:
            s = sessions._Session("s-1", "t1", send)
            for _ in range(sessions.WINDOW):
                await s.output(b"x")
            later = asyncio.ensure_future(s.output(b"y"))
            await asyncio.sleep(0)
            s.acked(1)
            return await asyncio.wait_for(later, 5)

        assert asyncio.run(scenario()) is True
        assert [c.data for c in sent][-1] == b"y"
