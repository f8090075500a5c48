"""Tasks as transient systemd services (``runtime = "systemd-run"``).

A task started this way is a unit of its own, ``gptrm-task-<id>.service``, started by PID 1:

- it is outside the agent's cgroup and the agent unit's sandbox (``ProtectSystem=``,
  ``PrivateTmp=``, its device list): the agent's hardening does not confine the task, and
  stopping or restarting the agent does not stop it;
- ``DevicePolicy=closed`` with ``DeviceAllow=`` for the NVIDIA control nodes and the task's own
  ``/dev/nvidiaN`` only, so a task cannot open another task's GPU even by device path;
- the unit's main process is the same root wrapper as the process runtime's
  (:mod:`agent.runtime`): it drops to the task's user with ``setpriv`` (a uid of the task's
  own by default), writes the task's output to its FIFO and records its exit code in the agent's
  own directory, so the agent needs no D-Bus and PID 1 opens no file a task could have replaced;
  ``NoNewPrivileges=yes``;
- ``AllowedCPUs=`` (and ``NUMAPolicy=bind``, ``NUMAMask=``) from the task's GPUs' CPU affinity
  and NUMA nodes (:mod:`agent.cpu_binding`);
- the unit's own environment is the fixed one of every root step (:func:`agent.launch.root_env`);
  the task's environment reaches the task's own process only, after the drop to its user, from a
  0600 file in the agent's own directory that the wrapper opens and removes
  (:mod:`agent.launch`), so secrets in a task's env never appear in any process's command line.

The agent is not the task's parent: it learns the unit's main pid from ``systemctl show`` and
watches it like a task it adopted after a restart. The main process is a session leader (PID 1
starts services with ``setsid``), so stopping and pausing signal its process group as usual;
whatever is left in the unit's cgroup when the main process ends is killed by systemd.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from agent.cpu_binding import CpuBinding, systemd_properties
from agent.launch import root_env
from agent.taskfs import TaskPaths
from common.errors import GptrmError

__all__ = ["NVIDIA_CONTROL_NODES", "choose_runtime", "start_service", "systemd_running",
           "unit_argv", "unit_name"]

NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
_UNIT_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")
_START_TIMEOUT_S = 30.0


def systemd_running() -> bool:
    """Whether this host can start transient services: systemd is PID 1 and systemd-run is installed."""
    return Path("/run/systemd/system").exists() and shutil.which("systemd-run") is not None


def choose_runtime(configured: str, *, euid: int) -> str:
    """``auto`` → ``systemd-run`` for a root agent on a systemd host (the only case where PID 1
    starts units for it without a polkit prompt), else ``process``; explicit choices stay."""
    if configured != "auto":
        return configured
    return "systemd-run" if euid == 0 and systemd_running() else "process"


def unit_name(task_id: str) -> str:
    """``gptrm-task-<id>.service``; an id systemd would escape or refuse is refused here."""
    if not _UNIT_ID.match(task_id):
        raise GptrmError(f"task id {task_id!r} cannot name a systemd unit (letters, digits, '_.:-' only)")
    return f"gptrm-task-{task_id}.service"


def unit_argv(task_id: str, *, gpu_indices: Sequence[int], workdir: Path,
              binding: CpuBinding | None = None, memory_max: int | None = None) -> list[str]:
    """The ``systemd-run`` prefix that starts one task as a transient service (bound to ``binding``'s CPUs,
    its memory and swap capped at ``memory_max`` bytes when given: :func:`agent.taskkill.memory_limit`)."""
    devices = [*NVIDIA_CONTROL_NODES, *(f"/dev/nvidia{int(i)}" for i in gpu_indices)]
    memory = [f"--property=MemoryMax={int(memory_max)}", "--property=MemorySwapMax=0"] if memory_max else []
    return ["systemd-run", "--quiet", "--collect", "--service-type=exec", f"--unit={unit_name(task_id)}",
            f"--description=gptrm task {task_id}", f"--working-directory={workdir}",
            *(f"--setenv={k}={v}" for k, v in root_env().items()), "--property=StandardInput=null",
            "--property=NoNewPrivileges=yes", "--property=DevicePolicy=closed",
            *(f"--property=DeviceAllow={d} rw" for d in devices), *memory, *systemd_properties(binding)]


async def _run(argv: Sequence[str]) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=_START_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise GptrmError(f"{argv[0]} did not answer within {_START_TIMEOUT_S:.0f}s") from None
    if proc.returncode != 0:
        raise GptrmError(f"{argv[0]} exited with {proc.returncode}: {err.decode(errors='replace').strip()[-500:]}")
    return out.decode(errors="replace")


async def start_service(task_id: str, command: Sequence[str], *, gpu_indices: Sequence[int], paths: TaskPaths,
                        binding: CpuBinding | None = None, memory_max: int | None = None) -> int:
    """Start the task's unit and return its main pid (0 when it already ended).

    :raises GptrmError: systemd refused the unit (the message carries systemd-run's own words).
    """
    await _run([*unit_argv(task_id, gpu_indices=gpu_indices, workdir=paths.work_dir, binding=binding,
                           memory_max=memory_max), *command])
    shown = await _run(["systemctl", "show", "--property=MainPID", "--value", unit_name(task_id)])
    try:
        return max(0, int(shown.strip() or 0))
    except ValueError:
        raise GptrmError(f"systemctl show {unit_name(task_id)}: unexpected MainPID {shown.strip()[:80]!r}") from None
