"""Real processes for integration tests: coordinators and agents on loopback ports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import psutil

from agent.task_user import CLAIMS_DIR, DEFAULT_TASK_UIDS, parse_uid_range
from agent.taskkill import node_tag
from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from coordinator.leftover_tasks import kill_leftover_tasks
from tests.helpers.ctl_forks import CtlForks
from tests.helpers.ports import free_port, worker_task_ports

T = TypeVar("T")
BIN = Path(sys.executable).parent
_CTL = CtlForks(BIN / "gptrmctl")
"""Runs :meth:`Cluster.ctl`'s commands (each a gptrmctl process, forked from one that imported it once)."""


def wait_until(fn: Callable[[], T], timeout_s: float = 60.0, interval_s: float = 0.1, what: str = "condition") -> T:
    """Poll ``fn`` until it returns something truthy; its value is returned."""
    end = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < end:
        try:
            last = fn()
            if last:
                return last
        except grpc.RpcError as e:
            last = e
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last value: {last!r}")


@dataclass
class Proc:
    """A child process with its log file."""

    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    def start(self) -> Proc:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            self.proc.send_signal(sig)  # type: ignore[union-attr]

    def terminate(self) -> None:
        """SIGCONT (a stopped process could not act on what follows), then SIGTERM; does not wait."""
        if self.alive:
            self.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            self.proc.terminate()  # type: ignore[union-attr]

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """:meth:`terminate`, then wait ``timeout_s`` for the exit before SIGKILL; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()  # type: ignore[union-attr]
            self.proc.wait()  # type: ignore[union-attr]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, chars: int = 3000) -> str:
        return self.log()[-chars:]


@dataclass(frozen=True)
class StartedAgent:
    """An agent some :class:`Cluster` started: where its state lives and which uids its tasks run as."""

    state_dir: Path
    task_uids: range | None

    @classmethod
    def of(cls, argv: list[str]) -> StartedAgent:
        """From the agent's command line (the last of a repeated flag wins, as for argparse)."""
        def last(flag: str, default: str) -> str:
            values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
            values += [a.split("=", 1)[1] for a in argv if a.startswith(flag + "=")]
            return values[-1] if values else default

        uids = parse_uid_range(last("--task-uids", DEFAULT_TASK_UIDS)) if os.geteuid() == 0 else None
        return cls(Path(last("--state-dir", "")).absolute(), uids)


STARTED_AGENTS: list[StartedAgent] = []
"""Every agent the harness started in this test session, in order (see :func:`task_processes_left`)."""


def _claim_owner(uid: int) -> str | None:
    try:
        return (CLAIMS_DIR / str(uid)).read_text().strip()
    except OSError:
        return None


def task_processes_left(agents: list[StartedAgent]) -> list[psutil.Process]:
    """Live processes running as a task uid of ``agents`` (real or effective uid), except those of a uid another
    agent on this host has claimed (another test run's task)."""
    ranges = [a.task_uids for a in agents if a.task_uids is not None]
    if not ranges:
        return []
    ours = {node_tag(a.state_dir) for a in agents}
    found = []
    for p in psutil.process_iter(["uids", "status"]):
        ids = p.info.get("uids")
        if ids is None or p.info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        uid = next((u for u in (ids.real, ids.effective) if any(u in r for r in ranges)), None)
        if uid is None:
            continue
        owner = _claim_owner(uid)
        if owner is None or owner in ours:
            found.append(p)
    return found


def describe(p: psutil.Process) -> str:
    """``pid N uid U: cmdline`` (what a failure names)."""
    try:
        return f"pid {p.pid} uid {p.uids().real}: {' '.join(p.cmdline()) or p.name()}"
    except psutil.Error:
        return f"pid {p.pid} (gone)"


def _plaintext_unless_tls(args: tuple[str, ...] | list[str]) -> list[str]:
    """``--insecure`` for processes given no TLS settings (what the loopback tests use)."""
    return [] if any(a.startswith(("--tls-", "--insecure")) for a in args) else ["--insecure"]


