"""Host collector: pure helpers with literal inputs, collect() on this machine through psutil."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.collectors.host import HostCollector, block_device_for, parse_net_totals


def part(device: str, mountpoint: str) -> SimpleNamespace:
    """A ``psutil.disk_partitions()`` entry."""
    return SimpleNamespace(device=device, mountpoint=mountpoint)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A sleeping child of the test process, killed afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


class TestBlockDeviceFor:
    """Mapping a data path to the block device whose I/O counters psutil reports."""

    PARTITIONS = (
        part("/dev/nvme0n1p2", "/"),
        part("/dev/nvme1n1", "/data"),
        part("/dev/sdb1", "/data/scratch"),
        part("tmpfs", "/run"),
    )

    @pytest.mark.parametrize(
        ("path", "expected"),
        [
            ("/data/models", "nvme1n1"),
            ("/data/scratch/x", "sdb1"),  # the longest mount point wins over /data
            ("/database", "nvme0n1p2"),  # /data is not a prefix of /database
            ("/etc", "nvme0n1p2"),
            ("/run/user", None),  # tmpfs has no block device: the totals are used
        ],
    )
    def test_longest_mount_wins(self, path: str, expected: str | None) -> None:
        """The deepest block-device mount containing the path is chosen."""
        assert block_device_for(path, self.PARTITIONS) == expected

    def test_no_mount(self) -> None:
        """A path under no known mount maps to None."""
        assert block_device_for("/srv/x", [part("tmpfs", "/run")]) is None


class TestParseNetTotals:
    """Summing interface counters."""

    def test_loopback_excluded(self) -> None:
        """Bytes on every interface but ``lo`` are summed."""
        nics = {
            "lo": SimpleNamespace(bytes_recv=1000, bytes_sent=1000),
            "eth0": SimpleNamespace(bytes_recv=10, bytes_sent=20),
            "ib0": SimpleNamespace(bytes_recv=1, bytes_sent=2),
        }
        assert parse_net_totals(nics) == (11, 22)


class TestHostCollector:
    """Reading this machine through psutil."""

    def test_host_reading(self, tmp_path: Path) -> None:
        """One reading with sane CPU, memory and the configured disk."""
        [reading] = HostCollector(data_paths=[str(tmp_path)]).collect()
        assert 0.0 <= reading.cpu_util <= 1.0
        assert 0 < reading.mem_used_bytes <= reading.mem_total_bytes
        assert reading.load1 >= 0.0
        [disk] = reading.disks
        assert disk.path == str(tmp_path)
        assert 0 < disk.used_bytes <= disk.total_bytes
        assert disk.read_bytes_total >= 0
        assert reading.tasks == ()

    def test_missing_path_skipped(self, tmp_path: Path) -> None:
        """A data path that does not exist is left out instead of failing the collector."""
        [reading] = HostCollector(data_paths=[str(tmp_path / "gone")]).collect()
        assert reading.disks == ()

    def test_task_includes_children(self, child: subprocess.Popen[bytes]) -> None:
        """A task's usage counts its root pid and the root's children."""
        host = HostCollector(task_pids=lambda: {"t1": [os.getpid()]})
        [reading] = host.collect()
        [task] = reading.tasks
        assert task.task_id == "t1"
        assert {os.getpid(), child.pid} <= set(task.pids)
        assert task.rss_bytes > 0 and task.cpu_util >= 0.0

    def test_process_cache_follows_tasks(self, child: subprocess.Popen[bytes]) -> None:
        """Process objects are kept between ticks only for processes still in some task."""
        tasks: dict[str, list[int]] = {"t1": [child.pid]}
        host = HostCollector(task_pids=lambda: tasks)
        host.collect()
        assert host.tracked_pids == {child.pid}
        tasks.clear()
        host.collect()
        assert host.tracked_pids == frozenset()

    def test_new_children_found_on_rescan(self) -> None:
        """A child started after the task was first seen is counted from the next rescan on."""
        host = HostCollector(task_pids=lambda: {"t1": [os.getpid()]}, rescan_every=2)
        host.collect()  # tick 1: the task is new, so its family is searched
        late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            [reading] = host.collect()  # tick 2: rescan
            assert late.pid in reading.tasks[0].pids
        finally:
            late.kill()
            late.wait()

    def test_changed_roots_searched_at_once(self, child: subprocess.Popen[bytes]) -> None:
        """When a task's root pids change, its processes are searched again on that tick."""
        tasks: dict[str, list[int]] = {"t1": [os.getpid()]}
        host = HostCollector(task_pids=lambda: tasks, rescan_every=1000)
        host.collect()
        tasks["t1"] = [child.pid]
        [reading] = host.collect()
        assert reading.tasks[0].pids == (child.pid,)

    def test_exited_process_dropped(self, child: subprocess.Popen[bytes]) -> None:
        """A task whose process exited reports zero usage and no pids."""
        host = HostCollector(task_pids=lambda: {"t1": [child.pid]})
        host.collect()
        child.kill()
        child.wait()
        [reading] = host.collect()
        assert reading.tasks[0].pids == () and reading.tasks[0].rss_bytes == 0
        assert host.tracked_pids == frozenset()
