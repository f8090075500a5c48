"""Hostile tasks against a real agent running as root: a task touches only what is its own.

Each task here is code the agent did not write and tries what such code may: plant links where
the agent writes or reads, flood its output, read or signal another task, look at the agent's
environment, and escape its process group. The agent's state directory sits under a
world-traversable directory, as ``/var/lib/gptrm/agent`` does in production (pytest's own
temporary directories are 0700 and would hide every path from the task's uid).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent.task_user import CLAIMS_DIR
from agent.taskkill import cgroup_root, memory_capable_root, memory_cgroup_root, memory_limit
from tests.helpers.ports import free_port
from tests.integration.harness import Cluster, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent must be root to run tasks as their own users")

_MIB = 1024 * 1024
_AGENT_FILES = ("output.log", "output.log.1", "output.log.1.tmp", "exit_code", "exit_code.tmp", "environment",
                "output.fifo")


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """An agent state directory whose parents any uid may traverse (like /var/lib/gptrm/agent)."""
    top = Path(tempfile.mkdtemp(prefix="gptrm-hostile-", dir="/var/tmp"))
    top.chmod(0o755)
    try:
        yield top / "agent"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _start(c: Cluster, state: Path, *extra: str) -> None:
    c.start_coordinator("c1")
    c.wait_leader("c1")
    c.start_agent("n1", "--state-dir", str(state), *extra)
    wait_until(lambda: c.ctl_json("nodes")["nodes"], what="node registered")


def _submit(c: Cluster, script: str, *flags: str) -> str:
    return c.ctl_json("submit", "--name", "hostile", "--gpus", "0", "--cpu", "0.1", *flags, "--",
                 "/bin/sh", "-c", script)["task_id"]


def _ended(c: Cluster, task_id: str, timeout_s: float = 90.0) -> dict[str, Any]:
    return wait_until(lambda: (t := c.ctl_json("tasks", task_id))["state"] in ("succeeded", "failed", "cancelled")
                      and t, timeout_s, what=f"{task_id} to end")


def _secret(tmp_path: Path) -> tuple[Path, bytes, int]:
    """A root-only file (0600), its content and its mtime."""
    path = tmp_path / "root-only"
    content = b"ROOT-ONLY-CONTENT " + os.urandom(8).hex().encode() + b"\n"
    path.write_bytes(content)
    path.chmod(0o600)
    return path, content, path.stat().st_mtime_ns


_SHARED_NAMESPACES = ("--task-namespaces", "off")
"""Tasks in the host's IPC namespace and /dev/shm, as where the agent cannot give them their own: what a task
leaves there is the agent's to remove."""


def _lone_uid() -> int:
    """A task uid for a one-uid ``--task-uids`` range, far from the default range other agents use."""
    return 1_950_000_000 + secrets.randbelow(1_000_000)


_IPC = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
key = int(sys.argv[2])
if sys.argv[1] == "write":
    shm = libc.shmget(key, 4096, 0o1600)
    ctypes.memmove(libc.shmat(shm, None, 0), sys.argv[3].encode(), len(sys.argv[3]))
    print("created", shm, libc.semget(key, 1, 0o1600), libc.msgget(key, 0o1600))
else:
    shm = libc.shmget(key, 0, 0)
    print(ctypes.string_at(libc.shmat(shm, None, 0), 64) if shm >= 0 else "SHM-NONE")
    print("SEM-FOUND" if libc.semget(key, 0, 0) >= 0 else "SEM-NONE")
    print("MSG-FOUND" if libc.msgget(key, 0) >= 0 else "MSG-NONE")
"""


def _ipc_script(state_dir: Path) -> Path:
    """A script any task can run: ``write KEY SECRET`` leaves a System V segment (holding SECRET), semaphore
    set and message queue under KEY; ``read KEY`` prints what it finds."""
    path = state_dir.parent / "ipc.py"
    path.write_text(_IPC)
    path.chmod(0o644)
    return path


def _shm_keys() -> set[int]:
    """The keys of the host's System V shared memory segments."""
    rows = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return {int(row.split()[0]) for row in rows if row.split()}


