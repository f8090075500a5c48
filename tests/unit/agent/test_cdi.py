"""CDI specs give a task's container the host's GPU driver for its own GPUs only (agent/images/cdi.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.images.bundle import device_paths, oci_config
from agent.images.cdi import apply_cdi, load_specs


def _spec() -> dict[str, Any]:
    return {
        "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void", "FROM_TASK=spec"],
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/dev/null"},
                            {"path": "/dev/sda", "hostPath": "/dev/null"}],
            "mounts": [{"hostPath": "/usr/lib/x86_64-linux-gnu", "containerPath": "/usr/lib/driver",
                        "options": ["ro", "nosuid", "nodev", "bind"]}],
            "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook", "args": ["x", "update"]},
                      {"hookName": "bogus", "path": "/bin/true"}],
        },
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}]}},
            {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1", "hostPath": "/dev/null"}]}},
            {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1", "hostPath": "/dev/null"}]}},
        ],
    }


def _config(gpus: list[int]) -> dict[str, Any]:
    return oci_config(image_config={}, rootfs="/r", argv=["x"], env={"FROM_TASK": "task"}, uid=1000, gid=1000,
                      workdir="", mounts=[], shm_bytes=0, gpu_indices=gpus, hostname="h", task_path_given=False)


def test_only_the_tasks_own_gpus_and_the_common_edits() -> None:
    """GPU 0's task gets its node and the control node (not GPU 1's, not 'all''s, not a disk), the driver mount,
    the spec's variables under its own, the createContainer hook; a task without GPUs gets nothing."""
    config = _config([0])
    apply_cdi(config, [_spec()], [0], ["GPU-aaa"], device_paths([0]))
    paths = {d["path"] for d in config["linux"]["devices"]}
    assert {"/dev/nvidia0", "/dev/nvidiactl"} <= paths and "/dev/nvidia1" not in paths and "/dev/sda" not in paths
    assert any(m["destination"] == "/usr/lib/driver" and "ro" in m["options"] and "rbind" in m["options"]
               for m in config["mounts"])
    assert "FROM_TASK=task" in config["process"]["env"] and "FROM_TASK=spec" not in config["process"]["env"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in config["process"]["env"]
    assert config["hooks"] == {"createContainer": [{"path": "/usr/bin/nvidia-cdi-hook", "args": ["x", "update"]}]}
    plain = _config([])
    apply_cdi(plain, [_spec()], [], [], device_paths([]))
    assert "hooks" not in plain and not any(m["destination"] == "/usr/lib/driver" for m in plain["mounts"])


def test_specs_are_read_from_json_files_of_the_gpu_kind(tmp_path: Path) -> None:
    (tmp_path / "nvidia.json").write_text(json.dumps(_spec()))
    (tmp_path / "nvidia.yaml").write_text("kind: nvidia.com/gpu\n")
    (tmp_path / "other.json").write_text(json.dumps({"kind": "vendor.com/fpga"}))
    (tmp_path / "broken.json").write_text("{")
    specs = load_specs([str(tmp_path), str(tmp_path / "missing")])
    assert [s["kind"] for s in specs] == ["nvidia.com/gpu"]
