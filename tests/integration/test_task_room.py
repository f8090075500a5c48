"""Room for tasks beyond CPU, memory and GPUs, against real agents running as root: task uids and
rendezvous ports are held for the tasks that need them (agent/room.py, docs/ports.md).

- a task binding every port of a node's ``--task-port-range`` does not make later single-node tasks
  fail (they get no port and no bind check);
- a gang's rank 0 gets its master port even while a squatter holds another node's whole range, and
  nothing else can bind the port its agent reserved (the socket is the task's from the start);
- a node whose agent has no free task uid is not given another task: it waits, pending, instead of
  failing with "no free task uid".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.ports import free_port
from tests.integration.harness import Cluster, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent must be root to run tasks as their own users")

# The tasks' interpreter: a system one, which any task uid may run (the venv's may sit under a 0700 home).
_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
_FIRST_UID = 1879050000   # task uid ranges of this module's agents, apart from the other tests' agents

_SQUAT = r'''
import socket, sys, time
held = []
for port in range(int(sys.argv[1]), int(sys.argv[2]) + 1):
    s = socket.socket()
    s.bind(("0.0.0.0", port))
    s.listen()
    held.append(s)
print("squatting", flush=True)
time.sleep(3600)
'''

# Rank 0 accepts on the socket its agent reserved and handed over; it first checks that no socket of its
# own can bind the port, whatever its options (a squatter racing for it could not either). Rank 1 sends
# a secret, which rank 0 alone receives.
_GANG = r'''
import os, socket, sys, time
rank, port = int(os.environ["NODE_RANK"]), int(os.environ["MASTER_PORT"])
if rank == 0:
    srv = socket.socket(fileno=int(os.environ["GPTRM_MASTER_LISTEN_FD"]))
    assert srv.getsockname()[1] == port
    for host in ("0.0.0.0", "127.0.0.1"):
        racer = socket.socket()
        racer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        racer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            racer.bind((host, port))
        except OSError:
            continue
        print("racer bound the master port", flush=True)
        sys.exit(3)
    conn, _ = srv.accept()
    print("rank0 received", conn.makefile().readline().strip(), flush=True)
else:
    end = time.monotonic() + 60
    while True:
        try:
            c = socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=5)
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)
    c.sendall(b"rank1-secret-gradient\n")
'''


def _free_range(n: int) -> int:
    """The first port of ``n`` consecutive ports free on every address now (a free port's neighbours may be
    taken by another test's processes: the squatter must be able to bind the whole range)."""
    for _ in range(100):
        low = free_port()
        with contextlib.ExitStack() as held:
            try:
                for port in range(low, low + n):
                    s = held.enter_context(socket.socket())
                    s.bind(("0.0.0.0", port))
            except OSError:
                continue
        return low
    raise AssertionError(f"no {n} consecutive free ports found")


def _bound(low: int, high: int) -> bool:
    """Whether every port of ``low..high`` is held by something (this process cannot bind any)."""
    for port in range(low, high + 1):
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("0.0.0.0", port))
            return False
    return True


