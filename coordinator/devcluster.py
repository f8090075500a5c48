"""``make run``: embedded etcd + one coordinator + one local agent, in the foreground.

Starts ``gptrm-coordinator`` (which starts its own embedded etcd) and ``gptrm-agent`` as
child processes with state under ``.gptrm/`` in the working directory, waits until the
local node is visible through the Admin API, prints the gptrmctl commands to try, and on
Ctrl-C (or SIGTERM) stops the agent, then the coordinator (which stops etcd), in that order, then
kills what the agent's tasks left running: an agent that stops leaves its tasks alive on purpose
(a restarted agent adopts them), which is right in production and surprising in a demo.

The coordinator runs with its production defaults (threshold 0.9 in whole-gpus mode: host CPU,
memory, disk and shared GPUs are capped, whole GPUs are not), so every GPU of the one local node
can be reserved. Without NVML the agent simulates a whole DGX-like host (8×H100, 112 cores,
2 TiB), so the printed example runs eight one-GPU tasks side by side.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from common.leftover_tasks import kill_leftover_tasks
from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc

LISTEN = os.environ.get("GPTRM_DEV_LISTEN", "127.0.0.1:7770")
METRICS = os.environ.get("GPTRM_DEV_METRICS", "127.0.0.1:9470")
COORDINATOR_ARGS = "GPTRM_DEV_COORDINATOR_ARGS"
"""Extra coordinator flags, shell-quoted (``make run ARGS="--price-kwh 0.2"`` sets it), appended after the
dev cluster's own so that they win."""


def _wait_for_node(deadline_s: float) -> str | None:
    stub = admin_pb2_grpc.AdminStub(grpc.insecure_channel(LISTEN))
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            nodes = stub.ListNodes(admin_pb2.ListNodesRequest(), timeout=1).nodes
            if nodes:
                return nodes[0].record.inventory.node_id
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    return None


def main() -> int:
    # SIGTERM stops the cluster the way Ctrl-C does (the finally below runs for both).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    state = Path(".gptrm").resolve()
    agent_state = state / "agent"
    bin_dir = Path(sys.executable).parent
    # Plaintext and no authentication on loopback: the coordinator logs a warning and
    # `gptrmctl status` says so; the printed gptrmctl commands pass --insecure to connect.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    coord = subprocess.Popen([str(bin_dir / "gptrm-coordinator"), "--listen", LISTEN, "--metrics-listen", METRICS,
                              "--state-dir", str(state / "coordinator"), "--etcd", "embedded",
                              "--coordinator-id", "dev-coordinator", "--insecure",
                              *shlex.split(os.environ.get(COORDINATOR_ARGS, ""))], env=env)
    agent = subprocess.Popen([str(bin_dir / "gptrm-agent"), "--coordinator", LISTEN, "--gpu-backend",
                              os.environ.get("GPTRM_GPU_BACKEND", "auto"), "--state-dir", str(agent_state),
                              "--data-paths", str(Path.cwd()), "--advertise-address", "127.0.0.1", "--insecure"],
                             env=env)
    procs = [agent, coord]
    try:
        node = _wait_for_node(30)
        if node is None:
            print("gptrm: the local node did not register within 30 s; see the logs above", file=sys.stderr)
            return 1
        ctl = f"{bin_dir / 'gptrmctl'} --insecure"
        print(f"""
gptrm is up in {time.monotonic() - started:.1f} s: node {node!r} registered with coordinator {LISTEN}.
Try, in another terminal:
  {ctl} status
  {ctl} nodes
  {ctl} nodes {node}
  {ctl} submit --name hello --gpus 1 --gpu-mem-gib 10 -- sh -c 'echo hello from $CUDA_VISIBLE_DEVICES; sleep 60'
  {ctl} tasks
  {ctl} top
  {ctl} events --follow
  curl -s http://{METRICS}/metrics | grep ^gptrm_cluster
Ctrl-C stops everything.
""", flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
        killed = kill_leftover_tasks(str(agent_state) + os.sep)
        if killed:
            print(f"gptrm: stopped {killed} task process(es) left by the dev cluster's agents", flush=True)


if __name__ == "__main__":
    sys.exit(main())
