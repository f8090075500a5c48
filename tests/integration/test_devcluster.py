"""``make run`` as a new user meets it: the commands it prints, run against the cluster it starts."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.etcd_embedded import free_port
from common.leftover_tasks import leftover_task_pids
from tests.integration.harness import default_sigint, wait_until

BANNER_END = "Ctrl-C stops everything."


class DevCluster:
    """``python -m coordinator.devcluster`` in a temporary directory, its stdout collected line by line."""

    def __init__(self, cwd: Path) -> None:
        self.agent_state = cwd / ".gptrm" / "agent"
        self.listen = f"127.0.0.1:{free_port()}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPTRM_DEV_LISTEN": self.listen,
               "GPTRM_DEV_METRICS": f"127.0.0.1:{free_port()}", "GPTRM_GPU_BACKEND": "simulated"}
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "coordinator.devcluster"], cwd=cwd, env=env,
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
