"""The OCI runtime configuration (``config.json``) of one task's container, for ``crun run``.

What the container gets (``docs/containers.md``):

- its root: the task's own writable overlay over the image's shared read-only tree (:mod:`agent.images.store`),
  mounted by the task's root step in a mount namespace of the task's own (what the task writes where the image
  lets its uid, ``/tmp`` say, lands there and is removed with it);
- its process: the task's argv (the image's entrypoint is not used: the task names the whole command), as the
  task's uid and gid with no other groups, no capabilities at all, ``noNewPrivileges``; its environment is the
  image's with the task's on top (``PATH`` the image's unless the task sets one); its working directory the spec's
  ``workdir``, else the image's, else ``/``;
- its own PID, mount, IPC and UTS namespaces; the host's network (NCCL and the task's rendezvous ports need it);
- ``/proc``, ``/sys`` (read-only), a minimal ``/dev`` with the NVIDIA control nodes and only the task's own
  ``/dev/nvidiaN`` (where they exist), a ``/dev/shm`` tmpfs of its size, and the spec's mounts
  (``nosuid,nodev``; read-only where asked);
- no cgroup of its own: ``crun --cgroup-manager=disabled`` leaves it in the task's cgroup, which the root wrapper
  joined, so the task's memory limit, accounting and end-of-task kill cover every process of the container; its
  CPU and NUMA binding is inherited from the wrapper's ``taskset``/``numactl`` prefix.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from typing import Any

from agent.systemd_task import NVIDIA_CONTROL_NODES
from common.oci import Mount

__all__ = ["device_nodes", "device_paths", "oci_config", "write_config"]

_MASKED = ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
           "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"]
_READONLY = ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


def device_paths(gpu_indices: Sequence[int]) -> list[str]:
    """The device nodes a task's container may have: the NVIDIA control nodes and its own GPUs'."""
    return [*NVIDIA_CONTROL_NODES, *(f"/dev/nvidia{int(i)}" for i in gpu_indices)]


def device_nodes(gpu_indices: Sequence[int], dev: str = "/dev") -> list[dict[str, Any]]:
    """The OCI ``linux.devices`` entries of :func:`device_paths` that exist here."""
    out = []
    for path in device_paths(gpu_indices):
        try:
            st = os.stat(os.path.join(dev, os.path.relpath(path, "/dev")))
        except OSError:
            continue
        if not stat.S_ISCHR(st.st_mode):
            continue
        out.append({"path": path, "type": "c", "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev),
                    "fileMode": 0o666, "uid": 0, "gid": 0})
    return out


def _image_env(image_config: Mapping[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in image_config.get("process", {}).get("env", []) or []:
        key, sep, value = str(item).partition("=")
        if sep and key:
            env[key] = value
    return env


def oci_config(*, image_config: Mapping[str, Any], rootfs: str, argv: Sequence[str], env: Mapping[str, str],
               uid: int, gid: int, workdir: str, mounts: Sequence[Mount], shm_bytes: int,
               gpu_indices: Sequence[int], hostname: str, task_path_given: bool) -> dict[str, Any]:
    """The whole ``config.json`` (see the module docstring).

    :param image_config: the runtime config ``umoci unpack`` derived from the image (its env and working directory).
    :param env: the task's environment (gptrm's variables and the spec's).
    :param task_path_given: the spec set ``PATH`` itself (else the image's ``PATH`` wins over the host default).
    """
    image_env = _image_env(image_config)
    merged = {**image_env, **env}
    if not task_path_given and "PATH" in image_env:
        merged["PATH"] = image_env["PATH"]
    cwd = workdir or str(image_config.get("process", {}).get("cwd") or "/")
    shm = "nosuid,noexec,nodev,mode=1777" + (f",size={int(shm_bytes)}" if shm_bytes > 0 else "")
    fs_mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": shm.split(",")},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    for m in mounts:
        fs_mounts.append({"destination": m.destination, "type": "bind", "source": m.source,
                          "options": ["rbind", "nosuid", "nodev", "ro" if m.read_only else "rw"]})
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": int(uid), "gid": int(gid), "additionalGids": []},
            "args": list(argv),
            "env": [f"{k}={v}" for k, v in merged.items()],
            "cwd": cwd,
            "capabilities": {"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []},
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": False},
        "hostname": hostname,
        "mounts": fs_mounts,
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}],
            "devices": device_nodes(gpu_indices),
            "maskedPaths": _MASKED,
            "readonlyPaths": _READONLY,
            "rootfsPropagation": "private",
        },
    }


def write_config(path: str, config: Mapping[str, Any]) -> None:
    """Write ``config.json`` as a new 0600 file of root's (it holds the task's environment), never through a link."""
    data = json.dumps(config).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
