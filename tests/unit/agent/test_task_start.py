"""The start of a task's processes (agent/launch.py): the task's environment reaches its own process only."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agent import launch
from common.errors import GptrmError
from tests.integration.harness import wait_until


def _run_stub(env_file: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """The exec stub as the wrapper runs it: the environment file on fd 4, the root steps' fixed environment."""
    opener = 'f=$1 s=$2; shift 2; exec 4<"$f"; exec /bin/sh -c "$s" gptrm-exec "$@"'
    return subprocess.run(["/bin/sh", "-c", opener, "wrapper", str(env_file), launch.EXEC_STUB, *argv],
                          env=launch.root_env(), capture_output=True, text=True, timeout=30, check=False)


class TestEnvironment:
    def test_values_survive_the_shell_unchanged(self, tmp_path: Path) -> None:
        """Quotes, dollars, backticks, backslashes, newlines and empty values reach the program as they were."""
        env = {"A": 'say "hi" $HOME `id` \\n back\\slash', "B": "line1\nline2", "Q": "it's 'quoted'", "EMPTY": "",
               "PATH": "/usr/bin:/bin"}
        path = tmp_path / "environment"
        launch.write_env_file(path, env)
        assert os.stat(path).st_mode & 0o777 == 0o600
        done = _run_stub(path, ["/usr/bin/env", "-0"])
        assert done.returncode == 0, done.stderr
        seen = dict(item.split("=", 1) for item in done.stdout.split("\0") if item)
        assert {k: seen.get(k) for k in env} == env

    def test_bad_names_and_nul_are_refused(self, tmp_path: Path) -> None:
        """A name that is no shell identifier, or a NUL in a value, is refused naming the variable."""
        with pytest.raises(GptrmError, match="'1BAD' is not a valid variable name"):
            launch.env_script({"1BAD": "x"})
        with pytest.raises(GptrmError, match="'A;id' is not a valid variable name"):
            launch.env_script({"A;id": "x"})
        with pytest.raises(GptrmError, match="env: K holds a NUL byte"):
            launch.env_script({"K": "a\0b"})

    def test_a_missing_program_names_the_path_searched(self, tmp_path: Path) -> None:
        """Exit 127 and one line naming the program, the PATH searched and how to change it."""
        path = tmp_path / "environment"
        launch.write_env_file(path, {"PATH": "/nonexistent/bin"})
        done = _run_stub(path, ["torchrun", "--nproc-per-node", "2"])
        assert done.returncode == 127
        assert "torchrun: not found on the task's PATH (/nonexistent/bin)" in done.stderr
        assert "--task-path" in done.stderr


class TestRootSteps:
    def test_root_steps_name_programs_by_absolute_path(self) -> None:
        """Every program a root step runs is found on the fixed system PATH, never a task's."""
        programs = launch.Programs.find()
        assert programs.setpriv.startswith("/") and programs.unshare.startswith("/")
        prefix = launch.namespace_prefix(programs, 64 << 20)
        assert prefix[0] == programs.unshare and programs.mount in prefix and "size=67108864" in prefix[-1]
        command = launch.task_command(fifo=tmp_fifo(), exit_file=Path("/x/exit"), cgroup="", env_file=Path("/x/env"),
                                      prefix=["/usr/bin/setpriv", "--"], argv=["id"])
        assert command[:2] == ["/bin/sh", "-c"] and command[-1] == "id"
        assert launch.root_env() == {"PATH": launch.ROOT_PATH, "LANG": "C.UTF-8"}

    @pytest.mark.skipif(os.geteuid() != 0 or not launch.Programs.find().namespaces_work(),
                        reason="needs root and namespaces")
    def test_a_stop_during_the_set_up_is_not_a_failed_set_up(self, tmp_path: Path) -> None:
        """A signal that reaches the group while the namespace's mounts are still being made (a stop right after
        the start, on a loaded machine) ends the step with the signal's status, not as "cannot set up" (125),
        so the task reads cancelled rather than failed. A mount that fails by itself is still 125."""
        started = tmp_path / "mounting"
        slow = tmp_path / "slow-mount"
        slow.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 30\n")
        slow.chmod(0o755)
        programs = launch.Programs(unshare=launch.root_program("unshare"), mount=str(slow))
        proc = subprocess.Popen([*launch.namespace_prefix(programs, 0), "/bin/true"], env=launch.root_env(),
                                start_new_session=True, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(started.exists, timeout_s=30, what="the mount step to start")
            os.killpg(proc.pid, 15)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
        assert proc.returncode == 128 + 15, (proc.returncode, err)
        assert "cannot set up" not in err
        failing = tmp_path / "failing-mount"
        failing.write_text("#!/bin/sh\nexit 32\n")
        failing.chmod(0o755)
        programs = launch.Programs(unshare=launch.root_program("unshare"), mount=str(failing))
        done = subprocess.run([*launch.namespace_prefix(programs, 0), "/bin/true"], env=launch.root_env(),
                              capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 125 and "cannot set up" in done.stderr

    def test_task_path_must_be_absolute(self) -> None:
        """The agent's --task-path is absolute directories only."""
        assert launch.path_problem("/opt/venv/bin:/usr/bin") is None
        assert launch.path_problem("bin:/usr/bin") is not None
        assert launch.path_problem("") is not None


def tmp_fifo() -> Path:
    return Path("/x/fifo")