@pytest.fixture
def scripts() -> Iterator[Path]:
    """A directory any task uid may read (pytest's temporary directories are 0700)."""
    top = Path(tempfile.mkdtemp(prefix="gptrm-room-", dir="/var/tmp"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _script(directory: Path, name: str, text: str) -> str:
    path = directory / name
    path.write_text(text)
    path.chmod(0o644)
    return str(path)


def _ended(c: Cluster, task_id: str) -> dict:
    return wait_until(lambda: c.task_in(task_id, "succeeded", "failed", "cancelled"), 90.0,
                      what=f"{task_id} to end")


def _start(c: Cluster, node: str, uids: str, ports: str) -> None:
    c.start_agent(node, "--task-uids", uids, "--task-port-range", ports)
    wait_until(lambda: any(n["node_id"] == node and n["state"] == "ready" for n in c.ctl_json("nodes")["nodes"]),
               what=f"{node} ready")


class TestPorts:
    def test_a_task_binding_the_port_range_does_not_fail_later_single_node_tasks(self, cluster: Cluster,
                                                                                   scripts: Path) -> None:
        """A task binds every port of n1's range and stays; a single-node task submitted next still succeeds:
        it gets no master port and no bind check."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        low = _free_range(3)
        _start(cluster, "n1", f"{_FIRST_UID}-{_FIRST_UID + 15}", f"{low}-{low + 2}")
        squat = _script(scripts, "squat.py", _SQUAT)
        squatter = cluster.submit("--gpus", "0", "--cpu", "0.1", "--", _PYTHON, squat, str(low), str(low + 2))
        try:
            wait_until(lambda: _bound(low, low + 2), what="the squatter to bind the whole range")
            tid = cluster.submit("--gpus", "0", "--cpu", "0.1", "--", "/bin/sh", "-c", "echo single-node ok")
            t = _ended(cluster, tid)
            assert t["state"] == "succeeded", t
            assert not t.get("master_port"), t
        finally:
            cluster.ctl("cancel", squatter)

    def test_rank0_gets_its_port_while_a_squatter_holds_another_nodes_range(self, cluster: Cluster,
                                                                             scripts: Path) -> None:
        """n1's range is all bound by a squatter: the gang's rank 0 is n2, whose agent listens on the master
        port from the start and hands the socket over; nothing else can bind it, and rank 1's secret reaches
        rank 0. The task succeeds, never counted as restarted."""
        cluster.start_coordinator("c1", "--threshold", "1.0")
        cluster.wait_leader("c1")
        low1, low2 = _free_range(2), free_port()
        _start(cluster, "n1", f"{_FIRST_UID + 16}-{_FIRST_UID + 31}", f"{low1}-{low1 + 1}")
        squatter = cluster.submit("--gpus", "0", "--cpu", "0.1", "--", _PYTHON,
                                  _script(scripts, "squat.py", _SQUAT), str(low1), str(low1 + 1))
        try:
            wait_until(lambda: _bound(low1, low1 + 1), what="the squatter to bind n1's whole range")
            wait_until(lambda: cluster.ctl_json("nodes", "n1")["task_ports_free"] == 0,
                       what="n1's agent to report no free task port")
            _start(cluster, "n2", f"{_FIRST_UID + 32}-{_FIRST_UID + 47}", f"{low2}-{low2 + 1}")
            tid = cluster.submit("--nodes", "2", "--gpus", "4", "--gpu-mem-gib", "10", "--cpu", "0.1", "--",
                                 _PYTHON, _script(scripts, "gang.py", _GANG))
            t = _ended(cluster, tid)
            out = cluster.ctl("logs", tid).stdout
            assert t["state"] == "succeeded", (t, out)
            assert "rank0 received rank1-secret-gradient" in out, out
            assert t["allocation"][0]["node_id"] == "n2" and low2 <= t["master_port"] <= low2 + 1, t
            assert t["restarts"] == 0, t
        finally:
            cluster.ctl("cancel", squatter)


class TestUids:
    @pytest.mark.slow
    def test_a_node_without_a_free_task_uid_leaves_the_task_pending(self, cluster: Cluster) -> None:
        """An agent with 2 task uids and 3 tasks: two run, the third waits pending (its reason says why)
        instead of failing, and runs once a uid is free again; none is counted as restarted."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        _start(cluster, "n1", f"{_FIRST_UID + 48}-{_FIRST_UID + 49}", "29500-29999")
        wait_until(lambda: cluster.ctl_json("nodes", "n1")["task_uid_room"] == 2, what="n1's room for 2 task uids")
        assert "room          2 tasks with a uid of their own" in cluster.ctl("nodes", "n1").stdout
        ids = [cluster.submit("--name", f"uid-{i}", "--gpus", "0", "--cpu", "0.1", "--", "sleep", f"{3201 + i}")
               for i in range(3)]
        try:
            def two_running_one_waiting() -> list[dict] | None:
                tasks = [cluster.task(t) for t in ids]
                running = [t for t in tasks if t["state"] == "running"]
                waiting = [t for t in tasks if t["state"] == "pending" and "task uid" in t["reason"]]
                return tasks if len(running) == 2 and len(waiting) == 1 else None

            tasks = wait_until(two_running_one_waiting, 60.0, what="two tasks running and one waiting for a uid")
            assert all(t["state"] != "failed" and t["restarts"] == 0 for t in tasks), tasks
            waiting = next(t["task_id"] for t in tasks if t["state"] == "pending")
            running = next(t["task_id"] for t in tasks if t["state"] == "running")
            cluster.ctl("cancel", running)
            wait_until(lambda: cluster.task_in(waiting, "running"), 60.0, what="the waiting task to run")
            assert cluster.task(waiting)["restarts"] == 0
        finally:
            for t in ids:
                cluster.ctl("cancel", t)
            for t in ids:
                _ended(cluster, t)
