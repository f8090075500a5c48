"""Room for more tasks on this node, beyond CPU, memory and GPUs: task uids and rendezvous ports.

Each telemetry sample carries (``TelemetrySample.task_uid_room``, ``task_ports_free``):

- how many tasks with a uid of their own the agent can run at once (:meth:`TaskUserPolicy.room`): the
  scheduler never places more tasks needing one on the node, so a task waits, or goes to another
  node, instead of failing with "no free task uid";
- how many ports of ``--task-port-range`` nothing on the host binds (read from ``/proc/net/tcp`` and
  ``tcp6``): a node with none is not made rank 0 of a multi-node task (``docs/ports.md``).

Both are counted at most every :data:`ROOM_INTERVAL_S` (a scan of ``/proc``), in the sampler's thread.

Example::

    room = Room(task_users, own_uids=lambda: [29001], ports=(29500, 29999))
    room.fill(sample)   # sets the two fields (the uid one only where the agent hands out uids)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from pathlib import Path

from agent.task_user import TaskUserPolicy
from common.pb.gptrm.v1 import types_pb2

__all__ = ["ROOM_INTERVAL_S", "Room", "ports_bound"]

ROOM_INTERVAL_S = 10.0
"""Reading ``/proc/net/tcp`` costs the kernel a walk of its socket tables (about 5 ms here, more on a busy host)
and the uid count a scan of every process: once in 10 s keeps the sampler within its budget. The room counts
what other programs hold; what the coordinator places is counted on its side, so a stale count only delays
noticing a squatter (whose port or uid is then refused at start, and the task placed again)."""
_TIME_WAIT = "06"   # a connection's leftover: SO_REUSEADDR binds over it (the agent's reservation does)
_PROC_NET = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def ports_bound(low: int, high: int, tables: Collection[Path] = _PROC_NET) -> set[int]:
    """The ports of ``low..high`` that a TCP socket of this network namespace listens or is connected on.

    :param tables: the kernel's socket tables (injected in tests).
    """
    bound: set[int] = set()
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] == _TIME_WAIT:
                continue
            try:
                port = int(fields[1].rpartition(":")[2], 16)
            except ValueError:
                continue
            if low <= port <= high:
                bound.add(port)
    return bound


class Room:
    """Counts the node's room for tasks (see the module docstring), at most every ``interval_s``.

    :param users: who tasks run as (None: the agent hands out no uids; the uid field stays absent).
    :param own_uids: the uids this agent's running tasks hold now.
    :param ports: ``--task-port-range`` as (low, high).
    """

    def __init__(self, users: TaskUserPolicy | None, own_uids: Callable[[], Collection[int]],
                 ports: tuple[int, int], *, interval_s: float = ROOM_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._users, self._own_uids, self._ports = users, own_uids, ports
        self._interval_s, self._clock = interval_s, clock
        self._at: float | None = None
        self._uids: int | None = None
        self._free_ports = 0

    def fill(self, sample: types_pb2.TelemetrySample) -> None:
        """Set the sample's room fields (recounted when the last count is older than the interval)."""
        now = self._clock()
        if self._at is None or now - self._at >= self._interval_s:
            self._at = now
            self._uids = self._users.room(self._own_uids()) if self._users is not None else None
            low, high = self._ports
            self._free_ports = (high - low + 1) - len(ports_bound(low, high))
        if self._uids is not None:
            sample.task_uid_room = self._uids
        sample.task_ports_free = self._free_ports
