"""``make run``: embedded etcd + one coordinator + one local agent, in the foreground.

``python -m coordinator.devcluster [--state-dir DIR] [--listen HOST:PORT] ...`` (``--help`` lists the
options; docs/devcluster.md describes the dev cluster). It:

1. takes an exclusive lock on its state directory (``.gptrm/`` in the working directory by default),
   before it starts anything: a second dev cluster on the same state is refused at once, with a message
   naming the first (its pid and addresses), and touches nothing of the first's;
2. checks that its coordinator and metrics addresses are free (another cluster may listen there);
3. starts ``gptrm-coordinator`` (which starts its own embedded etcd), waits until it answers, then
   ``gptrm-agent``, and waits until the local node is visible through the Admin API. Their logs go to
   ``STATE/logs/coordinator.log`` and ``STATE/logs/agent.log``, so the terminal shows the banner (the
   gptrmctl commands to try) last, not buried under JSON log lines;
4. on Ctrl-C or SIGTERM (``make`` sends both, one after the other) stops the agent, then the coordinator
   (which stops etcd), in that order, then kills what the agent's tasks left running (an agent that stops
   leaves its tasks alive on purpose: a restarted agent adopts them, which is right in production and
   surprising in a demo), and exits 0.

Every exit path (a child that fails to start or dies, the node not registering, Ctrl-C) stops the agent,
the coordinator and etcd, and sweeps what runs under this state directory only. The coordinator and the
agent run in their own sessions (a Ctrl-C on the terminal reaches this process alone, which stops them
in order), are sent SIGTERM by the kernel should this process die without cleaning up (SIGKILL), and
hold the state directory's lock with it, so the lock is free only once all of them are gone.

The coordinator runs with its production defaults (threshold 0.9 in whole-gpus mode: host CPU,
memory, disk and shared GPUs are capped, whole GPUs are not), so every GPU of the one local node
can be reserved. Without NVML the agent simulates a whole DGX-like host (8×H100, 112 cores,
2 TiB), so the printed example runs eight one-GPU tasks side by side; the simulated GPUs' utilization
follows each task's own load (docs/devcluster.md).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

import grpc

from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc
from coordinator.leftover_tasks import kill_leftover_tasks

__all__ = ["COORDINATOR_ARGS", "EXIT_FAILED", "LOCK_FILE", "main"]

LOCK_FILE = "devcluster.lock"
"""In the state directory: locked (flock) while a dev cluster uses it; holds its pid and addresses."""
EXIT_FAILED = 1
"""The cluster could not start or a part of it died; or another dev cluster holds the state directory."""
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 15.0
_LOG_TAIL_LINES = 20
COORDINATOR_ARGS = "GPTRM_DEV_COORDINATOR_ARGS"
"""Extra coordinator flags, shell-quoted (``make run ARGS="--price-kwh 0.2"`` sets it), appended after the
dev cluster's own so that they win."""


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="python -m coordinator.devcluster",
        description="gptrm's dev cluster (make run): embedded etcd, one coordinator and one local agent in the "
                    "foreground, simulated GPUs unless NVML works. Ctrl-C stops everything, tasks included.",
        epilog="One dev cluster per state directory: a second one on the same state is refused. Logs: "
               "STATE/logs/{coordinator,agent}.log. See docs/devcluster.md.")
    p.add_argument("--state-dir", default=".gptrm", metavar="DIR",
                   help="state of etcd, the coordinator and the agent, their logs and the lock (default: .gptrm)")
    p.add_argument("--listen", default=env.get("GPTRM_DEV_LISTEN", "127.0.0.1:7770"), metavar="HOST:PORT",
                   help="the coordinator's gRPC address (env GPTRM_DEV_LISTEN; default 127.0.0.1:7770)")
    p.add_argument("--metrics-listen", default=env.get("GPTRM_DEV_METRICS", "127.0.0.1:9470"), metavar="HOST:PORT",
                   help="the coordinator's Prometheus address (env GPTRM_DEV_METRICS; default 127.0.0.1:9470)")
    p.add_argument("--web-listen", default=env.get("GPTRM_DEV_WEB", "127.0.0.1:7780"), metavar="HOST:PORT",
                   help="the coordinator's web console (env GPTRM_DEV_WEB; default 127.0.0.1:7780; '' none)")
    p.add_argument("--gpu-backend", default=env.get("GPTRM_GPU_BACKEND", "auto"),
                   choices=("auto", "nvml", "simulated"),
                   help="the agent's GPUs (env GPTRM_GPU_BACKEND; default auto: NVML when it works, else simulated)")
    return p


