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
uid left on the host is removed too, before the uid can be handed out again (:func:`scrub_uid`):

- its files in every world-writable directory: ``/tmp``, ``/var/tmp``, ``/dev/shm`` (POSIX shared
  memory and named semaphores), ``/run/lock``, ``/dev/mqueue`` (POSIX message queues, where that
  file system is mounted) and any other sticky world-writable directory at the top of ``/``,
  ``/run``, ``/var`` or ``/dev``. What the uid owns there goes, a directory of its own with
  everything in it; inside a world-writable directory the uid does not own (``/tmp/.X11-unix``),
  its own entries go, a few levels deep;
- its System V IPC objects (shared memory segments, semaphore sets, message queues) that it owns
  or created: another task given the uid later could otherwise attach them.

Every removal works on directory file descriptors and never follows a link (``shutil.rmtree``
with ``dir_fd``), so another task cannot redirect it by swapping a directory for a link.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agent.task_user import TaskUser
from common.errors import GptrmError

__all__ = [
    "SHARED_DIRS",
    "TaskPaths",
    "open_nofollow",
    "prepare",
    "remove_sysv_ipc",
    "remove_work",
    "scrub_uid",
    "secure_state_dir",
    "shared_dirs",
]

SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
"""World-writable directories scrubbed on every host (those that exist)."""
_SCAN_FOR_SHARED = ("/", "/run", "/var", "/dev")
"""Directories whose sticky world-writable subdirectories are scrubbed too."""
_NESTED_DEPTH = 3
"""How deep :func:`scrub_uid` looks into world-writable directories that are not the uid's own."""
_IPC_RMID = 0
_SYSV_IPC = ("shm", "sem", "msg")


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


def shared_dirs() -> list[str]:
    """The world-writable directories of this host a task may leave files in (see the module docstring)."""
    found = dict.fromkeys(SHARED_DIRS)
    for parent in _SCAN_FOR_SHARED:
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode) and mode & stat.S_ISVTX and mode & stat.S_IWOTH:
                    found[entry.path] = None
    return list(found)


def _scrub_dir(dir_fd: int, where: str, uid: int, depth: int, removed: list[str]) -> None:
    """Remove what ``uid`` owns in the directory open as ``dir_fd``; look into world-writable
    directories of other owners below it, ``depth`` levels more."""
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return
    for name in names:
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except OSError:
            continue
        path = os.path.join(where, name)
        is_dir = stat.S_ISDIR(st.st_mode)
        try:
            if st.st_uid == uid:
                if is_dir:
                    shutil.rmtree(name, dir_fd=dir_fd)
                else:
                    os.unlink(name, dir_fd=dir_fd)
                removed.append(path)
            elif is_dir and depth > 0 and st.st_mode & stat.S_IWOTH:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
                try:
                    if os.fstat(fd).st_ino == st.st_ino:   # still the directory just looked at
                        _scrub_dir(fd, path, uid, depth - 1, removed)
                finally:
                    os.close(fd)
        except OSError:
            continue


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _sysv_objects(kind: str, uid: int, proc: str) -> list[int]:
    """Ids of the System V IPC objects of ``kind`` (shm, sem, msg) that ``uid`` owns or created."""
    try:
        with open(os.path.join(proc, kind)) as fh:
            header, *rows = fh.read().splitlines()
    except OSError:
        return []
    cols = header.split()
    try:
        at_id, at_uid, at_cuid = cols.index({"shm": "shmid", "sem": "semid", "msg": "msqid"}[kind]), \
            cols.index("uid"), cols.index("cuid")
    except ValueError:
        return []
    ids = []
    for row in rows:
        fields = row.split()
        with contextlib.suppress(ValueError, IndexError):
            if uid in (int(fields[at_uid]), int(fields[at_cuid])):
                ids.append(int(fields[at_id]))
    return ids


def remove_sysv_ipc(uid: int, proc: str = "/proc/sysvipc") -> list[str]:
    """Remove every System V shared memory segment, semaphore set and message queue ``uid`` owns or
    created (a segment still attached goes when its last user detaches); returns what went, as
    ``shm:ID``."""
    found = {kind: _sysv_objects(kind, uid, proc) for kind in _SYSV_IPC}
    if not any(found.values()):
        return []
    libc = _libc()
    remove = {"shm": lambda i: libc.shmctl(i, _IPC_RMID, None), "sem": lambda i: libc.semctl(i, 0, _IPC_RMID),
              "msg": lambda i: libc.msgctl(i, _IPC_RMID, None)}
    removed = []
    for kind, ids in found.items():
        for ipc_id in ids:
            if remove[kind](ctypes.c_int(ipc_id)) == 0:
                removed.append(f"{kind}:{ipc_id}")
    return removed


def scrub_uid(uid: int, dirs: Iterable[str] | None = None) -> list[str]:
    """Remove what ``uid`` left on the host (see the module docstring); returns what went.

    Called once no process runs as ``uid``, so nothing is being added meanwhile.

    :param dirs: the world-writable directories to clean (default: :func:`shared_dirs`).
    """
    removed: list[str] = []
    for top in shared_dirs() if dirs is None else dirs:
        try:
            fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            _scrub_dir(fd, top, uid, _NESTED_DEPTH, removed)
        finally:
            os.close(fd)
    return removed + remove_sysv_ipc(uid)
