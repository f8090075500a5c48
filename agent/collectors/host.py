"""The host through psutil: CPU, load, memory, data disks, network and per-task usage.

Per-task usage needs ``psutil.Process`` objects that live across ticks (``cpu_percent``
measures since the previous call on the same object), so each task's processes are kept
from tick to tick and dropped as soon as they exit or their task ends.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from agent.collectors.base import DiskReading, HostReading, TaskUsage

__all__ = ["NAME", "HostCollector", "TaskPids", "block_device_for", "parse_net_totals"]

NAME = "host"

TaskPids = Callable[[], Mapping[str, Sequence[int]]]
"""Returns the root pids of every running task by task id; children are found here."""


def _no_tasks() -> Mapping[str, Sequence[int]]:
    return {}


class HostCollector:
    """Reads the host once per tick.

    Example::

        host = HostCollector(data_paths=["/var/lib/gptrm"], task_pids=runtime.task_pids)
        [reading] = host.collect()

    :param data_paths: directories whose file system usage and disk I/O are reported.
    :param task_pids: the task table, see :data:`TaskPids`.
    :param rescan_every: ticks between searches for new child processes of known tasks.
    """

    name = NAME

    def __init__(self, data_paths: Sequence[str] = (), task_pids: TaskPids = _no_tasks, rescan_every: int = 10) -> None:
        self._task_pids = task_pids
        partitions = psutil.disk_partitions(all=True)
        # Mounts do not move under a running agent; map each path to its block device once.
        self._disks = {path: block_device_for(path, partitions) for path in data_paths}
        # Finding a task's descendants scans every process on the host (~25 us each), so it
        # is done when the task's root pids change and every ``rescan_every`` ticks, not on
        # every tick; in between the known processes are re-read and the exited ones dropped.
        self._rescan_every = max(1, rescan_every)
        self._tick = 0
        self._families: dict[str, tuple[tuple[int, ...], list[psutil.Process]]] = {}
        psutil.cpu_percent(interval=None)  # primes the counter so the first tick is meaningful

    @property
    def tracked_pids(self) -> frozenset[int]:
        """Pids whose Process objects are kept for the next tick (the last tick's task processes)."""
        return frozenset(proc.pid for _, procs in self._families.values() for proc in procs)

    def collect(self) -> list[HostReading]:
        """Read the host now."""
        mem = psutil.virtual_memory()
        load1, load5, load15 = psutil.getloadavg()
        rx, tx = parse_net_totals(psutil.net_io_counters(pernic=True))
        return [
            HostReading(
                cpu_util=psutil.cpu_percent(interval=None) / 100.0,
                load1=load1,
                load5=load5,
                load15=load15,
                # "available" accounts for reclaimable cache, which "used" does not.
                mem_used_bytes=mem.total - mem.available,
                mem_total_bytes=mem.total,
                disks=tuple(self._read_disks()),
                net_rx_bytes_total=rx,
                net_tx_bytes_total=tx,
                tasks=tuple(self._read_tasks()),
            )
        ]

    def _read_disks(self) -> Iterable[DiskReading]:
        if not self._disks:
            return
        per_disk = psutil.disk_io_counters(perdisk=True, nowrap=True) or {}
        for path, device in self._disks.items():
            try:
                usage = psutil.disk_usage(path)
            except OSError:
                continue
            io = per_disk.get(device) if device else None
            if io is None:  # no block device of its own (overlay, NFS): the host's totals
                io = psutil.disk_io_counters(perdisk=False, nowrap=True)
            yield DiskReading(
                path=path,
                total_bytes=usage.total,
                used_bytes=usage.used,
                read_bytes_total=io.read_bytes if io else 0,
                write_bytes_total=io.write_bytes if io else 0,
            )

    def _read_tasks(self) -> Iterable[TaskUsage]:
        self._tick += 1
        rescan = self._tick % self._rescan_every == 0
        cached = {proc.pid: proc for family in self._families.values() for proc in family[1]}
        families: dict[str, tuple[tuple[int, ...], list[psutil.Process]]] = {}
        usages = []
        for task_id, pids in self._task_pids().items():
            roots = tuple(pids)
            known = self._families.get(task_id)
            if known is None or known[0] != roots or rescan:
                procs = _family(roots, cached)
            else:
                procs = [p for p in known[1] if p.is_running()]  # is_running also catches a reused pid
            families[task_id] = (roots, procs)
            usages.append(_usage(task_id, procs))
        # Tasks that ended drop out here, so no Process objects pile up.
        self._families = families
        return usages


def _family(roots: Sequence[int], cached: Mapping[int, psutil.Process]) -> list[psutil.Process]:
    """Each root and all its descendants, reusing cached Process objects (so cpu_percent works)."""
    found: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            members = [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for proc in members:
            old = cached.get(proc.pid)
            # Process equality compares pid and start time: a reused pid is a new process.
            found.setdefault(proc.pid, old if old is not None and old == proc else proc)
    return list(found.values())


def _usage(task_id: str, procs: Sequence[psutil.Process]) -> TaskUsage:
    """CPU (cores) and RSS summed over ``procs``; processes that just exited are skipped."""
    cpu, rss, pids = 0.0, 0, []
    for proc in procs:
        try:
            with proc.oneshot():
                cpu += proc.cpu_percent(interval=None) / 100.0
                rss += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        pids.append(proc.pid)
    return TaskUsage(task_id=task_id, cpu_util=cpu, rss_bytes=rss, pids=tuple(pids))


def block_device_for(path: str, partitions: Sequence[Any]) -> str | None:
    """The block device name (``nvme0n1p1``, ``dm-0``) holding ``path``, as psutil names disks.

    :param path: any path on the file system.
    :param partitions: ``psutil.disk_partitions(all=True)`` entries (``device``, ``mountpoint``).
    :returns: the name, or None when the file system holding the path is not on a local block device.
    """
    target = os.path.realpath(path)
    best: Any = None
    for part in partitions:
        mount = part.mountpoint
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) >= len(best.mountpoint)):  # a later mount hides an earlier one
            best = part
    if best is None or not best.device.startswith("/dev/"):
        return None  # tmpfs, overlay, NFS: no local block device to count
    # /dev/mapper/vg-root is a link to /dev/dm-0, the name the kernel's I/O counters use.
    return Path(os.path.realpath(best.device)).name


def parse_net_totals(per_nic: Mapping[str, Any]) -> tuple[int, int]:
    """Bytes received and sent over every interface except loopback.

    Loopback is left out because local traffic (the agent to a local coordinator) is not
    network load.
    """
    rx = sum(c.bytes_recv for nic, c in per_nic.items() if nic != "lo")
    tx = sum(c.bytes_sent for nic, c in per_nic.items() if nic != "lo")
    return rx, tx