@dataclass(frozen=True)
class _Holder:
    """What the lock file says about the dev cluster that holds it."""

    pid: int
    listen: str
    metrics_listen: str

    def describe(self) -> str:
        if self.pid <= 0:   # locked, its details not written yet (it is starting) or unreadable
            return f"details in {LOCK_FILE} not readable yet"
        alive = _alive(self.pid)
        who = f"pid {self.pid}" + ("" if alive else ", which has exited; its coordinator or agent is still stopping")
        return f"{who}; coordinator {self.listen}, metrics http://{self.metrics_listen}/metrics"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StateLock:
    """An exclusive, non-blocking flock on ``STATE/devcluster.lock``, with the holder's pid and addresses in it.

    The lock belongs to the open file: the children given its descriptor (``fd``) hold it too, so it is
    released only when the last of them has exited.
    """

    def __init__(self, state: Path) -> None:
        self.path = state / LOCK_FILE
        self.fd = -1

    def acquire(self, listen: str, metrics_listen: str) -> _Holder | None:
        """Take the lock and write this process's details; returns None, or, when another holds it, the other.

        :raises OSError: the state directory or the lock file cannot be created.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            return holder or _Holder(0, "unknown", "unknown")
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps({"pid": os.getpid(), "listen": listen, "metrics_listen": metrics_listen,
                                  "started_unix_s": round(time.time(), 3)}) + "\n").encode())
        self.fd = fd
        return None

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)   # the children holding it have exited by now
            self.fd = -1


def _read_holder(fd: int) -> _Holder | None:
    try:
        doc = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return _Holder(int(doc["pid"]), str(doc["listen"]), str(doc["metrics_listen"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _address_in_use(address: str) -> bool:
    """True when ``HOST:PORT`` cannot be bound now (something listens there)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the coordinator binds: TIME_WAIT is free
            s.bind((host.strip("[]"), int(port)))
    except OSError:
        return True
    except ValueError:
        return False   # not HOST:PORT: the coordinator reports it
    return False


def _with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM when this process dies (even by SIGKILL) and stops in order: through
    ``setpriv --pdeathsig`` (util-linux), which sets the death signal and execs it. No Python code runs in the
    child between fork and exec: this process holds gRPC channels, and gRPC's fork handlers restart its poller in
    a forked child, which the closing of the child's descriptors then aborts."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else list(argv)


