"""The log pump: a task's output bounded as it is written, per task and per node, the newest kept."""

from __future__ import annotations

import os
from pathlib import Path

from agent.logpump import LogPump
from agent.taskfs import TaskPaths


def _task(state: Path, task_id: str) -> tuple[TaskPaths, int]:
    """A task's directory and FIFO, and a write end of it (what the task's stdout would be)."""
    paths = TaskPaths.of(state, task_id)
    paths.agent_dir.mkdir(parents=True)
    os.mkfifo(paths.fifo, 0o600)
    return paths, os.open(paths.fifo, os.O_RDWR | os.O_NONBLOCK)


def _on_disk(paths: TaskPaths) -> int:
    return sum(p.stat().st_size for p in (paths.log, paths.log.with_name("output.log.1")) if p.exists())


def _pour(pump: LogPump, task_id: str, fd: int, data: bytes, piece: int = 4096) -> None:
    """Write ``data`` to the FIFO and drain it through the pump, piece by piece (the pump is not started)."""
    for i in range(0, len(data), piece):
        os.write(fd, data[i:i + piece])
        pump._drain(pump._sinks[task_id], once=False)


class TestPerTaskBound:
    def test_never_more_than_the_bound_and_the_newest_kept(self, tmp_path: Path) -> None:
        """300 KiB through a 64 KiB bound: at most 64 KiB on disk at any point, ending with the last line."""
        pump = LogPump(tmp_path / "tasks", max_bytes=64 * 1024)
        paths, fd = _task(tmp_path, "t1")
        pump.attach("t1").result()
        lines = b"".join(b"line %06d\n" % i for i in range(30_000))
        peak = 0
        for i in range(0, len(lines), 8192):
            _pour(pump, "t1", fd, lines[i:i + 8192])
            peak = max(peak, _on_disk(paths))
        assert peak <= 64 * 1024
        assert paths.log.read_bytes().endswith(b"line 029999\n")
        pump.detach("t1").result()
        os.close(fd)

    def test_one_write_larger_than_half_keeps_its_end(self, tmp_path: Path) -> None:
        """A single read larger than half the bound keeps only its newest half."""
        pump = LogPump(tmp_path / "tasks", max_bytes=1000)
        paths, fd = _task(tmp_path, "t1")
        pump.attach("t1").result()
        sink = pump._sinks["t1"]
        pump._write(sink, b"a" * 5000 + b"END\n")
        assert _on_disk(paths) <= 1000 and paths.log.read_bytes().endswith(b"END\n")
        pump.detach("t1").result()
        os.close(fd)


class TestNodeBound:
    def test_old_copies_and_ended_logs_go_first(self, tmp_path: Path) -> None:
        """With the node's bound reached, an ended task's log is removed before a running task loses anything."""
        ended = TaskPaths.of(tmp_path, "old")
        ended.agent_dir.mkdir(parents=True)
        ended.log.write_bytes(b"o" * 60_000)
        pump = LogPump(tmp_path / "tasks", max_bytes=40_000, node_max_bytes=80_000)
        paths, fd = _task(tmp_path, "t1")
        pump.attach("t1").result()
        _pour(pump, "t1", fd, b"n" * 30_000)
        assert not ended.log.exists()
        assert _on_disk(paths) == 30_000   # nothing of the running task was lost
        assert pump.stats()["bytes_on_disk"] <= 80_000
        pump.detach("t1").result()
        os.close(fd)

    def test_total_stays_within_the_node_bound_with_many_tasks(self, tmp_path: Path) -> None:
        """Five loud tasks under a bound for two: the total on disk never passes it."""
        pump = LogPump(tmp_path / "tasks", max_bytes=20_000, node_max_bytes=40_000)
        tasks = {f"t{i}": _task(tmp_path, f"t{i}") for i in range(5)}
        for tid in tasks:
            pump.attach(tid).result()
        for _ in range(10):
            for tid, (_, fd) in tasks.items():
                _pour(pump, tid, fd, b"z" * 3000)
                total = sum(_on_disk(p) for p, _ in tasks.values())
                assert total <= 40_000
        for tid, (_, fd) in tasks.items():
            pump.detach(tid).result()
            os.close(fd)


class TestLinks:
    def test_a_link_in_place_of_the_log_is_refused(self, tmp_path: Path) -> None:
        """The pump never writes through a link standing for output.log: attaching fails and the target is untouched."""
        target = tmp_path / "target"
        target.write_bytes(b"keep\n")
        paths, fd = _task(tmp_path, "t1")
        paths.log.symlink_to(target)
        pump = LogPump(tmp_path / "tasks", max_bytes=1000)
        fut = pump.attach("t1")
        assert isinstance(fut.exception(), OSError)
        assert target.read_bytes() == b"keep\n"
        os.close(fd)


class TestUnpipedTasks:
    def test_a_task_from_before_the_pump_is_bounded_and_its_links_not_followed(self, tmp_path: Path) -> None:
        """A task writing its log itself (started by an older agent) has it emptied past the bound; a link in
        place of such a log is left alone and its target untouched."""
        import time

        plain, linked = TaskPaths.of(tmp_path, "old"), TaskPaths.of(tmp_path, "old-link")
        for p in (plain, linked):
            p.agent_dir.mkdir(parents=True)
        target = tmp_path / "target"
        target.write_bytes(b"t" * 5000)
        linked.log.symlink_to(target)
        pump = LogPump(tmp_path / "tasks", max_bytes=1000)
        pump.start()
        try:
            pump.bound_unpiped("old")
            pump.bound_unpiped("old-link")
            for _ in range(2):   # the second emptying proves a whole pass over both tasks has run
                plain.log.write_bytes(b"p" * 5000)
                deadline = time.monotonic() + 10
                while plain.log.stat().st_size and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert plain.log.stat().st_size == 0
            assert target.read_bytes() == b"t" * 5000
        finally:
            pump.stop()


class TestFailures:
    def test_a_rotation_that_fails_loses_that_output_only(self, tmp_path: Path) -> None:
        """When a task's directory is gone (a rotation cannot make a new file), its output is dropped and
        counted, and another task's output is still written."""
        import shutil

        pump = LogPump(tmp_path / "tasks", max_bytes=2000)
        broken, fd1 = _task(tmp_path, "t1")
        fine, fd2 = _task(tmp_path, "t2")
        pump.attach("t1").result()
        pump.attach("t2").result()
        shutil.rmtree(broken.agent_dir)
        _pour(pump, "t1", fd1, b"a" * 3000, piece=600)
        _pour(pump, "t2", fd2, b"ok\n")
        assert pump.stats()["dropped"] > 0
        assert fine.log.read_bytes() == b"ok\n"
        for tid, fd in (("t1", fd1), ("t2", fd2)):
            pump.detach(tid).result()
            os.close(fd)
