"""The invariant checker every fault scenario ends with.

It reads what the cluster has really recorded — etcd's ``tasks/``, ``allocations/`` and
``nodes/`` keys, and every agent's durable task table with the liveness of each process in
it — never a coordinator's answer, and checks:

1. **exactly once**: every accepted submit (request id → task id) names a task that exists,
   and no two request ids name one task (and no task is missing or duplicated);
2. **no double booking**: at every sampled moment, the GPU shares held on one GPU by live tasks
   sum to at most 1, both in etcd's allocations and among the agents' live processes;
3. **legal histories**: every task's recorded history is a path of the production state machine
   (``coordinator.sync.state_machine.LEGAL_TRANSITIONS``), starting at PENDING;
4. **etcd agrees with the hosts**: after the reconcile grace, a task is RUNNING (or STARTING /
   PAUSED) in etcd exactly when its process is alive on the agent it was placed on, and no agent
   runs a process for a task that etcd holds as ended or pending (no status event lost);
5. **nothing stuck**: no node stays in a transitional power state (draining, powering-off,
   powering-on) and no task stays SCHEDULED/PREEMPTED past the grace.

``sample()`` takes one snapshot (the background sampler calls it every ``interval_s``);
``settle()`` waits for the cluster to converge, then returns every violation found, sampled
ones included. An empty list is a green scenario.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import etcd3
import psutil

from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, TaskState
from coordinator.sync.state_machine import is_legal

__all__ = ["InvariantChecker", "Violation", "on_first_member"]

T = TypeVar("T")

_LIVE_IN_ETCD = frozenset({TaskState.SCHEDULED, TaskState.STARTING, TaskState.RUNNING, TaskState.PAUSED})
_ON_HOST = frozenset({TaskState.STARTING, TaskState.RUNNING, TaskState.PAUSED})
_TRANSITIONAL_POWER = frozenset({types_pb2.NODE_POWER_STATE_DRAINING, types_pb2.NODE_POWER_STATE_POWERING_OFF,
                                 types_pb2.NODE_POWER_STATE_POWERING_ON})
_EPS = 1e-6


def on_first_member(endpoints: Iterable[str], read: Callable[[etcd3.Etcd3Client], T]) -> T:
    """``read`` through a client of the first etcd member that answers (members may be down or frozen).

    :raises RuntimeError: no member answered.
    """
    last: Exception | None = None
    for ep in endpoints:
        host, port = ep.rsplit(":", 1)
        try:
            client = etcd3.client(host=host, port=int(port), timeout=3)
            try:
                return read(client)
            finally:
                client.close()
        except Exception as e:   # a member that is down or stopped, or ``read`` refused its answer: try the next
            last = e
    raise RuntimeError(f"no etcd member answered: {last}")


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which one, and what shows it."""

    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.detail}"


@dataclass
class _Snapshot:
    tasks: dict[str, types_pb2.Task] = field(default_factory=dict)
    allocations: dict[str, types_pb2.Allocation] = field(default_factory=dict)
    nodes: dict[str, types_pb2.NodeRecord] = field(default_factory=dict)
    unparsed: list[str] = field(default_factory=list)
    host_live: dict[str, dict[str, dict]] = field(default_factory=dict)   # node → task id → record


