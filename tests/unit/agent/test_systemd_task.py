"""Tasks started as transient systemd services (``runtime = "systemd-run"``).

systemd is not PID 1 on the machines that run the tests, so ``systemd-run`` and ``systemctl``
are stand-ins written here: ``systemd-run`` records its options, gives the unit the environment
its ``--setenv=`` options name and nothing else, and starts the command detached in a new
session, as PID 1 would; ``systemctl show`` returns
its pid. The agent code under test is the real runtime.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from agent import systemd_task
from agent.collectors.simulated import SimulatedGpus
from agent.runtime import TaskRuntime
from agent.taskkill import MEMORY_HEADROOM_BYTES, memory_limit
from common.errors import GptrmError
from common.pb.gptrm.v1 import agent_pb2
from common.topology import format_cpu_list
from common.types import TaskState
from tests.helpers.builders import start_decision

_FAKE_SYSTEMD_RUN = r'''
import json, os, sys
state = os.environ["FAKE_SYSTEMD_DIR"]
args, props, opts = sys.argv[1:], {}, {}
while args and args[0].startswith("--"):
    a = args.pop(0)
    if a.startswith("--property="):
        k, v = a[len("--property="):].split("=", 1)
        props.setdefault(k, []).append(v)
    elif a.startswith("--setenv="):
        k, v = a[len("--setenv="):].split("=", 1)
        opts.setdefault("setenv", {})[k] = v
    elif "=" in a:
        k, v = a[2:].split("=", 1)
        opts[k] = v
    else:
        opts[a[2:]] = True
env = opts.get("setenv", {})
unit = opts["unit"]
json.dump({"opts": opts, "props": props, "argv": args}, open(os.path.join(state, unit + ".json"), "w"))
pid = os.fork()
if pid == 0:
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0); os.dup2(null, 1); os.dup2(null, 2)
    os.chdir(opts["working-directory"])
    os.execve(args[0], args, env)
open(os.path.join(state, unit + ".pid"), "w").write(str(pid))
'''

_FAKE_SYSTEMCTL = r'''
import os, sys
unit = sys.argv[-1]
try:
    print(open(os.path.join(os.environ["FAKE_SYSTEMD_DIR"], unit + ".pid")).read())
except FileNotFoundError:
    print(0)
'''


@pytest.fixture
def fake_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bin directory with the stand-in systemd-run and systemctl first on PATH; returns their state dir."""
    bindir, state = tmp_path / "bin", tmp_path / "systemd"
    bindir.mkdir()
    state.mkdir()
    for name, body in (("systemd-run", _FAKE_SYSTEMD_RUN), ("systemctl", _FAKE_SYSTEMCTL)):
        exe = bindir / name
        exe.write_text(f"#!{sys.executable}\n{body}")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMD_DIR", str(state))
    monkeypatch.setattr(systemd_task, "systemd_running", lambda: True)
    return state


def _start(task_id: str, argv: list[str], env: dict[str, str], gpus: list[int]) -> agent_pb2.Decision:
    return start_decision(task_id, argv, gpus, env)


