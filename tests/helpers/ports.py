"""Ports for the servers a test starts, shared out among the pytest workers running on this host at once.

A port the kernel picks with ``bind(port 0)`` comes from its ephemeral range (32768-60999 on Debian), the same range
every outgoing connection on the host draws its local port from: between the moment a test learns such a port and
the moment its coordinator binds it, a gRPC or etcd client of another test may have connected from it, and the
coordinator exits with "address already in use". The ports handed out here lie below both the ephemeral range and
the agent's default task port range (29500-29999), each pytest worker has its own share of them, and a worker walks
its share in turn instead of being handed the same port twice in a row before its first user has bound it.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path

__all__ = ["free_port", "worker_share", "worker_task_ports"]

_LISTEN_PORTS = (20000, 29499)
"""Where test servers listen: above the fixed ports a few tests name (19100, 19200), below the task port range."""
_TASK_PORTS = (29500, 29999)
"""The agent's default ``--task-port-range``."""


def worker_share(low: int, high: int) -> tuple[int, int]:
    """This pytest worker's share of the ports ``low``-``high`` (all of them outside pytest-xdist)."""
    workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), 1)
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % workers
    share = (high - low + 1) // workers
    first = low + share * worker
    return first, first + share - 1


def worker_task_ports() -> str:
    """This pytest worker's share of the agent's default ``--task-port-range``, as the flag takes it: tests on
    other workers run their own agents on this host at the same time, and a master port one of their tasks holds
    would make a gang start here be refused and placed again (which the tests that count a task's history do not
    expect)."""
    first, last = worker_share(*_TASK_PORTS)
    return f"{first}-{last}"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _listen_share() -> tuple[int, int]:
    low, high = _LISTEN_PORTS
    return worker_share(low, min(high, _ephemeral_low() - 1))


_FIRST, _LAST = _listen_share()
_turn = itertools.count(random.randrange(_LAST - _FIRST + 1))
"""Where this process is in its walk of its share (a random start, so processes sharing a worker's share, such as a
test and a cluster it forks, do not walk in step)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port of this worker's share that nothing on ``host`` listens on or is bound to right now."""
    span = _LAST - _FIRST + 1
    for _ in range(span):
        port = _FIRST + next(_turn) % span
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {_FIRST}-{_LAST} on {host}")