class _Stop:
    """SIGINT and SIGTERM set it; nothing is raised, so a second signal (make sends SIGTERM right after the
    terminal's SIGINT) cannot interrupt the shutdown."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = signum

    def __bool__(self) -> bool:
        return self.signal is not None


class DevCluster:
    """The children of one dev cluster and how they are started, awaited and stopped."""

    def __init__(self, args: argparse.Namespace, state: Path, lock: StateLock, stop: _Stop) -> None:
        self.args, self.state, self.lock, self.stop = args, state, lock, stop
        self.logs = state / "logs"
        self.bin = Path(sys.executable).parent
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._log_files: list[IO[bytes]] = []
        self._waited_for = ""

    @property
    def agent_state(self) -> Path:
        return self.state / "agent"

    def spawn(self, name: str, argv: Sequence[str]) -> None:
        """Start ``name`` with its output appended to ``STATE/logs/NAME.log``."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"{name}.log").open("ab")
        log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} dev cluster pid {os.getpid()} starts {name}\n".encode())
        log.flush()
        self._log_files.append(log)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.procs[name] = subprocess.Popen(
            _with_parent(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True, pass_fds=(self.lock.fd,))

    def died(self) -> str | None:
        """The name of a child that has exited, if one has."""
        return next((name for name, p in self.procs.items() if p.poll() is not None), None)

    def wait_for(self, what: str, probe: Callable[[], str | None]) -> str | None:
        """Poll ``probe`` until it answers, a child dies, a signal arrives or the start timeout passes.

        :returns: the answer, or None (then :meth:`failure` says why, unless a signal stopped the wait).
        """
        end = time.monotonic() + _START_TIMEOUT_S
        while not self.stop and self.died() is None and time.monotonic() < end:
            answer = probe()
            if answer is not None:
                return answer
            time.sleep(0.2)
        self._waited_for = what
        return None

    def failure(self) -> str:
        """Why the last :meth:`wait_for` gave up, with the log tail of the child concerned."""
        dead = self.died()
        if dead is not None:
            code = self.procs[dead].returncode
            return f"gptrm: the {dead} exited with code {code} while starting\n{self._tail(dead)}"
        name = "agent" if "agent" in self.procs else "coordinator"
        return (f"gptrm: {self._waited_for} did not happen within {_START_TIMEOUT_S:.0f} s\n{self._tail(name)}")

    def _tail(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        try:
            lines = path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
        except OSError:
            return ""
        return f"--- the last lines of {path}:\n" + "\n".join(lines)

    def shutdown(self) -> None:
        """Stop the agent, then the coordinator (which stops etcd); then kill what is left under this state."""
        for name in ("agent", "coordinator"):
            p = self.procs.get(name)
            if p is None:
                continue
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        # An etcd whose coordinator was killed, and the agent's tasks; only under this state directory,
        # which no other dev cluster uses while this one holds its lock.
        kill_leftover_tasks(str(self.state / "coordinator") + os.sep)
        killed = kill_leftover_tasks(str(self.agent_state) + os.sep)
        if killed:
            print(f"gptrm: stopped {killed} task process(es) left by the dev cluster's agents", flush=True)
        for log in self._log_files:
            log.close()


def _first_node(channel: grpc.Channel) -> Callable[[], str | None]:
    stub = admin_pb2_grpc.AdminStub(channel)

    def probe() -> str | None:
        try:
            nodes = stub.ListNodes(admin_pb2.ListNodesRequest(), timeout=1).nodes
        except grpc.RpcError:
            return None
        return nodes[0].record.inventory.node_id if nodes else None
    return probe


def _answers(channel: grpc.Channel) -> Callable[[], str | None]:
    stub = admin_pb2_grpc.AdminStub(channel)

    def probe() -> str | None:
        try:
            return stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=1).coordinator_id or "?"
        except grpc.RpcError:
            return None
    return probe


def _banner(dc: DevCluster, node: str, started: float) -> str:
    ctl = f"{dc.bin / 'gptrmctl'} --insecure" + (f" --coordinator {dc.args.listen}"
                                                 if dc.args.listen != "127.0.0.1:7770" else "")
    web = f"Web console (read-only; open without sign-in, as --insecure is): http://{dc.args.web_listen}/\n" \
        if dc.args.web_listen else ""
    return f"""
gptrm is up in {time.monotonic() - started:.1f} s: node {node!r} registered with coordinator {dc.args.listen}.
Logs: {dc.logs}/coordinator.log and agent.log (tail -f them to watch).
Try, in another terminal:
  {ctl} status
  {ctl} nodes
  {ctl} nodes {node}
  {ctl} submit --name hello --gpus 1 --gpu-mem-gib 10 -- sh -c 'echo hello from $CUDA_VISIBLE_DEVICES; sleep 60'
  {ctl} tasks
  {ctl} top
  {ctl} events --follow
  curl -s http://{dc.args.metrics_listen}/metrics | grep ^gptrm_cluster
{web}Ctrl-C stops everything."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the dev cluster until Ctrl-C or SIGTERM; returns the exit code (0 after a clean stop)."""
    args = build_parser().parse_args(argv)
    state = Path(args.state_dir).expanduser().resolve()
    stop = _Stop()
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    lock = StateLock(state)
    try:
        holder = lock.acquire(args.listen, args.metrics_listen)
    except OSError as e:
        print(f"gptrm: cannot lock the state directory {state}: {e}", file=sys.stderr)
        return EXIT_FAILED
    if holder is not None:   # refused before anything started: nothing of the other cluster is touched
        print(f"gptrm: another dev cluster already uses the state directory {state} ({holder.describe()}); "
              f"stop it first (Ctrl-C in its terminal), or give this one its own --state-dir and --listen",
              file=sys.stderr)
        return EXIT_FAILED
    try:
        for flag, address in (("--listen", args.listen), ("--metrics-listen", args.metrics_listen),
                              ("--web-listen", args.web_listen)):
            if address and _address_in_use(address):
                print(f"gptrm: {address} is in use (another gptrm coordinator or dev cluster?); give this one "
                      f"another {flag}", file=sys.stderr)
                return EXIT_FAILED
        return _run(DevCluster(args, state, lock, stop))
    finally:
        lock.release()


def _run(dc: DevCluster) -> int:
    args, started = dc.args, time.monotonic()
    channel = grpc.insecure_channel(args.listen)
    try:
        # Plaintext and no authentication on loopback: the coordinator logs a warning and `gptrmctl status`
        # says so; the printed gptrmctl commands pass --insecure to connect.
        dc.spawn("coordinator", [str(dc.bin / "gptrm-coordinator"), "--listen", args.listen, "--metrics-listen",
                                 args.metrics_listen, "--state-dir", str(dc.state / "coordinator"), "--etcd",
                                 "embedded", "--coordinator-id", "dev-coordinator", "--insecure",
                                 "--web-listen", args.web_listen,
                                 *shlex.split(os.environ.get(COORDINATOR_ARGS, ""))])
        if dc.wait_for("the coordinator answering", _answers(channel)) is None:
            return 0 if dc.stop else _failed(dc)
        dc.spawn("agent", [str(dc.bin / "gptrm-agent"), "--coordinator", args.listen, "--gpu-backend",
                           args.gpu_backend, "--state-dir", str(dc.agent_state), "--data-paths", str(Path.cwd()),
                           "--advertise-address", "127.0.0.1", "--insecure"])
        node = dc.wait_for("the local node registering", _first_node(channel))
        if node is None:
            return 0 if dc.stop else _failed(dc)
        print(_banner(dc, node, started), flush=True)
        while not dc.stop:
            dead = dc.died()
            if dead is not None:
                print(dc.failure(), file=sys.stderr, flush=True)
                return EXIT_FAILED
            time.sleep(0.2)
        print(f"gptrm: {signal.Signals(dc.stop.signal or signal.SIGINT).name}: stopping the agent, the "
              "coordinator and etcd", flush=True)
        return 0
    finally:
        channel.close()
        dc.shutdown()


def _failed(dc: DevCluster) -> int:
    print(dc.failure(), file=sys.stderr, flush=True)
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