def _alive(rec: Mapping) -> bool:
    pid = int(rec.get("pid", 0))
    if pid <= 1:
        return False
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - float(rec.get("create_time", 0))) < 1.0 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class InvariantChecker:
    """Reads etcd and the agents' state directories; collects violations.

    :param endpoints: ``host:port`` of etcd members (the first that answers is used).
    :param prefix: the cluster's etcd key prefix.
    :param agent_state_dirs: node id → that agent's ``--state-dir``.
    """

    def __init__(self, endpoints: Iterable[str], prefix: str, agent_state_dirs: Mapping[str, Path]) -> None:
        self.endpoints = list(endpoints)
        self.prefix = prefix
        self.agent_state_dirs = dict(agent_state_dirs)
        self.violations: list[Violation] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ---- reading -----------------------------------------------------------------------

    def _etcd_items(self, subs: Iterable[str]) -> dict[str, list[tuple[str, bytes]]]:
        """Every key under each ``prefix + sub``, read through one client."""
        subs = tuple(subs)   # read again in full if a member fails part way
        return on_first_member(self.endpoints, lambda client: {
            sub: [(m.key.decode(), v) for v, m in client.get_prefix(self.prefix + sub)] for sub in subs})

    def snapshot(self) -> _Snapshot:
        """What etcd and the hosts hold right now."""
        snap = _Snapshot()
        kinds = (("tasks/", types_pb2.Task, snap.tasks), ("allocations/", types_pb2.Allocation, snap.allocations),
                 ("nodes/", types_pb2.NodeRecord, snap.nodes))
        items = self._etcd_items(sub for sub, _, _ in kinds)
        for sub, kind, out in kinds:
            for key, value in items[sub]:
                try:
                    out[key.rsplit("/", 1)[1]] = kind.FromString(value)
                except Exception:
                    snap.unparsed.append(key)
        for node, state_dir in self.agent_state_dirs.items():
            try:
                doc = json.loads((Path(state_dir) / "tasks.json").read_text())
            except (OSError, ValueError):
                doc = {}
            snap.host_live[node] = {tid: rec for tid, rec in doc.get("tasks", {}).items() if _alive(rec)}
        return snap

    # ---- checks ------------------------------------------------------------------------

    def _add(self, found: Iterable[Violation]) -> None:
        with self._lock:
            for v in found:
                if v not in self.violations:
                    self.violations.append(v)

    @staticmethod
    def double_booking(snap: _Snapshot) -> list[Violation]:
        """GPU shares held by live tasks on one GPU, in etcd and on the hosts, must not exceed 1."""
        found: list[Violation] = []
        held: dict[tuple[str, int], list[tuple[str, float]]] = defaultdict(list)
        for tid, task in snap.tasks.items():
            if TaskState(task.state) not in _LIVE_IN_ETCD:
                continue
            alloc = snap.allocations.get(tid)
            for na in (alloc.nodes if alloc is not None else ()):
                for i in na.gpu_indices:
                    held[(na.node_id, i)].append((tid, na.gpu_share or 1.0))
        for (node, gpu), users in held.items():
            if sum(s for _, s in users) > 1 + _EPS:
                found.append(Violation("no-double-booking", f"etcd: GPU {node}:{gpu} held by {sorted(users)}"))
        for node, live in snap.host_live.items():
            on_gpu: dict[int, list[tuple[str, float]]] = defaultdict(list)
            for tid, rec in live.items():
                for i in rec.get("gpu_indices", []):
                    on_gpu[int(i)].append((tid, float(rec.get("gpu_share") or 1.0)))
            for gpu, users in on_gpu.items():
                if sum(s for _, s in users) > 1 + _EPS:
                    found.append(Violation("no-double-booking",
                                           f"host {node}: GPU {gpu} used by live processes of {sorted(users)}"))
        return found

    @staticmethod
    def histories(snap: _Snapshot) -> list[Violation]:
        """Every recorded history is a legal path that ends in the task's current state."""
        found = []
        for tid, task in snap.tasks.items():
            states = [TaskState(h.state) for h in task.history]
            if not states:
                found.append(Violation("legal-history", f"{tid}: no history"))
                continue
            for a, b in itertools.pairwise(states):
                if not is_legal(a, b):
                    found.append(Violation("legal-history", f"{tid}: {a.label} → {b.label} in "
                                           f"{[s.label for s in states]}"))
            if states[-1] != TaskState(task.state):
                found.append(Violation("legal-history", f"{tid}: history ends {states[-1].label}, "
                                       f"state is {TaskState(task.state).label}"))
        return found

    @staticmethod
    def exactly_once(snap: _Snapshot, accepted: Mapping[str, str]) -> list[Violation]:
        """Each accepted request names one existing task; no task answers two requests."""
        found = []
        by_task: dict[str, list[str]] = defaultdict(list)
        for rid, tid in accepted.items():
            by_task[tid].append(rid)
            if tid not in snap.tasks:
                found.append(Violation("exactly-once", f"request {rid}: task {tid} is not in etcd (lost)"))
        found += [Violation("exactly-once", f"task {tid} answers requests {rids}")
                  for tid, rids in by_task.items() if len(rids) > 1]
        extra = sorted(set(snap.tasks) - set(by_task))
        if extra:
            found.append(Violation("exactly-once", f"tasks nobody submitted (duplicates?): {extra[:10]}"))
        if snap.unparsed:
            found.append(Violation("exactly-once", f"values that do not parse: {snap.unparsed[:10]}"))
        return found

    @staticmethod
    def agreement(snap: _Snapshot) -> list[Violation]:
        """A task is on-host in etcd exactly when its process lives on the node it was placed on."""
        found = []
        for tid, task in snap.tasks.items():
            state = TaskState(task.state)
            alloc = snap.allocations.get(tid)
            placed = {na.node_id for na in alloc.nodes} if alloc is not None else set()
            watched = placed & set(snap.host_live)
            if state in _ON_HOST and watched and not any(tid in snap.host_live[n] for n in watched):
                found.append(Violation("etcd-agrees-with-hosts",
                                       f"{tid} is {state.label} in etcd but runs on none of {sorted(watched)}"))
        for node, live in snap.host_live.items():
            for tid in live:
                task = snap.tasks.get(tid)
                if task is None or TaskState(task.state) in TERMINAL_STATES | {TaskState.PENDING}:
                    label = "missing" if task is None else TaskState(task.state).label
                    found.append(Violation("etcd-agrees-with-hosts",
                                           f"{tid} runs on {node} but is {label} in etcd (status lost)"))
        return found

    @staticmethod
    def nothing_stuck(snap: _Snapshot) -> list[Violation]:
        """No node in a transitional power state; no task waiting SCHEDULED or PREEMPTED."""
        found = [Violation("nothing-stuck", f"node {n} stays {types_pb2.NodePowerState.Name(r.power_state)}")
                 for n, r in snap.nodes.items() if r.power_state in _TRANSITIONAL_POWER]
        found += [Violation("nothing-stuck", f"task {t} stays {TaskState(task.state).label}")
                  for t, task in snap.tasks.items()
                  if TaskState(task.state) in (TaskState.SCHEDULED, TaskState.PREEMPTED)]
        return found

    # ---- running -----------------------------------------------------------------------

    def sample(self) -> None:
        """One snapshot: the invariants that must hold at every instant."""
        try:
            snap = self.snapshot()
        except RuntimeError:
            return   # etcd down (a fault the scenario injected): nothing to read now
        self.samples += 1
        self._add(self.double_booking(snap))
        self._add(self.histories(snap))

    def start_sampling(self, interval_s: float = 0.25) -> None:
        """Sample in a background thread until :meth:`settle`."""
        def loop() -> None:
            while not self._stop.wait(interval_s):
                self.sample()
        self._thread = threading.Thread(target=loop, name="invariant-sampler", daemon=True)
        self._thread.start()

    def settle(self, accepted: Mapping[str, str] | None = None, grace_s: float = 45.0) -> list[Violation]:
        """Stop sampling, wait up to ``grace_s`` for convergence, return every violation seen."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        end = time.monotonic() + grace_s
        while True:
            try:
                snap = self.snapshot()
                final = self.agreement(snap) + self.nothing_stuck(snap)
            except RuntimeError as e:
                snap, final = None, [Violation("etcd-reachable", str(e))]
            if not final or time.monotonic() > end:
                break
            time.sleep(0.5)
        if snap is not None:
            self._add(self.double_booking(snap) + self.histories(snap))
            if accepted is not None:
                self._add(self.exactly_once(snap, accepted))
        self._add(final)
        return list(self.violations)
