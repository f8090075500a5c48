"""Ending every process of a task, including those that left its process group.

A task may call ``setsid``, double-fork or daemonise; signalling its process group alone misses
those. What reaches them depends on the runtime and on what the host allows:

- **own cgroup** (process runtime, where a cgroup v2 hierarchy is writable): the task's root
  wrapper moves itself into ``<agent's cgroup>/gptrm-<node>-<task id>`` before it starts the task,
  so every descendant is in it whatever it does; ending the task writes ``cgroup.kill`` (or, on
  kernels without it, kills the listed pids until the cgroup is empty).
- **own uid** (any runtime, agent as root, ``--task-uids`` on): every process running as the
  task's uid is the task's, so a ``kill -KILL -1`` run as that uid (which reaches exactly the
  processes that uid may signal) is repeated until none is left.
- **systemd-run**: the task is a unit of its own, and systemd kills what is left in its cgroup
  when the main process ends; the uid sweep above runs as well.
- otherwise (agent not root, no cgroup): the process group, and the descendants of the task's
  root process found when it is stopped.

A task that declares its host memory (``--mem-gib``, or a model's estimate) gets a memory limit of
:func:`memory_limit` of it: ``memory.max`` of its own cgroup (with ``memory.swap.max`` 0 where the host
swaps), or ``MemoryMax=`` of its systemd unit. Pages a task writes to a tmpfs (``/dev/shm``, ``/tmp`` on
tmpfs, POSIX shared memory) are charged to the cgroup that wrote them, so the limit caps what a task can
pin there too. The memory controller must be enabled in the agent's cgroup's ``cgroup.subtree_control``;
the agent tries to enable it. On a host whose memory controller is mounted as cgroup v1 (a hybrid
hierarchy), such a task's cgroup is made in the v1 memory hierarchy instead (``memory.limit_in_bytes``
and ``memory.memsw.limit_in_bytes``), where it tracks and ends the task's processes just as well. The
agent says in its log (``task_memory_unlimited``) when neither is possible.

Example::

    group = TaskCgroup.create(root, node_tag, "t-1", memory_max=memory_limit(8 << 30))   # None: no cgroup
    ... start the wrapper with group.path ...
    await end_task(cgroup=group, uid=60001)   # once its main process ended: nothing of it is left
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from agent.launch import root_env, root_program
from common.logging import get_logger

__all__ = ["MEMORY_HEADROOM_BYTES", "TaskCgroup", "cgroup_root", "descendants", "end_task", "memory_capable_root",
           "memory_cgroup_root", "memory_limit", "node_tag", "uid_processes", "uids_running"]

_ROUNDS = 50
_ROUND_S = 0.05
MEMORY_HEADROOM_BYTES = 256 << 20
"""Least headroom above a task's declared memory before its cgroup limit (a quarter more for larger tasks)."""


def memory_limit(declared_bytes: int) -> int | None:
    """The memory limit of a task that declared ``declared_bytes`` of host memory (None: it declared none).

    Its declaration plus a quarter, at least :data:`MEMORY_HEADROOM_BYTES` more: a task's estimate is
    rarely exact, and the page cache of the files it reads is charged to it too.
    """
    if declared_bytes <= 0:
        return None
    return declared_bytes + max(declared_bytes // 4, MEMORY_HEADROOM_BYTES)


def node_tag(state_dir: Path) -> str:
    """A short name for one agent's tasks' cgroups (two agents on one host never share one)."""
    return hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:8]


def cgroup_root(proc_root: Path = Path("/proc")) -> Path | None:
    """The directory of this process's own cgroup in a writable cgroup v2 hierarchy, or None."""
    try:
        mounts = (proc_root / "self" / "mountinfo").read_text().splitlines()
        own = next((line[3:] for line in (proc_root / "self" / "cgroup").read_text().splitlines()
                    if line.startswith("0::")), None)
    except OSError:
        return None
    if own is None:
        return None
    for line in mounts:
        fields = line.split(" - ")
        if len(fields) != 2 or not fields[1].startswith("cgroup2 "):
            continue
        mount_point = fields[0].split()[4]
        path = Path(mount_point) / own.lstrip("/")
        if os.access(path, os.W_OK) and (path / "cgroup.procs").exists():
            return path
    return None


def memory_cgroup_root(proc_root: Path = Path("/proc")) -> Path | None:
    """This process's own cgroup in a writable cgroup v1 memory hierarchy, or None (none mounted: cgroup v2)."""
    try:
        mounts = (proc_root / "self" / "mountinfo").read_text().splitlines()
        own = next((line.split(":", 2)[2] for line in (proc_root / "self" / "cgroup").read_text().splitlines()
                    if "memory" in line.split(":", 2)[1].split(",")), None)
    except (OSError, IndexError):
        return None
    if own is None:
        return None
    for line in mounts:
        fields = line.split(" - ")
        if len(fields) != 2 or not fields[1].startswith("cgroup ") or "memory" not in fields[1].split()[-1].split(","):
            continue
        path = Path(fields[0].split()[4]) / own.lstrip("/")
        if os.access(path, os.W_OK) and (path / "memory.limit_in_bytes").exists():
            return path
    return None


