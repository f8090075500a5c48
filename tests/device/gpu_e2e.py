"""``make run`` on a real GPU host, end to end: a manual check, not part of ``make test``.

Run it as root on a GPU host from the repository root, with an interpreter whose ``bin/`` has the
``gptrm-*`` commands (an install of ``gptrm[coordinator,ctl]``) and where PyTorch imports::

    python tests/device/gpu_e2e.py --out DIR [--task-seconds 20] [--task-python PYTHON]

It starts the dev cluster (:mod:`coordinator.devcluster`: embedded etcd, a coordinator and an agent
whose GPU backend is ``auto``, so NVML on this host), then through ``gptrmctl``: the node as the
coordinator sees it, a one-GPU task running a PyTorch matrix-product loop (what ``CUDA_VISIBLE_DEVICES``
it got, which GPU it saw), the task and node while it runs (the GPU's telemetry and the task's
share of it), its logs, the events and the accounted usage, then stops the cluster (Ctrl-C, as a
user would). Everything goes to ``DIR/gpu_e2e.json``, the cluster's output to ``DIR/devcluster.log``
(its banner) and its coordinator's and agent's logs to ``DIR/coordinator.log`` and ``DIR/agent.log``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TASK = """
import os, sys, time, torch
print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"), "uid", os.getuid(), flush=True)
print("devices", torch.cuda.device_count(), torch.cuda.get_device_name(0), flush=True)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end, steps = time.time() + float(sys.argv[1]), 0
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    steps += 20
print("matmuls", steps, flush=True)
"""


def ctl(*args: str, timeout_s: float = 30.0) -> Any:
    """``gptrmctl --insecure -o json ARGS``'s document (or the error text)."""
    done = subprocess.run([str(BIN / "gptrmctl"), "--insecure", "-o", "json", *args], capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-2000:], "rc": done.returncode}
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"text": done.stdout[-4000:]}


def wait(what: str, fn: Any, timeout_s: float) -> Any:
    """``fn()`` once it is truthy, polled every half second; raises on timeout."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = fn()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")


def main() -> None:
    """Run the check, write the JSON, print a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--task-seconds", type=float, default=20.0)
    parser.add_argument("--task-python", default=sys.executable, help="the interpreter the task runs (PyTorch's)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    log = (args.out / "devcluster.log").open("w")
    cluster = subprocess.Popen([sys.executable, "-m", "coordinator.devcluster"], cwd=REPO, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    try:
        nodes = wait("the node", lambda: (n := ctl("nodes")).get("nodes") and n, 90)
        report["up_s"] = round(time.monotonic() - started, 1)
        node_id = nodes["nodes"][0]["node_id"]
        report["node"] = ctl("nodes", node_id)
        sub = ctl("submit", "--name", "gpu-e2e", "--gpus", "1", "--gpu-mem-gib", "4", "--cpu", "1", "--mem-gib", "8",
                  "--", args.task_python, "-c", TASK, str(args.task_seconds))
        report["submit"] = sub
        task_id = sub["task_id"]
        report["running"] = wait("the task running", lambda: (t := ctl("tasks", task_id)).get("state") in
                                 ("running", "succeeded", "failed") and t, 120)
        time.sleep(min(8.0, args.task_seconds / 2))
        report["task_while_running"] = ctl("tasks", task_id)
        report["node_while_running"] = ctl("nodes", node_id)
        report["tasks_wide"] = subprocess.run([str(BIN / "gptrmctl"), "--insecure", "tasks", "-o", "wide"],
                                              capture_output=True, text=True, timeout=30).stdout[-3000:]
        report["ended"] = wait("the task ended", lambda: (t := ctl("tasks", task_id)).get("state") in
                               ("succeeded", "failed", "cancelled") and t, args.task_seconds + 120)
        logs = subprocess.run([str(BIN / "gptrmctl"), "--insecure", "logs", task_id], capture_output=True, text=True,
                              timeout=30)
        report["logs"] = (logs.stdout + logs.stderr)[-4000:]
        report["events"] = ctl("events", "--backlog", "60")
        report["usage"] = ctl("usage", "--since", "1h")
    except Exception as e:   # record what was reached
        report["failed"] = f"{type(e).__name__}: {e}"
    finally:
        os.killpg(cluster.pid, signal.SIGINT)   # Ctrl-C, as make run's user does
        try:
            report["cluster_exit"] = cluster.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            report["cluster_exit"] = "killed after 60 s"
        log.close()
        for name in ("coordinator", "agent"):   # the dev cluster logs its parts to its state directory
            with contextlib.suppress(OSError):
                shutil.copyfile(REPO / ".gptrm" / "logs" / f"{name}.log", args.out / f"{name}.log")
    (args.out / "gpu_e2e.json").write_text(json.dumps(report, indent=1, default=str))
    for key in ("up_s", "failed", "submit", "logs", "cluster_exit"):
        if key in report:
            print(f"== {key}\n{json.dumps(report[key], indent=1, default=str)[:3000]}", flush=True)


if __name__ == "__main__":
    main()
