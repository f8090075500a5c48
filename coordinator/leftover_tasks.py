"""Finding and killing the task processes that stopped agents left running.

An agent that stops leaves its tasks alive on purpose (a restarted agent adopts them). Where
nothing will restart the agent (``make run``'s dev cluster, a test's cluster), what its tasks
left must be stopped by whoever started it. A process belongs to such a task when its working
directory or its command line lies under the agent's state directory: the tasks' work
directories and the task wrappers' FIFO paths are there.
"""

from __future__ import annotations

import contextlib
import os
import signal

__all__ = ["kill_leftover_tasks", "leftover_task_pids"]


def leftover_task_pids(prefix: str) -> list[int]:
    """Live processes (not this one) whose working directory or command line contains ``prefix``.

    :param prefix: a path prefix, e.g. an agent's state directory followed by ``/``, or
        ``root/agent-`` for every agent state directory ``root/agent-*``.
    """
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry.name}/cwd")
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:   # gone, a zombie, or not ours to read
            continue
        if cwd.startswith(prefix) or prefix in cmdline:
            pids.append(int(entry.name))
    return pids


def kill_leftover_tasks(prefix: str) -> int:
    """SIGKILL every process :func:`leftover_task_pids` finds for ``prefix``; returns how many were killed."""
    killed = 0
    for pid in leftover_task_pids(prefix):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed
