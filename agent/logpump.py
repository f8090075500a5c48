"""Task output written to disk by the agent, bounded as it is written.

A task's stdout and stderr are one FIFO in the agent's own directory (``tasks/<id>/output.fifo``,
see :mod:`agent.taskfs`); the task cannot reach the log files at all. One thread, the pump,
drains every running task's FIFO and appends what it reads to that task's ``output.log``:

- **per task**: ``output.log`` is renamed to ``output.log.1`` (replacing the older copy) before a
  write would take it past half of ``max_bytes``, so the two files never hold more than
  ``max_bytes`` together, the newest output always kept; a single write larger than half keeps
  only its last half.
- **per node**: before a write would take all task logs under ``tasks/`` past ``node_max_bytes``,
  the logs of tasks that have ended go first (oldest first), then the rotated copies of running
  tasks (oldest first), then the live logs of other running tasks (largest first, emptied). A
  task can never fill the disk.
- **back-pressure, not loss**: the task's root wrapper and the pump both hold the FIFO open for
  reading and writing, so a task never gets SIGPIPE and never sees end of file; while the agent
  is down the FIFO fills (1 MiB) and the task's writes wait until a restarted agent drains it.

Writes and renames are done by file descriptor with ``O_NOFOLLOW``, in a directory that only
root can write.

A task started by an agent from before this layout (its output written straight into
``output.log`` in a directory the task owns) is bounded too, until it ends: about once a second
its log is opened without following a link, relative to its directory opened the same way, and
emptied once it is past ``max_bytes``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import stat
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from agent.taskfs import TaskPaths, open_nofollow
from common.logging import get_logger

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_NODE_MAX_BYTES", "LogPump"]

DEFAULT_MAX_BYTES = 32 * 1024 * 1024
DEFAULT_NODE_MAX_BYTES = 4096 * 1024 * 1024
_READ = 1024 * 1024          # per FIFO per turn, so one loud task cannot starve the others
_PIPE_BYTES = 1024 * 1024
_FINAL_READS = 64            # a detach drains at most this many reads (the FIFO holds one)


@dataclass
class _Sink:
    """One running task's FIFO and live log."""

    task_id: str
    dir_path: Path
    fifo_fd: int
    log_fd: int
    live: int                 # bytes in output.log
    written: int = 0          # bytes appended since attached
    dropped: int = 0          # bytes a full disk refused


@dataclass
class _Usage:
    """Sizes and ages of every task log file under ``tasks/`` (the node-wide bound)."""

    files: dict[Path, tuple[int, float]] = field(default_factory=dict)   # path → (bytes, last write time)
    total: int = 0

    def set(self, path: Path, size: int, when: float) -> None:
        old = self.files.get(path, (0, 0.0))[0]
        self.files[path] = (size, when)
        self.total += size - old

    def drop(self, path: Path) -> None:
        size, _ = self.files.pop(path, (0, 0.0))
        self.total -= size


