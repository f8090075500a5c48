"""The host's GPU driver inside a container, from a CDI spec (Container Device Interface, ``docs/containers.md``).

``nvidia-ctk cdi generate --format=json --output=/etc/cdi/nvidia.json`` (NVIDIA Container Toolkit) writes what a
container needs to use the host's driver: its libraries and binaries to bind in, the device nodes, variables, and
hooks (``update-ldcache``, ``create-symlinks``). The agent reads the JSON specs of the ``nvidia.com/gpu`` kind in its
``--cdi-spec-dirs`` and applies, to a task's container, the spec's common edits and the edits of the task's own GPUs
only (a device named by its index or its UUID; never ``all``, which would hand it every GPU of the node).

The spec is the admin's (root's directories); what it names is applied as written, except that a device node is
only added for the task's own GPUs and the control nodes, as :func:`agent.images.bundle.device_nodes` does.
YAML specs (the toolkit's default format) are skipped with a log line: the agent imports no YAML parser.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from common.logging import get_logger

__all__ = ["GPU_KIND", "apply_cdi", "load_specs"]

GPU_KIND = "nvidia.com/gpu"
_MAX_SPEC_BYTES = 4 << 20
_HOOK_STAGES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")


def load_specs(dirs: Iterable[str]) -> list[dict[str, Any]]:
    """The ``nvidia.com/gpu`` CDI specs (JSON) found in ``dirs``, in file-name order; unreadable ones are logged."""
    log = get_logger("agent").bind(component="cdi")
    specs: list[dict[str, Any]] = []
    for d in dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            path = Path(d) / name
            if name.endswith((".yaml", ".yml")):
                log.warning("cdi_spec_skipped", path=str(path), reason="YAML: generate it with --format=json")
                continue
            if not name.endswith(".json"):
                continue
            try:
                if path.stat().st_size > _MAX_SPEC_BYTES:
                    raise ValueError(f"larger than {_MAX_SPEC_BYTES} bytes")
                spec = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                log.warning("cdi_spec_skipped", path=str(path), reason=str(e))
                continue
            if isinstance(spec, dict) and spec.get("kind") == GPU_KIND:
                specs.append(spec)
    return specs


def _own_devices(spec: Mapping[str, Any], indices: Sequence[int], uuids: Sequence[str]) -> list[Mapping[str, Any]]:
    wanted = {str(i) for i in indices} | {u for u in uuids if u}
    return [d for d in spec.get("devices", []) or [] if isinstance(d, dict) and d.get("name") in wanted]


def _edits(spec: Mapping[str, Any], indices: Sequence[int], uuids: Sequence[str]) -> list[Mapping[str, Any]]:
    edits = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in _own_devices(spec, indices, uuids)]
    return [e for e in edits if isinstance(e, dict)]


def _device(node: Mapping[str, Any]) -> dict[str, Any] | None:
    path = str(node.get("path", ""))
    host = str(node.get("hostPath") or path)
    if not path.startswith("/dev/"):
        return None
    try:
        st = os.stat(host)
    except OSError:
        return None
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        return None
    return {"path": path, "type": "c" if stat.S_ISCHR(st.st_mode) else "b", "major": os.major(st.st_rdev),
            "minor": os.minor(st.st_rdev), "fileMode": 0o666, "uid": 0, "gid": 0}


def apply_cdi(config: dict[str, Any], specs: Sequence[Mapping[str, Any]], gpu_indices: Sequence[int],
              gpu_uuids: Sequence[str], allowed_devices: Iterable[str]) -> None:
    """Add the specs' edits for a task's GPUs to its ``config.json`` (in place): bind mounts, device nodes among
    ``allowed_devices`` (the control nodes and its own GPUs' paths), variables the task did not set itself, hooks.
    A task without GPUs gets nothing."""
    if not gpu_indices:
        return
    allowed = set(allowed_devices)
    have_devices = {d["path"] for d in config["linux"]["devices"]}
    have_mounts = {m["destination"] for m in config["mounts"]}
    env_keys = {e.split("=", 1)[0] for e in config["process"]["env"]}
    hooks: dict[str, list[dict[str, Any]]] = config.setdefault("hooks", {})
    for spec in specs:
        for edit in _edits(spec, gpu_indices, gpu_uuids):
            for item in edit.get("env", []) or []:
                key = str(item).split("=", 1)[0]
                if "=" in str(item) and key not in env_keys:
                    config["process"]["env"].append(str(item))
                    env_keys.add(key)
            for node in edit.get("deviceNodes", []) or []:
                if isinstance(node, dict) and node.get("path") in allowed and node.get("path") not in have_devices:
                    device = _device(node)
                    if device is not None:
                        config["linux"]["devices"].append(device)
                        have_devices.add(device["path"])
            for m in edit.get("mounts", []) or []:
                if not isinstance(m, dict):
                    continue
                src, dst = str(m.get("hostPath", "")), str(m.get("containerPath", ""))
                if src.startswith("/") and dst.startswith("/") and dst not in have_mounts:
                    options = [str(o) for o in m.get("options", []) or ["ro", "nosuid", "nodev", "bind"]]
                    config["mounts"].append({"destination": dst, "type": "bind", "source": src,
                                             "options": [o for o in options if o != "bind"] + ["rbind"]})
                    have_mounts.add(dst)
            for hook in edit.get("hooks", []) or []:
                if not isinstance(hook, dict) or hook.get("hookName") not in _HOOK_STAGES:
                    continue
                program = str(hook.get("path", ""))
                if not program.startswith("/"):
                    continue
                entry: dict[str, Any] = {"path": program, "args": [str(a) for a in hook.get("args", []) or []]}
                if hook.get("env"):
                    entry["env"] = [str(e) for e in hook["env"]]
                hooks.setdefault(str(hook["hookName"]), []).append(entry)
    if not hooks:
        config.pop("hooks", None)
