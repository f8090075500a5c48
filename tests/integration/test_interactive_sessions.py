"""Interactive sessions end to end (docs/interactive.md): ``run --pty`` driven through a pseudo-terminal, and
``exec`` into rank 1 of a two-node gang, through real coordinators and agents."""

from __future__ import annotations

import os
import pty
import subprocess
import threading

from tests.integration.harness import BIN, Cluster, wait_until
from tests.integration.test_gang import _COORD, _GANG, _two_nodes

# What a task and a command exec'd into it print of their context: PID namespace, cgroups, uid.
_CONTEXT = "readlink /proc/self/ns/pid; cat /proc/self/cgroup; id -u"


class _Terminal:
    """gptrmctl on a pseudo-terminal of the test's: what it writes, collected; keys typed into it."""

    def __init__(self, argv: list[str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        os.close(slave)
        self.output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:   # EIO: gptrmctl ended and closed the terminal
                return
            if not data:
                return
            self.output += data

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        os.close(self.master)


class TestRunPty:
    def test_a_terminal_runs_echo_and_exit_3_returns_3(self, cluster: Cluster) -> None:
        """`run --gpus 1 --pty -- sh` on a terminal: the shell answers `echo`; `attach` shows the terminal and
        leaves the task running when it ends; `exit 3` ends the task (failed, exit code 3) and gptrmctl with 3."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        wait_until(lambda: cluster.ctl_json("nodes")["nodes"], what="n1 registered")
        term = _Terminal([str(BIN / "gptrmctl"), "--coordinator", cluster.address("c1"), "--insecure", "run",
                          "--gpus", "1", "--cpu", "0.1", "--name", "shell", "--pty", "--", "sh"])
        try:
            # The shell's prompt comes through the session (sent from the agent's ring on attach).
            wait_until(lambda: b"$ " in term.output or b"# " in term.output, timeout_s=60, what="the shell's prompt")
            term.type("echo h''i\r")
            wait_until(lambda: b"\nhi\r\n" in term.output, timeout_s=30, what="echo's output")
            # attach shows the terminal (its recent output first); ending it leaves the task running.
            (task,) = cluster.ctl_json("tasks", "--name", "shell")["tasks"]
            viewer = _Terminal([str(BIN / "gptrmctl"), "--coordinator", cluster.address("c1"), "--insecure",
                                "attach", task["task_id"]])
            try:
                wait_until(lambda: b"\nhi\r\n" in viewer.output, timeout_s=30, what="attach showing the terminal")
            finally:
                viewer.close()
            assert cluster.task(task["task_id"])["state"] == "running"
            term.type("exit 3\r")
            assert term.proc.wait(timeout=60) == 3, bytes(term.output)
        finally:
            term.close()
            print("terminal:", bytes(term.output))
        (task,) = cluster.ctl_json("tasks", "--name", "shell")["tasks"]
        assert task["state"] == "failed" and task["exit_code"] == 3 and task["spec"]["pty"]


class TestExec:
    def test_exec_reaches_rank_1_of_a_gang_in_its_context(self, cluster: Cluster) -> None:
        """`exec TASK --rank 1 -- CMD` runs CMD on rank 1's node in that part's PID namespace, cgroups and uid, with
        its environment, and gptrmctl exits with CMD's exit code."""
        cluster.start_coordinator("c1", *_COORD)
        cluster.wait_leader("c1")
        _two_nodes(cluster)
        tid = cluster.submit(*_GANG, "--", "sh", "-c", f"{_CONTEXT}; exec sleep 600")
        wait_until(lambda: len(cluster.ctl("logs", tid, "--rank", "1").stdout.splitlines()) >= 3, timeout_s=60,
                   what="rank 1 running and printing its context")
        task_context = cluster.ctl("logs", tid, "--rank", "1").stdout
        res = cluster.ctl("exec", tid, "--rank", "1", "--", "sh", "-c", f"{_CONTEXT}; echo rank=$NODE_RANK; exit 5")
        assert res.returncode == 5, res.stderr
        assert res.stdout == task_context + "rank=1\n"
        assert int(task_context.splitlines()[-1]) != 0   # the task's own uid, not root
        res = cluster.ctl("exec", tid, "--rank", "2", "--", "true")
        assert res.returncode == 1 and "rank 2" in res.stderr
        cluster.ctl("cancel", tid)
