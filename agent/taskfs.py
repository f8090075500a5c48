"""Where a task's files live on its host, and how the agent touches them without following a link.

A task is code the agent did not write and runs with its own uid; the agent runs as root. So what
the agent writes or reads for a task sits where the task cannot write, and what the task owns is
never opened by path through anything the task could have replaced::

    <state_dir>/                0711 root  (tasks.json 0600)
      tasks/                    0700 root  the agent's own: nothing under it is the task's
        <id>/                   0700 root
          output.fifo           the task's stdout and stderr, drained by the agent (agent.logpump)
          output.log            what the task printed, written by the agent only
          output.log.1          the rotated copy
          exit_code             written by the task's root wrapper when the task ends
          environment           systemd-run's EnvironmentFile, removed once the unit has started
      work/                     0711 root
        <id>/                   0700 the task's uid: its working directory and, for a uid of its
                                own, its HOME; removed when the task ends

The work directory is created fresh for every start: a restarted task, or a later task given the
same uid, never finds what an earlier one left. When a task with a uid of its own ends, what that
uid left in the shared temporary directories (``/tmp``, ``/var/tmp``, ``/dev/shm``) is removed too,
before the uid can be handed out again. Every removal walks directories by file descriptor and
never follows a link (``shutil.rmtree`` on Linux).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from agent.task_user import TaskUser
from common.errors import GptrmError

__all__ = ["SHARED_TMP_DIRS", "TaskPaths", "open_nofollow", "prepare", "remove_work", "scrub_uid", "secure_state_dir"]

SHARED_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


@dataclass(frozen=True, slots=True)
class TaskPaths:
    """The files of one task (see the module docstring)."""

    agent_dir: Path
    work_dir: Path

    @classmethod
    def of(cls, state_dir: Path, task_id: str) -> TaskPaths:
        return cls(Path(state_dir) / "tasks" / task_id, Path(state_dir) / "work" / task_id)

    @property
    def log(self) -> Path:
        return self.agent_dir / "output.log"

    @property
    def fifo(self) -> Path:
        return self.agent_dir / "output.fifo"

    @property
    def exit_file(self) -> Path:
        return self.agent_dir / "exit_code"

    @property
    def env_file(self) -> Path:
        return self.agent_dir / "environment"


def secure_state_dir(state_dir: Path) -> None:
    """Create the state directory and its two task roots with the modes above (fixing looser ones)."""
    for path, mode in ((state_dir, 0o711), (state_dir / "tasks", 0o700), (state_dir / "work", 0o711)):
        path.mkdir(parents=True, exist_ok=True)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise GptrmError(f"{path} is not a directory")
        if stat.S_IMODE(st.st_mode) != mode:
            os.chmod(path, mode)


def _fresh_dir(path: Path, mode: int) -> None:
    """``path`` as a new, empty directory (whatever was there removed without following links)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    os.mkdir(path, mode)
    os.chmod(path, mode)   # the umask may have taken bits away


def prepare(state_dir: Path, task_id: str, user: TaskUser | None) -> TaskPaths:
    """Create a task's two directories and its output FIFO, each new.

    The work directory belongs to the task's user (0700) when the agent switches users; the
    agent's directory is root's and is never handed over.
    """
    paths = TaskPaths.of(state_dir, task_id)
    if paths.agent_dir.exists():
        # A restart of the same task on this node: keep its log (it continues), renew the rest.
        for name in ("output.fifo", "exit_code", "exit_code.tmp", "environment"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(paths.agent_dir / name)
        st = os.lstat(paths.agent_dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            _fresh_dir(paths.agent_dir, 0o700)
        os.chmod(paths.agent_dir, 0o700)
    else:
        os.mkdir(paths.agent_dir, 0o700)
    os.mkfifo(paths.fifo, 0o600)
    _fresh_dir(paths.work_dir, 0o700)
    if user is not None and user.switch:
        os.chown(paths.work_dir, user.uid, user.gid, follow_symlinks=False)
    return paths


def open_nofollow(path: Path, flags: int, mode: int = 0o600, *, kind: int = stat.S_IFREG) -> int:
    """``os.open`` that refuses a link in the last component and anything but a ``kind`` file.

    :raises OSError: ELOOP for a link, EINVAL for another kind of file.
    """
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    try:
        if stat.S_IFMT(os.fstat(fd).st_mode) != kind:
            raise OSError(22, f"{path} is not a {'FIFO' if kind == stat.S_IFIFO else 'regular file'}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_work(state_dir: Path, task_id: str) -> None:
    """Remove a task's work directory (never following a link the task left in it)."""
    path = TaskPaths.of(state_dir, task_id).work_dir
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)


def scrub_uid(uid: int, dirs: tuple[str, ...] = SHARED_TMP_DIRS) -> list[str]:
    """Remove what ``uid`` owns at the top of the shared temporary directories; returns what went.

    Called once no process runs as ``uid``, so nothing is being added meanwhile.
    """
    removed = []
    for top in dirs:
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
                if st.st_uid != uid:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(entry.path)
            except OSError:
                continue
    return removed