def _gone(pid: int) -> bool:
    """Whether the process has exited (a zombie waiting to be reaped counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def _until(statuses: list[agent_pb2.TaskStatus], state: TaskState, timeout: float = 10.0) -> agent_pb2.TaskStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for s in statuses:
            if s.state == int(state):
                return s
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {state.label} status within {timeout}s: {[s.state for s in statuses]}")


class TestChooseRuntime:
    def test_auto_uses_systemd_only_for_root_on_systemd(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """auto picks systemd-run for a root agent on a systemd host and process otherwise; explicit choices stay."""
        monkeypatch.setattr(systemd_task, "systemd_running", lambda: True)
        assert systemd_task.choose_runtime("auto", euid=0) == "systemd-run"
        assert systemd_task.choose_runtime("auto", euid=1000) == "process"
        assert systemd_task.choose_runtime("process", euid=0) == "process"
        monkeypatch.setattr(systemd_task, "systemd_running", lambda: False)
        assert systemd_task.choose_runtime("auto", euid=0) == "process"


class TestUnitArgv:
    def test_only_the_tasks_gpus_and_no_file_opened_by_pid1(self, tmp_path: Path) -> None:
        """The unit gets the control nodes and its own GPUs' device nodes only; PID 1 opens no output file
        (the root wrapper writes to the FIFO in the agent's own directory, and drops to the task's user)."""
        argv = systemd_task.unit_argv("t-1", gpu_indices=[1, 3], workdir=tmp_path)
        allowed = [a.split("=", 2)[2] for a in argv if a.startswith("--property=DeviceAllow=")]
        assert allowed == [f"{d} rw" for d in systemd_task.NVIDIA_CONTROL_NODES] + \
            ["/dev/nvidia1 rw", "/dev/nvidia3 rw"]
        assert "--property=DevicePolicy=closed" in argv and "--property=NoNewPrivileges=yes" in argv
        assert {"--unit=gptrm-task-t-1.service", "--service-type=exec"} <= set(argv)
        assert not [a for a in argv if "StandardOutput" in a or "StandardError" in a]
        assert "--scope" not in argv   # a scope would stay inside the agent's namespaces
        assert [a for a in argv if a.startswith("--setenv=")] == ["--setenv=PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                                                                   "--setenv=LANG=C.UTF-8"]
        assert not [a for a in argv if "EnvironmentFile" in a]   # the task's env never reaches PID 1 or the wrapper

    def test_a_declared_memory_caps_the_unit(self, tmp_path: Path) -> None:
        """A task that declared host memory gets MemoryMax= (its declaration plus headroom) and no swap; one that
        declared none gets no memory property."""
        limit = memory_limit(4 << 30)
        assert limit == (4 << 30) + (1 << 30) and memory_limit(64 << 20) == (64 << 20) + MEMORY_HEADROOM_BYTES
        assert memory_limit(0) is None
        argv = systemd_task.unit_argv("t-1", gpu_indices=[], workdir=tmp_path,
                                      memory_max=limit)
        assert {f"--property=MemoryMax={limit}", "--property=MemorySwapMax=0"} <= set(argv)
        assert not [a for a in systemd_task.unit_argv("t-1", gpu_indices=[], workdir=tmp_path)
                    if "Memory" in a]

    def test_unit_name_refuses_odd_ids(self) -> None:
        """A task id that is not a plain unit-name fragment is refused rather than escaped."""
        with pytest.raises(GptrmError, match="cannot name a systemd unit"):
            systemd_task.unit_name("a/../b")


class TestTransientServiceRuntime:
    def test_task_runs_outside_the_agent(self, tmp_path: Path, fake_systemd: Path) -> None:
        """The task is started by systemd-run, not as the agent's child; env, log and exit code arrive intact."""
        async def scenario() -> None:
            statuses: list[agent_pb2.TaskStatus] = []
            rt = TaskRuntime(tmp_path / "state", statuses.append, gpus=None, runtime="systemd-run")
            secret = 'tok "x" $HOME `y`\nsecond line'
            script = 'printf "%s|" "$SECRET"; echo "$CUDA_VISIBLE_DEVICES"; echo "ppid=$PPID"; exit 3'
            ack = await rt.handle(_start("t1", ["/bin/sh", "-c", script], {"SECRET": secret}, [1]))
            assert ack.ok, ack.reason
            done = await _until(statuses, TaskState.FAILED)
            assert done.exit_code == 3
            workdir = tmp_path / "state" / "tasks" / "t1"
            out = (workdir / "output.log").read_text()
            await rt.shutdown()
            assert f"{secret}|GPU-1" in out
            assert f"ppid={os.getpid()}" not in out
            assert not (workdir / "environment").exists()   # the secret does not stay on disk
            recorded = json.loads((fake_systemd / "gptrm-task-t1.service.json").read_text())
            assert recorded["props"]["DeviceAllow"][-1] == "/dev/nvidia1 rw"
            assert secret.splitlines()[0] not in " ".join(recorded["argv"])   # never on a command line

        asyncio.run(scenario())

    def test_unit_bound_to_its_gpus_socket(self, tmp_path: Path, fake_systemd: Path) -> None:
        """On a simulated pairs server the unit gets AllowedCPUs, NUMAPolicy=bind and NUMAMask of its
        GPUs' socket; the command itself carries no taskset."""
        async def scenario() -> None:
            statuses: list[agent_pb2.TaskStatus] = []
            gpus = SimulatedGpus("8xH100-80GB", "n1", topology="pcie-nvlink-pairs", cpus=range(os.cpu_count() or 1))
            rt = TaskRuntime(tmp_path / "state", statuses.append, gpus=gpus, runtime="systemd-run")
            assert (await rt.handle(_start("t4", ["true"], {}, [6, 7]))).ok
            await _until(statuses, TaskState.SUCCEEDED)
            await rt.shutdown()
            recorded = json.loads((fake_systemd / "gptrm-task-t4.service.json").read_text())
            assert recorded["props"]["AllowedCPUs"] == [format_cpu_list(gpus.devices()[6].cpu_affinity)]
            assert (recorded["props"]["NUMAPolicy"], recorded["props"]["NUMAMask"]) == (["bind"], ["1"])
            assert not [a for a in recorded["argv"] if a.endswith("taskset")]

        asyncio.run(scenario())

    def test_stop_reaches_a_task_the_agent_did_not_fork(self, tmp_path: Path, fake_systemd: Path) -> None:
        """Stopping signals the unit's process group: the task ends CANCELLED and no process is left."""
        async def scenario() -> None:
            statuses: list[agent_pb2.TaskStatus] = []
            rt = TaskRuntime(tmp_path / "state", statuses.append, gpus=None, runtime="systemd-run")
            assert (await rt.handle(_start("t2", ["sleep", "60"], {}, [0]))).ok
            pid = rt.table.tasks["t2"].pid
            assert psutil.Process(pid).ppid() != os.getpid()
            stop = agent_pb2.Decision(decision_id="stop-t2")
            stop.stop.task_id = "t2"
            stop.stop.grace_s = 2.0
            assert (await rt.handle(stop)).ok
            await _until(statuses, TaskState.CANCELLED)
            deadline = time.monotonic() + 10.0
            while not _gone(pid) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert _gone(pid)

        asyncio.run(scenario())

    def test_systemd_refusal_is_a_refused_start(self, tmp_path: Path, fake_systemd: Path) -> None:
        """When systemd-run fails the decision is refused with its words and no task is recorded."""
        async def scenario() -> None:
            (fake_systemd.parent / "bin" / "systemd-run").write_text(
                f"#!{sys.executable}\nimport sys\nsys.stderr.write('Unit gptrm-task-t3.service already exists.')\n"
                "sys.exit(1)\n")
            rt = TaskRuntime(tmp_path / "state", lambda s: None, gpus=None, runtime="systemd-run")
            ack = await rt.handle(_start("t3", ["true"], {}, [0]))
            assert not ack.ok and "already exists" in ack.reason
            assert "t3" not in rt.table.tasks

        asyncio.run(scenario())
