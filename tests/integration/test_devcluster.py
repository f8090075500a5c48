"""``make run`` as a new user meets it: the commands it prints, run against the cluster it starts."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.leftover_tasks import kill_leftover_tasks, leftover_task_pids
from tests.helpers.ports import free_port
from tests.integration.harness import default_sigint, wait_until

BANNER_END = "Ctrl-C stops everything."
DEVCLUSTER = [sys.executable, "-m", "coordinator.devcluster"]


class DevCluster:
    """``python -m coordinator.devcluster`` in a temporary directory, its stdout collected line by line."""

    def __init__(self, cwd: Path) -> None:
        self.state = cwd / ".gptrm"
        self.agent_state = self.state / "agent"
        self.listen = f"127.0.0.1:{free_port()}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPTRM_DEV_LISTEN": self.listen,
               "GPTRM_DEV_METRICS": f"127.0.0.1:{free_port()}", "GPTRM_GPU_BACKEND": "simulated",
               "GPTRM_DEV_WEB": f"127.0.0.1:{free_port()}"}
        self.lines: list[str] = []
        self.proc = subprocess.Popen(DEVCLUSTER, cwd=cwd, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=default_sigint)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def printed_commands(self) -> list[str]:
        """The gptrmctl command lines of the banner, once it is printed."""
        wait_until(lambda: BANNER_END in self.lines or self.proc.poll() is not None, 90, what="the banner")
        assert BANNER_END in self.lines, "\n".join(self.lines[-50:])
        return [line.strip() for line in self.lines if line.strip().split(" ")[0].endswith("gptrmctl")]

    def stop(self) -> None:
        """Ctrl-C, as a user would stop it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def devcluster(tmp_path: Path) -> Iterator[DevCluster]:
    """``make run``'s cluster (embedded etcd, coordinator, one simulated agent), stopped afterwards."""
    dc = DevCluster(tmp_path)
    yield dc
    dc.stop()