class Cluster:
    """Coordinators and agents sharing one etcd (by endpoints and key prefix).

    :param tmp: directory for state and logs.
    :param etcd_endpoints: ``host:port`` list of a running etcd.
    :param prefix: etcd key prefix, unique per test.
    """

    def __init__(self, tmp: Path, etcd_endpoints: list[str], prefix: str) -> None:
        self.tmp = tmp
        self.etcd = ",".join(f"http://{e}" for e in etcd_endpoints)
        self.prefix = prefix
        self.coordinators: dict[str, tuple[Proc, str, str]] = {}
        self.agents: dict[str, Proc] = {}

    def start_coordinator(self, name: str = "c1", *extra: str, port: int | None = None,
                          env: dict[str, str] | None = None) -> str:
        """Start (or restart on the same ports) coordinator ``name``; returns its address.

        Plaintext (``--insecure``) unless ``extra`` carries ``--tls-cert``; ``env`` adds environment variables.
        """
        if name in self.coordinators:
            _, listen, metrics = self.coordinators[name]
        else:
            listen, metrics = f"127.0.0.1:{port or free_port()}", f"127.0.0.1:{free_port()}"
        proc = Proc([str(BIN / "gptrm-coordinator"), "--listen", listen, "--metrics-listen", metrics,
                     "--etcd", self.etcd, "--etcd-prefix", self.prefix, "--coordinator-id", name,
                     "--state-dir", str(self.tmp / name), *_plaintext_unless_tls(extra), *extra],
                    self.tmp / f"{name}.log", env=dict(env or {})).start()
        self.coordinators[name] = (proc, listen, metrics)
        return listen

    def start_agent(self, node_id: str, *extra: str, coordinators: list[str] | None = None) -> Proc:
        addrs = ",".join(coordinators or [a for _, a, _ in self.coordinators.values()])
        proc = Proc([str(BIN / "gptrm-agent"), "--coordinator", addrs, "--node-id", node_id, "--gpu-backend",
                     "simulated", "--simulate-gpus", "4xH100-80GB", "--state-dir", str(self.tmp / f"agent-{node_id}"),
                     "--interval", "0.5", "--backoff-max", "1", "--advertise-address", "127.0.0.1",
                     "--task-port-range", worker_task_ports(), *_plaintext_unless_tls(extra), *extra],
                    self.tmp / f"agent-{node_id}.log").start()
        self.agents[node_id] = proc
        STARTED_AGENTS.append(StartedAgent.of(proc.argv))
        return proc

    def ready_nodes(self, name: str = "c1") -> int:
        """Nodes READY as coordinator ``name`` sees them."""
        res = self.ctl("-o", "json", "nodes", coordinator=self.address(name))
        if res.returncode != 0:
            return 0
        return sum(n["state"] == "ready" for n in json.loads(res.stdout)["nodes"])

    def start_agents(self, node_ids: list[str], *extra: str, leader: str = "c1") -> None:
        """Agents ``node_ids`` on this host, ready as ``leader`` sees them. Each hands its tasks uids from a range of
        its own: an agent ends whatever runs as an ended task's uid, so two agents on one host must never give the
        same uid to two tasks."""
        for i, n in enumerate(node_ids):
            first = 1879048192 + 512 * i
            self.start_agent(n, "--task-uids", f"{first}-{first + 511}", *extra)
        wait_until(lambda: self.ready_nodes(leader) == len(node_ids), what=f"{len(node_ids)} ready nodes")

    def address(self, name: str = "c1") -> str:
        return self.coordinators[name][1]

    def metrics_address(self, name: str = "c1") -> str:
        return self.coordinators[name][2]

    def proc(self, name: str) -> Proc:
        return self.coordinators[name][0]

    def admin(self, name: str = "c1") -> admin_pb2_grpc.AdminStub:
        return admin_pb2_grpc.AdminStub(grpc.insecure_channel(self.address(name)))

    def status(self, name: str = "c1") -> admin_pb2.ClusterStatus:
        return self.admin(name).GetStatus(admin_pb2.GetStatusRequest(), timeout=2)

    def wait_serving(self, name: str = "c1") -> admin_pb2.ClusterStatus:
        """Until coordinator ``name`` answers GetStatus (its start-up, imports included, takes what the machine's
        load makes it take); fails at once, with its log, when the process exited."""
        proc = self.proc(name)

        def answers() -> admin_pb2.ClusterStatus:
            if not proc.alive:
                raise AssertionError(f"coordinator {name} exited ({proc.proc and proc.proc.returncode}):\n"
                                     f"{proc.tail()}")
            return self.status(name)
        return wait_until(answers, what=f"{name} to serve")

    def wait_leader(self, name: str = "c1", timeout_s: float = 20.0) -> admin_pb2.ClusterStatus:
        """Until coordinator ``name`` leads, ``timeout_s`` from when it serves (:meth:`wait_serving`)."""
        self.wait_serving(name)
        return wait_until(lambda: (s := self.status(name)).is_leader and s, timeout_s, what=f"{name} to lead")

    def ctl(self, *args: str, timeout_s: float = 30.0, coordinator: str | None = None) -> subprocess.CompletedProcess:
        addr = coordinator or ",".join(a for _, a, _ in self.coordinators.values())
        return _CTL.run(["--coordinator", addr, *_plaintext_unless_tls(args), *args], timeout_s)

    def ctl_json(self, *args: str, coordinator: str | None = None) -> Any:
        """``gptrmctl -o json ARGS``'s document (the command must succeed)."""
        res = self.ctl("-o", "json", *args, coordinator=coordinator)
        assert res.returncode == 0, f"{args}: {res.stderr}"
        return json.loads(res.stdout)

    def submit(self, *args: str) -> str:
        """Submit with gptrmctl; returns the task id."""
        return str(self.ctl_json("submit", *args)["task_id"])

    def task(self, task_id: str, coordinator: str | None = None) -> dict[str, Any]:
        """``gptrmctl tasks TASK`` as JSON (asking ``coordinator`` only, when given)."""
        return dict(self.ctl_json("tasks", task_id, coordinator=coordinator))

    def task_in(self, task_id: str, *states: str) -> dict[str, Any] | None:
        """The task when it is in one of ``states`` (for :func:`wait_until`), else None."""
        t = self.task(task_id)
        return t if t["state"] in states else None

    def stop(self) -> None:
        """Agents, then coordinators; each group is signalled at once, then waited for (each shuts down in its
        own time, up to a second or so, which need not add up)."""
        for group in (list(self.agents.values()), [p for p, _, _ in self.coordinators.values()]):
            for p in group:
                p.terminate()
            for p in group:
                p.stop()
        # Agents leave their tasks running on purpose; the test's tasks must not outlive it, wherever the test
        # put the agent's state directory.
        kill_leftover_tasks(os.path.join(str(self.tmp), "agent-"))
        for state_dir in {StartedAgent.of(p.argv).state_dir for p in self.agents.values()}:
            kill_leftover_tasks(str(state_dir) + os.sep)

    def logs(self) -> str:
        parts = [f"==== {p.log_path.name}\n{p.log()[-4000:]}" for p in self.agents.values()]
        parts += [f"==== {p.log_path.name}\n{p.log()[-4000:]}" for p, _, _ in self.coordinators.values()]
        return "\n".join(parts)


