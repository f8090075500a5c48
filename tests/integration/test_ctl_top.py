"""``gptrmctl top`` under a pseudo-terminal against a real cluster, and its one-shot form in a pipe."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time

from tests.integration.harness import BIN, Cluster, default_sigint, wait_until

_ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|[()][0-9A-Za-z]|[=>78])")
_POWER = re.compile(r"(\d+)/700 W")


class PtyProcess:
    """A command whose stdin, stdout and stderr are a pseudo-terminal of 160×50 cells."""

    def __init__(self, argv: list[str]) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env={**env, "TERM": "xterm"},
                                     start_new_session=True, preexec_fn=default_sigint)
        os.close(slave)
        self.output = b""

    def read_for(self, seconds: float) -> None:
        """Collect output for ``seconds`` (or until the process closes the terminal)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([self.master], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the other side closed
                return
            if not chunk:
                return
            self.output += chunk

    def wait_exit(self, timeout_s: float) -> int:
        """Wait for the exit code while reading what it writes: a terminal nobody reads fills up and blocks
        the writer (the live view's last frame and its screen restore would never finish)."""
        end = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < end:
            self.read_for(0.1)
        return self.proc.wait(timeout=1)

    def frames(self) -> list[str]:
        """Each full redraw, with escape sequences removed (rich's screen mode homes the cursor per frame)."""
        text = self.output.decode(errors="replace")
        return [_ANSI.sub("", f) for f in text.split("\x1b[H")[1:] if f.strip()]

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def _start_busy(c: Cluster) -> None:
    c.start_coordinator("c1")
    c.wait_leader("c1")
    c.start_agent("n1")
    # Simulated GPUs follow a task's own load: this one declares it, so its GPU's power moves.
    res = c.ctl("-o", "json", "submit", "--name", "busy", "--gpus", "1", "--cpu", "0.1", "--env",
                "GPTRM_SIM_LOAD=0.9", "--", "sleep", "60")
    assert res.returncode == 0, res.stderr
    tid = json.loads(res.stdout)["task_id"]
    wait_until(lambda: json.loads(c.ctl("-o", "json", "tasks", tid).stdout)["state"] == "running", what="running")


class TestTop:
    def test_live_view_refreshes_and_q_quits(self, cluster: Cluster) -> None:
        """On a terminal: the node and its GPUs are shown, GPU power changes between refreshes, and q exits 0."""
        _start_busy(cluster)
        top = PtyProcess([str(BIN / "gptrmctl"), "--insecure", "--coordinator", cluster.address(), "top",
                          "--interval", "0.4"])
        try:
            powers: set[tuple[str, ...]] = set()
            for _ in range(40):
                top.read_for(0.5)
                frames = top.frames()
                powers = {tuple(_POWER.findall(f)) for f in frames if _POWER.search(f)}
                if len(powers) > 1:
                    break
            # The newest whole frame (the last one read may still be arriving when the reads stop).
            whole = [f for f in top.frames()
                     if all(re.search(rf"^\s+{i}\s+\S+\s+\d+\.\d %", f, re.M) for i in range(4))]
            assert whole, top.frames()[-1]
            frame = whole[-1]
            assert "n1" in frame and "Eq.1 mean util" in frame and "leader c1" in frame
            assert len(powers) > 1, "GPU power never changed between refreshes"
            assert "busy" in frame and "running" in frame
            top.send(b"q")
            assert top.wait_exit(20) == 0
        finally:
            top.close()

    def test_ctrl_c_exits_zero(self, cluster: Cluster) -> None:
        """Ctrl-C (SIGINT) leaves the live view with exit code 0."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        top = PtyProcess([str(BIN / "gptrmctl"), "--insecure", "--coordinator", cluster.address(), "top",
                          "--interval", "0.3"])
        try:
            # The live view is drawing (a frame is on the screen), not still starting up.
            wait_until(lambda: (top.read_for(0.3), "Eq.1" in "".join(top.frames()))[1], 30, what="first frame")
            top.proc.send_signal(signal.SIGINT)
            assert top.wait_exit(20) == 0
        finally:
            top.close()

    def test_snapshot_when_not_a_terminal(self, cluster: Cluster) -> None:
        """With stdout in a pipe, top prints one snapshot (no escape sequences) and exits 0."""
        _start_busy(cluster)
        res = subprocess.run([str(BIN / "gptrmctl"), "--insecure", "--coordinator", cluster.address(), "top"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert "\x1b" not in res.stdout and "n1" in res.stdout and "/700 W" in res.stdout
        assert "queue: 1 unfinished tasks" in res.stdout