def _ctl(argv: list[str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.slow
class TestMakeRunFirstMinutes:
    def test_eight_printed_submits_run_side_by_side(self, devcluster: DevCluster) -> None:
        """The printed submit line, run eight times on the one simulated node, gives eight running tasks at once."""
        commands = devcluster.printed_commands()
        [submit] = [c for c in commands if " submit " in c]
        ctl = [*shlex.split(submit)[:2], "--coordinator", devcluster.listen]   # gptrmctl --insecure
        status = _ctl(ctl, "status")
        assert status.returncode == 0, status.stderr
        node = json.loads(_ctl(ctl, "-o", "json", "nodes").stdout)["nodes"][0]
        assert node["simulated"] and node["host_simulated"]
        assert (node["cpu_cores"], node["mem_total_bytes"]) == (112, 2 << 40)
        ids = []
        for _ in range(8):
            res = _ctl([*ctl, "-o", "json"], *shlex.split(submit)[2:])
            assert res.returncode == 0, res.stderr
            ids.append(json.loads(res.stdout)["task_id"])

        def states() -> list[str]:
            tasks = json.loads(_ctl(ctl, "-o", "json", "tasks").stdout)["tasks"]
            return [t["state"] for t in tasks if t["task_id"] in ids]

        try:
            wait_until(lambda: states() == ["running"] * 8, 60, interval_s=0.5, what="eight running tasks")
            tasks = json.loads(_ctl(ctl, "-o", "json", "tasks").stdout)["tasks"]
            gpus = sorted(i for t in tasks for a in t["allocation"] for i in a["gpu_indices"])
            assert gpus == list(range(8))
        finally:
            for tid in ids:
                _ctl(ctl, "cancel", tid)
        wait_until(lambda: set(states()) == {"cancelled"}, 60, interval_s=0.5, what="all cancelled")


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_ctrl_c_stops_the_tasks_too(devcluster: DevCluster) -> None:
    """Ctrl-C stops the agent, the coordinator and what the agent's tasks left running, and says so."""
    commands = devcluster.printed_commands()
    [submit] = [c for c in commands if " submit " in c]
    ctl = [*shlex.split(submit)[:2], "--coordinator", devcluster.listen]   # gptrmctl --insecure
    res = _ctl([*ctl, "-o", "json"], "submit", "--name", "long", "--", "sleep", "300")
    assert res.returncode == 0, res.stderr
    task_id = json.loads(res.stdout)["task_id"]

    def sleeping() -> list[int]:
        prefix = str(devcluster.agent_state) + os.sep
        return [pid for pid in leftover_task_pids(prefix)
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"300"]]

    pids = wait_until(sleeping, 60, interval_s=0.5, what=f"task {task_id}'s sleep 300 to run")
    devcluster.stop()
    assert devcluster.proc.returncode == 0, "\n".join(devcluster.lines[-50:])
    left = [pid for pid in pids if not _gone(pid)]
    assert not left, f"task {task_id}'s processes {left} outlived the dev cluster"
    assert not leftover_task_pids(str(devcluster.agent_state) + os.sep)
    assert any("task process(es) left by the dev cluster's agents" in line for line in devcluster.lines), \
        "\n".join(devcluster.lines[-50:])


def _run_devcluster(cwd: Path, *args: str, env: dict[str, str] | None = None,
                    timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """The dev cluster run to its end (one that should end by itself); its process group killed if it does not."""
    env = {**os.environ, "GPTRM_DEV_WEB": f"127.0.0.1:{free_port()}", **(env or {})}
    proc = subprocess.Popen([*DEVCLUSTER, *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        kill_leftover_tasks(str(cwd / ".gptrm") + os.sep)
        pytest.fail(f"the dev cluster did not end by itself within {timeout_s} s:\n{out[-2000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _lock_free(state: Path) -> bool:
    """Nobody holds the dev cluster's lock on ``state``."""
    import fcntl

    with (state / "devcluster.lock").open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
    return True


def test_help_parses_and_starts_nothing(tmp_path: Path) -> None:
    """``--help`` prints the options and exits 0: no state directory, no process."""
    res = _run_devcluster(tmp_path, "--help", timeout_s=30)
    assert res.returncode == 0, res.stderr
    assert "--state-dir" in res.stdout and "--listen" in res.stdout
    assert not (tmp_path / ".gptrm").exists()


def test_an_address_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """The coordinator's address held by another process: refused at once naming it, nothing started."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        res = _run_devcluster(tmp_path, "--listen", address, "--gpu-backend", "simulated", timeout_s=30)
    assert res.returncode == 1 and f"{address} is in use" in res.stderr, res.stderr
    assert not (tmp_path / ".gptrm" / "coordinator").exists()
    assert _lock_free(tmp_path / ".gptrm")


@pytest.mark.slow
def test_a_second_cluster_on_the_same_state_is_refused(devcluster: DevCluster, tmp_path: Path) -> None:
    """A second dev cluster in the same directory is refused at once, naming the first (pid, address); the
    first's running task is untouched and no process of the second is left."""
    commands = devcluster.printed_commands()
    [submit] = [c for c in commands if " submit " in c]
    ctl = [*shlex.split(submit)[:2], "--coordinator", devcluster.listen]
    res = _ctl([*ctl, "-o", "json"], "submit", "--name", "keep", "--", "sleep", "300")
    assert res.returncode == 0, res.stderr
    task_id = json.loads(res.stdout)["task_id"]

    def state() -> str:
        return json.loads(_ctl([*ctl, "-o", "json"], "tasks", task_id).stdout)["state"]

    wait_until(lambda: state() == "running", 60, interval_s=0.5, what=f"task {task_id} running")
    before = set(leftover_task_pids(str(devcluster.state) + os.sep))
    second = _run_devcluster(tmp_path, "--listen", f"127.0.0.1:{free_port()}", "--metrics-listen",
                             f"127.0.0.1:{free_port()}", "--gpu-backend", "simulated", timeout_s=30)
    assert second.returncode == 1, second.stderr
    assert "another dev cluster already uses the state directory" in second.stderr
    assert f"pid {devcluster.proc.pid}" in second.stderr and devcluster.listen in second.stderr, second.stderr
    assert state() == "running"
    assert set(leftover_task_pids(str(devcluster.state) + os.sep)) == before
    _ctl(ctl, "cancel", task_id)


@pytest.mark.slow
def test_banner_last_and_ctrl_c_then_sigterm_exit_0(devcluster: DevCluster) -> None:
    """The banner is the last thing printed (the logs go to files), and a Ctrl-C followed by the SIGTERM
    make sends ends with 0; the agent, the coordinator and etcd are gone and the lock is free."""
    devcluster.printed_commands()
    assert devcluster.lines[-1] == BANNER_END
    assert not [line for line in devcluster.lines if line.startswith("{")], "log lines on the terminal"
    assert (devcluster.state / "logs" / "coordinator.log").stat().st_size > 0
    devcluster.proc.send_signal(signal.SIGINT)
    devcluster.proc.send_signal(signal.SIGTERM)
    devcluster.proc.send_signal(signal.SIGINT)
    assert devcluster.proc.wait(timeout=60) == 0, "\n".join(devcluster.lines[-20:])
    assert not leftover_task_pids(str(devcluster.state) + os.sep)
    assert _lock_free(devcluster.state)


@pytest.mark.slow
def test_a_part_failing_to_start_stops_the_rest(tmp_path: Path) -> None:
    """The agent cannot start (its state directory is a file): the dev cluster says so with the agent's log,
    exits 1, and leaves no coordinator, etcd or agent behind."""
    (tmp_path / ".gptrm").mkdir()
    (tmp_path / ".gptrm" / "agent").write_text("not a directory")
    res = _run_devcluster(tmp_path, "--listen", f"127.0.0.1:{free_port()}", "--metrics-listen",
                          f"127.0.0.1:{free_port()}", "--gpu-backend", "simulated", timeout_s=90)
    assert res.returncode == 1, res.stderr
    assert "the agent exited with code" in res.stderr and "agent.log" in res.stderr, res.stderr
    assert not leftover_task_pids(str(tmp_path / ".gptrm") + os.sep)
    assert _lock_free(tmp_path / ".gptrm")