def default_sigint() -> None:
    """In the child before exec: Ctrl-C acts by default, also when the tests were started in the background
    (a shell without job control starts background commands with SIGINT ignored, and an ignored signal
    stays ignored across exec, so Python would not turn it into KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_NOT_HOLDING = frozenset({types_pb2.TASK_STATE_PENDING, types_pb2.TASK_STATE_SUCCEEDED, types_pb2.TASK_STATE_FAILED,
                          types_pb2.TASK_STATE_CANCELLED})


def assert_gpus_held_once(tasks: list[types_pb2.Task]) -> None:
    """No GPU is in the allocation of two tasks that hold GPUs (neither pending nor ended)."""
    held: dict[tuple[str, int], str] = {}
    for t in tasks:
        if t.state in _NOT_HOLDING:
            continue
        for na in t.allocation.nodes:
            for i in na.gpu_indices:
                assert (na.node_id, i) not in held, f"GPU {na.node_id}:{i} held by {held[(na.node_id, i)]} and {t.id}"
                held[(na.node_id, i)] = t.id


# Tasks that run this repository's interpreter or write into pytest's 0700 temporary directories cannot
# do so as the default task user (nobody) when the tests themselves run as root; such tests let their
# tasks run as root explicitly, the way an operator would: the agent allows it, the spec asks for it.
AS_ROOT = os.geteuid() == 0
ROOT_TASKS_AGENT: tuple[str, ...] = ("--task-users-allowed", "root") if AS_ROOT else ()
ROOT_TASKS_SUBMIT: tuple[str, ...] = ("--run-as-user", "root") if AS_ROOT else ()