@dataclass(frozen=True, slots=True)
class TaskCgroup:
    """One task's cgroup v2 directory."""

    path: Path

    @classmethod
    def create(cls, root: Path | None, tag: str, task_id: str, *, memory_max: int | None = None,
               memory_root: Path | None = None) -> TaskCgroup | None:
        """Make (or reuse) the task's cgroup under ``root``, limited to ``memory_max`` bytes of memory when given
        (under ``memory_root``, a cgroup v1 memory hierarchy, where ``root`` has no memory controller); None when
        there is no root or it cannot be made."""
        if memory_max is not None:
            root = memory_capable_root(root, memory_root) or root
        if root is None:
            return None
        log = get_logger("agent").bind(component="runtime")
        path = root / f"gptrm-{tag}-{task_id}"
        try:
            path.mkdir(exist_ok=True)
        except OSError as e:
            log.warning("task_cgroup_unavailable", task_id=task_id, path=str(path), reason=str(e))
            return None
        group = cls(path)
        if memory_max is not None:
            problem = group.limit_memory(memory_max)
            if problem:
                log.warning("task_memory_unlimited", task_id=task_id, path=str(path), memory_max=memory_max,
                            reason=problem)
        return group

    def limit_memory(self, max_bytes: int) -> str | None:
        """Cap the cgroup's memory (and swap, where the host swaps: swapped-out tmpfs pages would escape the
        cap) at ``max_bytes``; returns why it could not, or None."""
        if (self.path / "memory.max").exists():
            writes = [("memory.max", str(max_bytes)), ("memory.swap.max", "0")]
        elif (self.path / "memory.limit_in_bytes").exists():   # cgroup v1: memory and swap together
            writes = [("memory.limit_in_bytes", str(max_bytes)), ("memory.memsw.limit_in_bytes", str(max_bytes))]
        else:
            return "the memory controller is not enabled for the task's cgroup"
        try:
            for i, (name, value) in enumerate(writes):
                if i == 0 or (self.path / name).exists():
                    (self.path / name).write_text(value)
        except OSError as e:
            return f"cannot write its memory limit ({e.strerror or e})"
        return None

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> None:
        """SIGKILL everything in the cgroup (one write where the kernel has ``cgroup.kill``)."""
        kill_file = self.path / "cgroup.kill"
        if kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
                return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> bool:
        """Remove the (empty) cgroup; False while something is still in it."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


def memory_capable_root(root: Path | None, memory_root: Path | None) -> Path | None:
    """Where a task's cgroup with a memory limit is made: ``root`` (cgroup v2) when its memory controller can be
    enabled for its children, else ``memory_root`` (a cgroup v1 memory hierarchy), else None."""
    if root is not None and _enable_memory(root):
        return root
    return memory_root


def _enable_memory(root: Path) -> bool:
    """Let the cgroups under ``root`` have memory limits; False where they cannot (no memory controller in this
    hierarchy, or ``root`` holds processes itself and is not the hierarchy's root)."""
    control = root / "cgroup.subtree_control"
    try:
        if "memory" not in control.read_text().split():
            control.write_text("+memory")
        return "memory" in control.read_text().split()
    except OSError:
        return False


def _by_uid(wanted: range) -> list[tuple[psutil.Process, set[int]]]:
    """Every process whose real or effective uid is in ``wanted``, with those uids."""
    found = []
    for p in psutil.process_iter(["uids"]):
        ids = p.info.get("uids")
        if ids is not None:
            mine = {u for u in (ids.real, ids.effective) if u in wanted}
            if mine:
                found.append((p, mine))
    return found


def uid_processes(uid: int) -> list[psutil.Process]:
    """Every process whose real or effective uid is ``uid``."""
    return [p for p, _ in _by_uid(range(uid, uid + 1))]


def uids_running(uids: range) -> set[int]:
    """The uids of ``uids`` that some process runs as (real or effective)."""
    return {u for _, mine in _by_uid(uids) for u in mine}


def _kill_as(uid: int) -> None:
    """``kill -KILL -1`` as ``uid``: every process of that uid but the killer itself, in one system call.

    Like every root step of a task's start (:mod:`agent.launch`), ``setpriv`` is named by its absolute path
    and runs with the fixed root environment: the killer runs as the task's uid, so a process of that uid
    could read its environment, which must hold nothing of the agent's."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([root_program("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                        "--", "/bin/sh", "-c", "kill -KILL -1"], env=root_env(), stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10, check=False)


def descendants(pid: int) -> list[psutil.Process]:
    """Every process below ``pid`` now (none when it is gone)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


async def end_task(*, cgroup: TaskCgroup | None, uid: int | None,
                   found_at_stop: list[psutil.Process] | None = None) -> bool:
    """SIGKILL what is left of a task once its main process has ended, until nothing is; True when
    nothing is left. The process group is not signalled: its number may name another group by then.

    :param cgroup: the task's own cgroup, if it has one.
    :param uid: the task's own uid (only a uid no other process may use), if it has one.
    :param found_at_stop: processes found under ``pid`` at stop (used when there is neither).
    """
    others = list(found_at_stop or [])
    for _ in range(_ROUNDS):
        left = False
        if cgroup is not None:
            cgroup.kill()
            left = left or bool(cgroup.pids())
        if uid is not None and uid_processes(uid):
            await asyncio.to_thread(_kill_as, uid)
            left = left or bool(uid_processes(uid))
        alive = []
        for p in others:
            with contextlib.suppress(psutil.Error):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    p.kill()
                    alive.append(p)
        others = alive
        left = left or bool(others)
        if not left:
            if cgroup is not None and not cgroup.remove():
                await asyncio.sleep(_ROUND_S)
                continue
            return True
        await asyncio.sleep(_ROUND_S)
    get_logger("agent").bind(component="runtime").error(
        "task_processes_left", uid=uid, cgroup=str(cgroup.path) if cgroup else "",
        reason=f"still running after {_ROUNDS} rounds of SIGKILL")
    return False