def memory_limits_available() -> bool:
    """Whether a root agent started by these tests can limit its tasks' memory (as the agent decides it)."""
    return os.geteuid() == 0 and memory_capable_root(cgroup_root(), memory_cgroup_root()) is not None


def _processes(marker: str, state_dir: Path | None = None) -> list[psutil.Process]:
    """Processes with ``marker`` as an argument (started in a work directory of ``state_dir``'s agent, when given:
    other agents on the host may run the same commands)."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        if marker in (p.info.get("cmdline") or []) and (
                state_dir is None or (p.info.get("cwd") or "").startswith(f"{state_dir}/work/")):
            found.append(p)
    return found


class TestHostileTasks:
    def test_links_planted_for_every_agent_file_are_never_followed(self, cluster: Cluster, state_dir: Path,
                                                                   tmp_path: Path) -> None:
        """Links to a root 0600 file, planted wherever the task can for every file the agent opens in or near
        its directories: the file is neither read (not in the log, its tail or `logs`) nor changed."""
        secret, content, mtime = _secret(tmp_path)
        _start(cluster, state_dir, "--task-log-max-mib", "1")
        line = "x" * 511
        plant = " ".join(f'ln -sf {secret} "{f}" 2>/dev/null; ln -sf {secret} "$D/{f}" 2>/dev/null;'
                         for f in _AGENT_FILES)
        # 1.5 MiB of output makes the agent rotate; the sleep outlasts a periodic rotation.
        task_id = _submit(cluster, f'D={state_dir}/tasks/$GPTRM_TASK_ID; {plant} '
                          f'i=0; while [ $i -lt 3000 ]; do echo {line}; i=$((i+1)); done; '
                          f'{plant} echo planted; sleep 6')
        task = _ended(cluster, task_id)
        assert task["state"] == "succeeded", task
        assert secret.read_bytes() == content and secret.stat().st_mtime_ns == mtime
        logs = cluster.ctl("logs", task_id)
        assert logs.returncode == 0 and "planted" in logs.stdout
        assert content.decode().strip() not in logs.stdout + task["log_tail"]
        for name in _AGENT_FILES:
            path = state_dir / "tasks" / task_id / name
            assert not path.is_symlink(), f"{name} is a link the task planted"

    def test_a_200_mb_burst_leaves_at_most_the_configured_bytes(self, cluster: Cluster, state_dir: Path) -> None:
        """200 MB written as fast as the task can: the task's logs never hold more than --task-log-max-mib,
        and the newest line is kept."""
        _start(cluster, state_dir, "--task-log-max-mib", "1")
        task_id = _submit(cluster, "head -c 200000000 /dev/zero | tr '\\0' 'x'; echo; echo the-last-line; sleep 6")
        logs = state_dir / "tasks" / task_id
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                total = 0
                for name in ("output.log", "output.log.1", "output.log.1.tmp"):
                    with contextlib.suppress(OSError):
                        total += (logs / name).stat().st_size
                peak[0] = max(peak[0], total)
                done.wait(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            task = _ended(cluster, task_id, timeout_s=180)
        finally:
            done.set()
            sampler.join()
        assert task["state"] == "succeeded", task
        assert peak[0] <= 1 * _MIB, f"{peak[0]} bytes on disk at the peak"
        assert cluster.ctl("logs", task_id, "--tail", "1").stdout == "the-last-line\n"

    def test_tasks_cannot_read_each_others_logs_or_signal_each_other(self, cluster: Cluster,
                                                                     state_dir: Path) -> None:
        """Two tasks run as two uids: the second can neither read the first's log nor signal its process."""
        _start(cluster, state_dir)
        first = _submit(cluster, "echo secret-of-the-first-task; exec sleep 3001")
        try:
            sleeper = wait_until(lambda: _processes("3001", state_dir), what="first task running")[0]
            second = _submit(cluster, f"cat {state_dir}/tasks/{first}/output.log && echo READ-OK || "
                             f"echo READ-DENIED; kill -TERM {sleeper.pid} && echo SIGNAL-OK || echo SIGNAL-DENIED")
            task = _ended(cluster, second)
            out = cluster.ctl("logs", second).stdout
            assert "READ-DENIED" in out and "SIGNAL-DENIED" in out, out
            assert "secret-of-the-first-task" not in out
            assert sleeper.is_running() and sleeper.status() != psutil.STATUS_ZOMBIE
            assert cluster.ctl_json("tasks", first)["state"] == "running"
            assert task["state"] == "succeeded"
            others = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real ==
                      sleeper.uids().real]
            # The sleeper, and the exec stub that is PID 1 of its namespace where the agent gives it one.
            assert sleeper in others and set(others) <= {sleeper, *sleeper.parents()}, \
                "the first task's uid is its own"
        finally:
            cluster.ctl("cancel", first)
        assert _ended(cluster, first)["state"] == "cancelled"

    def test_a_task_sees_nothing_of_the_agents_environment(self, cluster: Cluster, state_dir: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
        """The task's environment holds PATH, HOME, LANG, USER, LOGNAME, its spec's and gptrm's variables only
        (its GPUs, and its rank and peers: NNODES, NODE_RANK, MASTER_ADDR, ...)."""
        monkeypatch.setenv("AGENT_ONLY_TOKEN", "agent-secret-value")
        _start(cluster, state_dir)
        task_id = _submit(cluster, "env", "--env", "FROM_SPEC=yes")
        assert _ended(cluster, task_id)["state"] == "succeeded"
        out = cluster.ctl("logs", task_id).stdout
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        assert "agent-secret-value" not in out
        allowed = {"PATH", "HOME", "LANG", "USER", "LOGNAME", "PWD", "SHLVL", "_", "FROM_SPEC",
                   "CUDA_VISIBLE_DEVICES", "NNODES", "NODE_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "MASTER_ADDR",
                   "MASTER_PORT"}
        assert {k for k in env if not k.startswith("GPTRM_")} <= allowed, env
        assert env["FROM_SPEC"] == "yes" and env["HOME"] == str(state_dir / "work" / task_id)
        assert env["PATH"] != os.environ["PATH"] or "/.venv/" not in env["PATH"]

    def test_a_setsid_child_and_a_double_fork_are_gone_after_cancel(self, cluster: Cluster,
                                                                     state_dir: Path) -> None:
        """Processes that left the task's process group and session are killed when the task is cancelled."""
        _start(cluster, state_dir)
        task_id = _submit(cluster, "setsid sleep 3101 & (setsid sh -c 'sleep 3102 & exit 0' &); exec sleep 3103")
        try:
            wait_until(lambda: all(_processes(m, state_dir) for m in ("3101", "3102", "3103")),
                       what="the task and its two escaped children")
            assert cluster.ctl("cancel", task_id).returncode == 0
            assert _ended(cluster, task_id)["state"] == "cancelled"
            wait_until(lambda: not any(_processes(m, state_dir) for m in ("3101", "3102", "3103")), 20,
                       what="every process of the task gone")
        finally:
            for marker in ("3101", "3102", "3103"):
                for p in _processes(marker, state_dir):
                    with contextlib.suppress(psutil.Error):
                        p.kill()

    def test_a_task_of_its_own_uid_leaves_nothing_for_the_next(self, cluster: Cluster, state_dir: Path) -> None:
        """What a task left in its working directory and in /tmp is gone when it ends."""
        _start(cluster, state_dir)
        tag = hashlib.sha256(os.urandom(8)).hexdigest()[:12]
        task_id = _submit(cluster, f"echo left > left-behind; mkdir /tmp/gptrm-left-{tag}; echo x > "
                          f"/tmp/gptrm-left-{tag}/f; id -u")
        assert _ended(cluster, task_id)["state"] == "succeeded"
        wait_until(lambda: not (state_dir / "work" / task_id).exists(), 20, what="work directory removed")
        wait_until(lambda: not Path(f"/tmp/gptrm-left-{tag}").exists(), 20, what="/tmp entry removed")
        uid = int(cluster.ctl("logs", task_id).stdout.split()[-1])
        assert uid != 0 and uid != 65534

    def test_a_planted_path_never_runs_as_root(self, cluster: Cluster, state_dir: Path) -> None:
        """A task plants fake setpriv, taskset, unshare, sh, cat, rm, mv, ... in a directory of its own; another
        task submitted with that directory first on its PATH runs as its own uid, and no fake ever runs."""
        _start(cluster, state_dir)
        tag = hashlib.sha256(os.urandom(8)).hexdigest()[:12]
        plant_dir = f"/tmp/gptrm-plant-{tag}"
        names = ("setpriv", "taskset", "numactl", "unshare", "mount", "sh", "cat", "rm", "mv", "env", "chroot")
        fake = f'#!/bin/sh\\ntouch {plant_dir}/ran-$(basename $0)-$(id -u)\\nexit 0\\n'
        planter = _submit(cluster, f"mkdir -m 0755 {plant_dir} && for n in {' '.join(names)}; do "
                          f"printf '{fake}' > {plant_dir}/$n && chmod 0755 {plant_dir}/$n; done && chmod 0777 "
                          f"{plant_dir} && echo planted && exec sleep 3301")
        try:
            wait_until(lambda: "planted" in cluster.ctl("logs", planter).stdout, what="the fakes planted")
            victim = cluster.ctl_json("submit", "--name", "path", "--gpus", "0", "--cpu", "0.1", "--env",
                                      f"PATH={plant_dir}:/usr/bin:/bin", "--", "id", "-u")["task_id"]
            task = _ended(cluster, victim)
            assert task["state"] == "succeeded", task
            uid = int(cluster.ctl("logs", victim).stdout.split()[-1])
            assert uid != 0
            assert sorted(os.listdir(plant_dir)) == sorted(names), "a planted program ran during the start"
        finally:
            cluster.ctl("cancel", planter)
            _ended(cluster, planter)

    def test_a_preloaded_library_never_loads_as_root(self, cluster: Cluster, state_dir: Path,
                                                      tmp_path: Path) -> None:
        """LD_PRELOAD (and LD_LIBRARY_PATH) from the spec reach the task's own process only: the library's
        constructor records every uid it ran as, and root is never one."""
        cc = shutil.which("cc") or shutil.which("gcc")
        assert cc, "a C compiler builds the preloaded library"
        proof = Path(tempfile.mkdtemp(prefix="gptrm-preload-", dir="/tmp"))
        try:
            proof.chmod(0o777)
            src, lib = tmp_path / "evil.c", proof / "evil.so"
            src.write_text('#include <stdio.h>\n#include <unistd.h>\n'
                           '__attribute__((constructor)) static void evil(void) {\n'
                           f'  char p[256]; snprintf(p, sizeof p, "{proof}/loaded-%d", (int)getuid());\n'
                           '  FILE *f = fopen(p, "a"); if (f) fclose(f);\n}\n')
            import subprocess
            subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
            lib.chmod(0o755)
            _start(cluster, state_dir)
            task_id = cluster.ctl_json("submit", "--name", "preload", "--gpus", "0", "--cpu", "0.1",
                                       "--env", f"LD_PRELOAD={lib}", "--env", f"LD_LIBRARY_PATH={proof}",
                                       "--", "/bin/sh", "-c", f"ls {proof}; id -u")["task_id"]
            assert _ended(cluster, task_id)["state"] == "succeeded"
            out = cluster.ctl("logs", task_id).stdout.split()
            uid = int(out[-1])
            # Listed by the task itself: what its uid left in /tmp is removed when it ends (root's would stay).
            loaded = sorted(name for name in out if name.startswith("loaded-"))
            assert loaded == [f"loaded-{uid}"], loaded   # the task's own processes only, never root's
            assert not (proof / "loaded-0").exists()
            assert uid != 0
        finally:
            shutil.rmtree(proof, ignore_errors=True)

    def test_a_task_sees_no_other_tasks_processes_or_ipc(self, cluster: Cluster, state_dir: Path) -> None:
        """A task's /proc shows its own processes only (not another task's argv, not the root wrapper's), and
        another task's SysV shared memory is not there to attach."""
        _start(cluster, state_dir)
        first = _submit(cluster, "ipcmk -M 65536 >/dev/null && echo made && exec sh -c 'sleep 3401; :' "
                        "--password=hunter2")
        try:
            wait_until(lambda: "made" in cluster.ctl("logs", first).stdout and _processes("3401"),
                       what="the first task's segment and process")
            second = _submit(cluster, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; echo segments=$(ipcs -m | "
                             "grep -c '^0x')")
            assert _ended(cluster, second)["state"] == "succeeded"
            out = cluster.ctl("logs", second).stdout
            assert "segments=0" in out, out
            assert "hunter2" not in out and "gptrm-task" not in out and "3401" not in out, out
        finally:
            cluster.ctl("cancel", first)
            _ended(cluster, first)

    def test_a_missing_program_says_so_plainly(self, cluster: Cluster, state_dir: Path) -> None:
        """A task whose program is not on its PATH fails with 127 and a log line naming the program, the PATH
        searched and how to change it."""
        _start(cluster, state_dir)
        task_id = cluster.ctl_json("submit", "--name", "nolauncher", "--gpus", "0", "--cpu", "0.1", "--",
                                   "torchrun-not-installed", "--nproc-per-node", "1")["task_id"]
        task = _ended(cluster, task_id)
        assert task["state"] == "failed" and task.get("exit_code") == 127, task
        out = cluster.ctl("logs", task_id).stdout
        assert "torchrun-not-installed: not found on the task's PATH (/usr/local/sbin:" in out, out
        assert "--env PATH=" in out and "--task-path" in out

    def test_a_uid_handed_out_again_finds_no_ipc_of_its_last_task(self, cluster: Cluster, state_dir: Path) -> None:
        """A task in the host's IPC namespace leaves a System V shared memory segment holding a secret, a semaphore
        set and a message queue; the next task, given the same uid (the range holds one), finds none of them."""
        uid = _lone_uid()
        _start(cluster, state_dir, "--task-uids", f"{uid}-{uid}", *_SHARED_NAMESPACES)
        script = _ipc_script(state_dir)
        key, secret = secrets.randbelow(2**30) + 1, f"IPC-SECRET-{secrets.token_hex(6)}"
        first = _submit(cluster, f"/usr/bin/python3 {script} write {key} {secret}")
        assert _ended(cluster, first)["state"] == "succeeded", cluster.ctl("logs", first).stdout
        assert cluster.ctl("logs", first).stdout.startswith("created")
        wait_until(lambda: not (CLAIMS_DIR / str(uid)).exists(), 30, what="the uid given back")
        second = _submit(cluster, f"id -u; /usr/bin/python3 {script} read {key}")
        assert _ended(cluster, second)["state"] == "succeeded"
        out = cluster.ctl("logs", second).stdout
        assert out.split()[0] == str(uid), out
        assert secret not in out and "SHM-NONE" in out and "SEM-NONE" in out and "MSG-NONE" in out, out

    def test_files_a_task_left_in_world_writable_directories_are_gone(self, cluster: Cluster,
                                                                        state_dir: Path) -> None:
        """A 0600 file in /run/lock, a POSIX shared memory file and a directory in /dev/shm, and a file inside a
        root-owned sticky directory of /tmp are removed when the task ends; the root-owned directory stays."""
        _start(cluster, state_dir)
        tag = secrets.token_hex(6)
        shared = Path(f"/tmp/gptrm-shared-{tag}")
        shared.mkdir(mode=0o1777)
        shared.chmod(0o1777)
        left = [Path(f"/run/lock/gptrm-left-{tag}"), Path(f"/dev/shm/gptrm-left-{tag}"),
                Path(f"/dev/shm/gptrm-dir-{tag}"), shared / "left"]
        try:
            task_id = _submit(cluster, f"umask 077; echo secret > {left[0]}; echo x > {left[1]}; mkdir {left[2]}; "
                              f"echo y > {left[2]}/inner; echo z > {left[3]}; ls {' '.join(map(str, left))}")
            assert _ended(cluster, task_id)["state"] == "succeeded", cluster.ctl("logs", task_id).stdout
            wait_until(lambda: not any(p.exists() for p in left), 20,
                       what=f"every file removed: {[str(p) for p in left if p.exists()]}")
            assert shared.is_dir()
        finally:
            shutil.rmtree(shared, ignore_errors=True)
            for p in left[:3]:
                with contextlib.suppress(OSError):
                    shutil.rmtree(p) if p.is_dir() else p.unlink()

    @pytest.mark.skipif(not memory_limits_available(), reason="no cgroup memory controller for the agent's tasks")
    def test_dev_shm_beyond_the_declared_memory_fails(self, cluster: Cluster, state_dir: Path) -> None:
        """A task that declared 64 MiB cannot pin three times its memory limit in the host's /dev/shm (its memory
        cgroup's limit; a task in namespaces of its own also has a /dev/shm of its own, sized by its demand)."""
        _start(cluster, state_dir, *_SHARED_NAMESPACES)
        limit = memory_limit(64 * _MIB)
        assert limit is not None
        count = 3 * limit // _MIB
        task_id = _submit(cluster, f"dd if=/dev/zero of=/dev/shm/gptrm-pin-$GPTRM_TASK_ID bs=1M count={count} "
                          "2>/dev/null; echo dd-exit-$?", "--mem-gib", str(64 / 1024))
        _ended(cluster, task_id)
        out = cluster.ctl("logs", task_id).stdout
        assert "dd-exit-0" not in out, out

    def test_a_task_cannot_read_the_agents_metrics(self, cluster: Cluster, state_dir: Path) -> None:
        """The agent's /metrics (loopback) lists every task's id and GPUs: a task's connection gets 403, while a
        scraper that is not a task (here root) is served and sees the task."""
        listen = f"127.0.0.1:{free_port()}"
        _start(cluster, state_dir, "--metrics-listen", listen)
        fetch = (f"/usr/bin/python3 -c \"import urllib.request as u\ntry: print(u.urlopen('http://{listen}/metrics', "
                 f"timeout=10).read().decode())\nexcept Exception as e: print('SCRAPE-FAILED', e)\"; sleep 600")
        task_id = _submit(cluster, fetch)
        try:
            out = wait_until(lambda: (o := cluster.ctl("logs", task_id).stdout) and o, 30, what="the task's scrape")
            assert "SCRAPE-FAILED HTTP Error 403" in out and "gptrm_agent_task" not in out, out
            with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as resp:
                assert task_id in resp.read().decode()
        finally:
            cluster.ctl("cancel", task_id)
        _ended(cluster, task_id)

    def test_a_uid_whose_task_ended_while_the_agent_was_down_is_cleaned_before_reuse(
            self, cluster: Cluster, state_dir: Path) -> None:
        """The agent is stopped while a task holds a System V segment; the task ends meanwhile. The restarted agent
        removes the segment before the uid (the range holds one) runs another task."""
        uid = _lone_uid()
        _start(cluster, state_dir, "--task-uids", f"{uid}-{uid}", *_SHARED_NAMESPACES)
        script = _ipc_script(state_dir)
        key, secret = secrets.randbelow(2**30) + 1, f"IPC-SECRET-{secrets.token_hex(6)}"
        first = _submit(cluster, f"/usr/bin/python3 {script} write {key} {secret}; exec sleep 3005")
        wait_until(lambda: key in _shm_keys(), 30, what="the task's segment")
        cluster.agents["n1"].stop()
        for p in psutil.process_iter(["uids"]):
            if p.info["uids"] and p.info["uids"].real == uid:
                p.kill()
        cluster.start_agent("n1", "--state-dir", str(state_dir), "--task-uids", f"{uid}-{uid}", *_SHARED_NAMESPACES)
        assert _ended(cluster, first)["state"] == "failed"
        wait_until(lambda: not (CLAIMS_DIR / str(uid)).exists(), 30, what="the uid given back")
        second = _submit(cluster, f"id -u; /usr/bin/python3 {script} read {key}")
        assert _ended(cluster, second)["state"] == "succeeded"
        out = cluster.ctl("logs", second).stdout
        assert out.split()[0] == str(uid) and secret not in out and "SHM-NONE" in out, out
        assert key not in _shm_keys()
