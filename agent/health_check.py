"""The site's health-check program (``--health-check-program``): its verdict rides on every telemetry sample.

A site plugs in its own node checks (LBNL NHC, or any script) the way Slurm runs a ``HealthCheckProgram``:

- the program runs as the agent's user (root in production) with the fixed root environment
  (:func:`agent.launch.root_env`: the system ``PATH`` and ``LANG`` only, never a task's environment and never the
  agent's own), in ``/``, with no input, in a process group of its own;
- once right after the agent starts, then every ``--health-check-interval`` seconds (from the start of one run
  to the start of the next; a run that overruns the interval is followed at once by the next), never two runs at
  once;
- until the first run ends the verdict is PENDING, which the coordinator reads as "place nothing here yet";
- exit 0 is OK; a non-zero exit, a death by signal, or a run longer than ``--health-check-timeout`` seconds is
  FAILED. The message is the program's last non-empty line of output (stdout and stderr together, at most
  :data:`MESSAGE_MAX_CHARS` characters), so NHC's ``ERROR: nhc: Health check failed: ...`` line is the reason as
  it is; on a timeout the whole process group is killed and the message is ``timed out after 60 s``;
- the output is read as it comes and only its last :data:`OUTPUT_TAIL_BYTES` are kept, whatever the program
  writes.

The program runs as root, so its path is checked when the agent starts and again before every run
(:func:`program_problem`): absolute, a regular executable file, owned by root (or by the agent's own user when the
agent is not root), not writable by group or others, in directories no one else can write to (a sticky directory
such as ``/tmp`` excepted). A program that fails the check later, or cannot be started, is a FAILED verdict that
says why.

Each sample carries the latest verdict in ``TelemetrySample.health_check`` (:meth:`HealthCheck.fill`); the
coordinator drains the node on FAILED and lifts that drain on a later OK (never an admin's drain).

Example::

    check = HealthCheck("/usr/sbin/nhc", interval_s=300, timeout_s=60, log=log)
    check.start()            # first run now, in a thread of its own
    check.fill(sample)       # sample.health_check: PENDING until the first run ends
    check.stop()             # kills a run in progress
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from agent.launch import root_env
from common.pb.gptrm.v1 import types_pb2

__all__ = ["DEFAULT_INTERVAL_S", "DEFAULT_TIMEOUT_S", "MESSAGE_MAX_CHARS", "OUTPUT_TAIL_BYTES", "HealthCheck",
           "RunResult", "last_line", "program_problem", "run_program"]

Log = structlog.typing.FilteringBoundLogger

DEFAULT_INTERVAL_S = 300.0
"""Seconds from one run's start to the next (Slurm's ``HealthCheckInterval`` is often set to this)."""
DEFAULT_TIMEOUT_S = 60.0
"""Seconds a run may take before its process group is killed and the verdict is FAILED."""
MESSAGE_MAX_CHARS = 256
"""Longest message kept (the program's last line, cut with ``…``)."""
OUTPUT_TAIL_BYTES = 16384
"""Bytes of the program's output kept (the newest): enough for its last line, bounded whatever it writes."""
TIMED_OUT = -1
"""``NodeHealthCheck.exit_code`` of a run killed at its timeout."""
CANNOT_RUN = 126
"""``NodeHealthCheck.exit_code`` when the program failed the path check or could not be started (the shell's
"found but cannot execute")."""

_READ_CHUNK = 65536
_DRAIN_CHUNKS = 16
_POLL_S = 0.5
_STATE = types_pb2.HealthCheckState


def program_problem(path: str) -> str | None:
    """Why ``path`` cannot be the health-check program, which runs as root (None when it can; "" is "off").

    Absolute, an existing regular file with an execute bit, owned by root (or by the agent's own user), writable by
    its owner only, and every directory above it (of the resolved path) owned likewise and not writable by others
    unless sticky.
    """
    if not path:
        return None
    if not os.path.isabs(path):
        return "must be an absolute path"
    euid = os.geteuid()
    owners = {0, euid}
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if not st.st_mode & 0o111:
        return "is not executable"
    if st.st_uid not in owners:
        return f"must be owned by root (it runs as root), is owned by uid {st.st_uid}"
    if st.st_mode & 0o022:
        return f"must not be writable by group or others (it runs as root), mode is {stat.S_IMODE(st.st_mode):04o}"
    for parent in Path(os.path.realpath(path)).parents:
        try:
            dst = os.stat(parent)
        except OSError as e:
            return f"directory {parent} cannot be read ({e.strerror})"
        if dst.st_uid not in owners:
            return f"directory {parent} must be owned by root (the program runs as root), is owned by uid {dst.st_uid}"
        if dst.st_mode & 0o022 and not dst.st_mode & stat.S_ISVTX:
            return (f"directory {parent} must not be writable by group or others (the program runs as root), "
                    f"mode is {stat.S_IMODE(dst.st_mode):04o}")
    return None


def last_line(output: bytes, limit: int = MESSAGE_MAX_CHARS) -> str:
    """The last non-empty line of ``output`` (UTF-8, invalid bytes replaced), stripped and cut to ``limit``."""
    for line in reversed(output.decode("utf-8", errors="replace").splitlines()):
        text = line.strip()
        if text:
            return text if len(text) <= limit else text[: limit - 1] + "…"
    return ""


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run of the program."""

    exit_code: int
    """Its exit status; 128 + N when signal N ended it; :data:`TIMED_OUT`; :data:`CANNOT_RUN`."""
    output_tail: bytes
    """The last :data:`OUTPUT_TAIL_BYTES` of what it wrote."""
    error: str = ""
    """Why it did not run or did not finish (a timeout, a start failure), "" otherwise."""


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the run's whole process group (the program is its leader and not yet reaped, so its id is ours)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_program(program: str, timeout_s: float, *, stop: threading.Event | None = None) -> RunResult:
    """Run ``program`` once as described in the module docstring and return how it ended.

    :param stop: when set during the run, the run is killed and reported as stopped (``error`` says so).
    """
    try:
        proc = subprocess.Popen([program], env=root_env(), cwd="/", stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True)
    except OSError as e:
        return RunResult(CANNOT_RUN, b"", f"cannot run {program}: {e.strerror}")
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    tail = bytearray()
    deadline = time.monotonic() + timeout_s
    error = ""

    def drain() -> bool:
        """Read what is there now (at most :data:`_DRAIN_CHUNKS` reads, so a program that writes without pause
        cannot hold the loop past its deadline); True at end of file."""
        for _ in range(_DRAIN_CHUNKS):
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                return False
            if not chunk:
                return True
            tail.extend(chunk)
            del tail[:-OUTPUT_TAIL_BYTES]
        return False

    try:
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            eof = False
            while True:
                if stop is not None and stop.is_set():
                    error = "stopped"
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    error = f"timed out after {timeout_s:g} s"
                    break
                if eof:
                    # Its output is closed: only its exit is left to wait for.
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(min(remaining, _POLL_S))
                elif sel.select(min(remaining, _POLL_S)):
                    eof = drain()
                    if eof:
                        sel.unregister(fd)
                if proc.poll() is not None:
                    # It has exited: what it wrote before is in the pipe now. A child it left behind may hold the
                    # pipe open; its output is not the program's, so reading stops here.
                    drain()
                    break
    finally:
        if proc.returncode is None:   # timed out, stopped, or interrupted: not reaped yet, so its group id is ours
            _kill_group(proc)
        code = proc.wait()
        proc.stdout.close()
    if error:
        return RunResult(TIMED_OUT, bytes(tail), error)
    return RunResult(128 - code if code < 0 else code, bytes(tail))


class HealthCheck:
    """Runs the program on its schedule in a thread of its own and keeps the latest verdict.

    :param program: an absolute path that passed :func:`program_problem`.
    :param interval_s: seconds from one run's start to the next. :param timeout_s: seconds a run may take.
    :param now: wall clock for ``ran_unix_s``.
    """

    def __init__(self, program: str, *, interval_s: float = DEFAULT_INTERVAL_S, timeout_s: float = DEFAULT_TIMEOUT_S,
                 log: Log, now: Callable[[], float] = time.time) -> None:
        self._program = program
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._log = log.bind(program=program)
        self._now = now
        self._run_lock = threading.Lock()     # one run at a time, whoever asks
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Replaced whole (never changed) after each run, so a reader in another thread copies one verdict.
        self._verdict = types_pb2.NodeHealthCheck(state=_STATE.HEALTH_CHECK_STATE_PENDING)

    @property
    def verdict(self) -> types_pb2.NodeHealthCheck:
        """The latest verdict (PENDING before the first run ended); the caller must not change it."""
        return self._verdict

    def fill(self, sample: types_pb2.TelemetrySample) -> None:
        """Set ``sample.health_check`` to the latest verdict (from any thread)."""
        sample.health_check.CopyFrom(self._verdict)

    def run_once(self) -> types_pb2.NodeHealthCheck:
        """Run the program now (after a run in progress, never beside it) and return its verdict.

        A run cut short by :meth:`stop` leaves the previous verdict in place.
        """
        with self._run_lock:
            if self._stop.is_set():
                return self._verdict
            start = time.monotonic()
            problem = program_problem(self._program)
            if problem:
                result = RunResult(CANNOT_RUN, b"", f"{self._program} {problem}")
            else:
                result = run_program(self._program, self._timeout_s, stop=self._stop)
            if result.error == "stopped":
                return self._verdict
            ok = result.exit_code == 0 and not result.error
            message = result.error or last_line(result.output_tail) or (
                "" if ok else _exit_text(result.exit_code))
            verdict = types_pb2.NodeHealthCheck(
                state=_STATE.HEALTH_CHECK_STATE_OK if ok else _STATE.HEALTH_CHECK_STATE_FAILED,
                message=message[:MESSAGE_MAX_CHARS], ran_unix_s=self._now(), exit_code=result.exit_code)
            previous = self._verdict.state
            self._verdict = verdict
            fields = {"state": _STATE.Name(verdict.state).removeprefix("HEALTH_CHECK_STATE_").lower(),
                      "exit_code": verdict.exit_code, "message": verdict.message,
                      "duration_s": round(time.monotonic() - start, 3)}
            if not ok:
                self._log.warning("health_check_failed", **fields)
            elif previous != verdict.state:
                self._log.info("health_check_passed", **fields)
            else:
                self._log.debug("health_check_passed", **fields)
            return verdict

    def start(self) -> None:
        """Run the program now, then every interval, in a daemon thread, until :meth:`stop`."""
        self._thread = threading.Thread(target=self._loop, name="health-check", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the schedule; a run in progress is killed (its process group) and leaves no verdict."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                self.run_once()
            except Exception as e:  # the schedule must outlive a bug in one run
                self._log.error("health_check_run_failed", error=f"{type(e).__name__}: {e}")
            self._stop.wait(max(0.0, start + self._interval_s - time.monotonic()))


def _exit_text(code: int) -> str:
    """A failed run's message when it printed nothing."""
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(code - 128).name}"
    return f"exited with code {code}"