class LogPump:
    """Drains the running tasks' FIFOs into their bounded logs, on a thread of its own.

    :param tasks_dir: the agent's ``<state_dir>/tasks``.
    :param max_bytes: the most one task's ``output.log`` and ``output.log.1`` hold together.
    :param node_max_bytes: the most all task logs under ``tasks_dir`` hold together.
    """

    def __init__(self, tasks_dir: Path, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 node_max_bytes: int = DEFAULT_NODE_MAX_BYTES) -> None:
        self.tasks_dir = Path(tasks_dir)
        self.max_bytes = max(2, max_bytes)
        self.node_max_bytes = max(self.max_bytes, node_max_bytes)
        self._sinks: dict[str, _Sink] = {}
        self._usage = _Usage()
        self._lock = threading.Lock()
        self._requests: list[tuple[str, str, Future[None]]] = []
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._legacy: set[str] = set()
        self._log = get_logger("agent").bind(component="logs")
        self._scan()

    # ---- the caller's side ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="log-pump", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Drain what is waiting, close everything and end the thread (tasks keep running)."""
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(10)
        for sink in list(self._sinks.values()):
            self._close(sink)
        self._sel.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def attach(self, task_id: str) -> Future[None]:
        """Start draining a task's FIFO (a new task, or one adopted after a restart)."""
        return self._request("attach", task_id)

    def detach(self, task_id: str) -> Future[None]:
        """Drain what the task's FIFO still holds, then stop following it (the task has ended)."""
        return self._request("detach", task_id)

    def bound_unpiped(self, task_id: str, running: bool = True) -> None:
        """Bound the log of a task whose output does not come through the pump (see the module docstring)."""
        with self._lock:
            (self._legacy.add if running else self._legacy.discard)(task_id)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"tasks": len(self._sinks), "bytes_on_disk": self._usage.total,
                    "dropped": sum(s.dropped for s in self._sinks.values())}

    def _request(self, what: str, task_id: str) -> Future[None]:
        fut: Future[None] = Future()
        with self._lock:
            self._requests.append((what, task_id, fut))
        if self._thread is None or not self._thread.is_alive():
            self._serve_requests()   # not started (tests, shutdown): done on the caller's thread
        else:
            self._wake()
        return fut

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    # ---- the pump's thread --------------------------------------------------------------------

    def _run(self) -> None:
        next_legacy = 0.0
        while not self._stop.is_set():
            try:
                next_legacy = self._turn(next_legacy)
            except Exception:
                # One task's bad turn must not stop every task's output: log it and go on.
                self._log.exception("log_pump_turn_failed")
        for sink in list(self._sinks.values()):
            self._drain(sink, once=False)

    def _turn(self, next_legacy: float) -> float:
        """One wait for output and what it brings; returns when the old-layout logs are next bounded."""
        for key, _ in self._sel.select(timeout=1.0):
            if key.data is None:
                with contextlib.suppress(BlockingIOError, OSError):
                    os.read(self._wake_r, 4096)
                continue
            sink = key.data
            if sink.task_id in self._sinks:
                self._drain(sink, once=True)
        self._serve_requests()
        if self._legacy and time.monotonic() >= next_legacy:
            self._bound_legacy()
            next_legacy = time.monotonic() + 1.0
        return next_legacy

    def _serve_requests(self) -> None:
        with self._lock:
            requests, self._requests = self._requests, []
        for what, task_id, fut in requests:
            try:
                if what == "attach":
                    self._attach(task_id)
                else:
                    sink = self._sinks.get(task_id)
                    if sink is not None:
                        self._drain(sink, once=False)
                        self._close(sink)
            except OSError as e:
                self._log.warning("task_log_unavailable", task_id=task_id, reason=str(e))
                fut.set_exception(e)
                continue
            fut.set_result(None)

    def _attach(self, task_id: str) -> None:
        if task_id in self._sinks:
            return
        paths = TaskPaths.of(self.tasks_dir.parent, task_id)
        fifo_fd = open_nofollow(paths.fifo, os.O_RDWR, kind=stat.S_IFIFO)
        try:
            with contextlib.suppress(OSError):
                fcntl.fcntl(fifo_fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
            log_fd = open_nofollow(paths.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except BaseException:
            os.close(fifo_fd)
            raise
        sink = _Sink(task_id, paths.agent_dir, fifo_fd, log_fd, os.fstat(log_fd).st_size)
        with self._lock:
            self._sinks[task_id] = sink
            self._usage.set(paths.log, sink.live, time.time())
        self._sel.register(fifo_fd, selectors.EVENT_READ, sink)

    def _close(self, sink: _Sink) -> None:
        with self._lock:
            self._sinks.pop(sink.task_id, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(sink.fifo_fd)
        for fd in (sink.fifo_fd, sink.log_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _drain(self, sink: _Sink, *, once: bool) -> None:
        """Read what the FIFO holds (one read when ``once``; else until it is empty, at most
        :data:`_FINAL_READS` reads, so a writer that never stops cannot hold the pump)."""
        for _ in range(1 if once else _FINAL_READS):
            try:
                data = os.read(sink.fifo_fd, _READ)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._log.warning("task_log_read_failed", task_id=sink.task_id, reason=str(e))
                return
            if not data:
                return
            try:
                self._write(sink, data)
            except OSError as e:   # a rotation that could not make a new file: this output is lost, not the pump
                sink.dropped += len(data)
                self._log.warning("task_log_write_failed", task_id=sink.task_id, dropped_bytes=len(data),
                                  reason=str(e))

    def _write(self, sink: _Sink, data: bytes) -> None:
        half = self.max_bytes // 2
        if len(data) > half:
            data = data[-half:]
        if sink.live + len(data) > half:
            self._rotate(sink)
        self._make_room(sink, len(data))
        try:
            os.write(sink.log_fd, data)
        except OSError as e:
            sink.dropped += len(data)
            self._log.warning("task_log_write_failed", task_id=sink.task_id, dropped_bytes=len(data), reason=str(e))
            return
        sink.live += len(data)
        sink.written += len(data)
        with self._lock:
            self._usage.set(sink.dir_path / "output.log", sink.live, time.time())

    def _rotate(self, sink: _Sink) -> None:
        live, rotated = sink.dir_path / "output.log", sink.dir_path / "output.log.1"
        os.rename(live, rotated)   # never follows a link; replaces the older copy
        new_fd = open_nofollow(live, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.close(sink.log_fd)
        sink.log_fd = new_fd
        now = time.time()
        with self._lock:
            self._usage.set(rotated, sink.live, now)
            self._usage.set(live, 0, now)
        sink.live = 0

    def _make_room(self, sink: _Sink, n: int) -> None:
        """Free node-wide space for ``n`` bytes of ``sink``'s output (see the module docstring)."""
        with self._lock:
            if self._usage.total + n <= self.node_max_bytes:
                return
            running = {s.dir_path / "output.log": s for s in self._sinks.values()}
            running_dirs = {s.dir_path for s in self._sinks.values()}
            own = sink.dir_path / "output.log"

            def order(item: tuple[Path, tuple[int, float]]) -> tuple[int, float]:
                path, (size, when) = item
                if path.parent not in running_dirs:
                    return 0, when                  # ended tasks' logs, oldest first
                if path.name != "output.log":
                    return 1, when                  # running tasks' rotated copies, oldest first
                return 2, -float(size)              # other running tasks' live logs, largest first
            candidates = sorted(((p, v) for p, v in self._usage.files.items() if p != own and v[0] > 0), key=order)
        for path, (size, _) in candidates:
            with self._lock:
                if self._usage.total + n <= self.node_max_bytes:
                    return
            other = running.get(path)
            try:
                if other is not None:
                    os.ftruncate(other.log_fd, 0)
                    other.live = 0
                    with self._lock:
                        self._usage.set(path, 0, time.time())
                else:
                    os.unlink(path)
                    with self._lock:
                        self._usage.drop(path)
            except OSError:
                continue
            self._log.warning("task_log_evicted", path=str(path), bytes=size, reason="node task-log space full")

    def _bound_legacy(self) -> None:
        with self._lock:
            task_ids = list(self._legacy)
        for task_id in task_ids:
            try:
                dir_fd = os.open(self.tasks_dir / task_id, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                fd = os.open("output.log", os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
                try:
                    st = os.fstat(fd)
                    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_size > self.max_bytes:
                        os.ftruncate(fd, 0)
                        self._log.info("task_log_truncated", task_id=task_id, bytes=st.st_size,
                                       reason="started before logs went through the agent")
                finally:
                    os.close(fd)
            except OSError:
                continue
            finally:
                os.close(dir_fd)

    def _scan(self) -> None:
        """Sizes of the logs already on disk (an agent restart; ended tasks' logs count too)."""
        try:
            dirs = list(os.scandir(self.tasks_dir))
        except OSError:
            return
        for d in dirs:
            for name in ("output.log", "output.log.1"):
                path = Path(d.path) / name
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    self._usage.set(path, st.st_size, st.st_mtime)
