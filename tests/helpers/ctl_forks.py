"""``gptrmctl`` commands for the integration tests, each a real process forked from one that has imported it already.

A test polls through gptrmctl hundreds of times (``tasks``, ``nodes``, ``events``...). Started afresh, each run pays
the interpreter's start and gptrmctl's imports (grpc, cryptography, the protobuf modules) — most of the suite's CPU
time on a small machine. Here one server process per test process imports gptrmctl once and forks a child per
command: the child is a separate process with its own stdin (``/dev/null``), stdout and stderr (files the caller
reads), environment (the caller's at the time of the call) and exit code, and runs the console script's own entry
point (:func:`coordinator.scripts.ctl_main`), so what a test sees is what ``gptrmctl`` prints and returns.

The server never opens a gRPC channel (only its children do, after the fork), so no channel or gRPC thread is ever
copied into a child.

Run as ``python -m tests.helpers.ctl_forks``: it reads one JSON request per line on stdin
(``{"argv": [...], "env": {...}, "cwd": path, "out": path, "err": path}``) and answers ``pid N`` once the child is
started, then ``rc N`` (the child's exit code, negative for a signal) once it has ended.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]


def _child(request: dict, reply: int) -> None:
    """In the forked child: become ``gptrmctl ARGV`` with the request's streams and environment, and exit."""
    rc = 1
    try:
        os.close(reply)
        devnull = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["out"], os.O_WRONLY | os.O_TRUNC)
        err = os.open(request["err"], os.O_WRONLY | os.O_TRUNC)
        for fd, target in ((devnull, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["gptrmctl", *request["argv"]]
        from coordinator.scripts import ctl_main

        rc = ctl_main(request["argv"])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(rc & 0xFF)


def serve() -> None:
    """The server's loop: one request at a time, each run in a forked child (see the module's docstring)."""
    import coordinator.ctl.main  # noqa: F401  (what every child would otherwise import again)

    requests, reply = os.dup(0), os.dup(1)
    lines = os.fdopen(requests, "r")
    for line in lines:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            lines.close()
            _child(request, reply)
        os.write(reply, f"pid {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        os.write(reply, f"rc {os.waitstatus_to_exitcode(status)}\n".encode())


def _text(data: bytes) -> str:
    """Bytes as ``subprocess.run(..., text=True)`` decodes a child's output (locale encoding, universal newlines)."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


class CtlForks:
    """The client side: :meth:`run` is ``subprocess.run([gptrmctl, *argv], capture_output=True, text=True)``.

    One command at a time goes through the server; a call made while another thread's is under way runs
    ``gptrmctl`` as a plain subprocess instead.
    """

    def __init__(self, gptrmctl: Path) -> None:
        self._gptrmctl = gptrmctl
        self._lock = threading.Lock()
        self._server: subprocess.Popen | None = None
        self._replies = b""
        self._dir = ""
        atexit.register(self.close)

    def _started(self) -> subprocess.Popen:
        if self._server is None or self._server.poll() is not None:
            self.close()
            self._dir = tempfile.mkdtemp(prefix="gptrmctl-forks-")
            self._server = subprocess.Popen([sys.executable, "-m", "tests.helpers.ctl_forks"], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, cwd=_ROOT)
        return self._server

    def _reply(self, server: subprocess.Popen, deadline: float | None) -> str | None:
        """The server's next reply line, or None at ``deadline`` (``time.monotonic()``) or when it has gone."""
        assert server.stdout is not None
        fd = server.stdout.fileno()
        while b"\n" not in self._replies:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._replies += chunk
        line, self._replies = self._replies.split(b"\n", 1)
        return line.decode()

    def run(self, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess:
        cmd = [str(self._gptrmctl), *argv]
        if not self._lock.acquire(blocking=False):
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        try:
            return self._run_forked(cmd, timeout_s)
        except subprocess.TimeoutExpired:
            raise
        except BaseException:
            # Interrupted between a request and its answers (pytest-timeout, Ctrl-C): the server's next replies
            # would answer the wrong command, so it goes (its child ends by gptrmctl's own --timeout).
            if self._server is not None:
                self._server.kill()
            self.close()
            raise
        finally:
            self._lock.release()

    def _run_forked(self, cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess:
        server = self._started()
        out, err = Path(self._dir) / "out", Path(self._dir) / "err"
        out.write_bytes(b"")
        err.write_bytes(b"")
        assert server.stdin is not None
        request = {"argv": cmd[1:], "env": dict(os.environ), "cwd": os.getcwd(), "out": str(out), "err": str(err)}
        server.stdin.write((json.dumps(request) + "\n").encode())
        server.stdin.flush()
        deadline = time.monotonic() + timeout_s
        started = self._reply(server, deadline)
        if started is None or not started.startswith("pid "):
            self.close()
            raise RuntimeError(f"the gptrmctl fork server did not start {cmd[1:]}: {started!r}")
        pid = int(started.split()[1])
        ended = self._reply(server, deadline)
        if ended is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._reply(server, None)
            raise subprocess.TimeoutExpired(cmd, timeout_s, _text(out.read_bytes()), _text(err.read_bytes()))
        return subprocess.CompletedProcess(cmd, int(ended.split()[1]), _text(out.read_bytes()),
                                           _text(err.read_bytes()))

    def close(self) -> None:
        """Stop the server (a later :meth:`run` starts another)."""
        server, self._server = self._server, None
        self._replies = b""
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        if server is not None:
            assert server.stdin is not None
            server.stdin.close()
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            if server.stdout is not None:
                server.stdout.close()


if __name__ == "__main__":
    serve()
