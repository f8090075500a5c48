"""A task's CPUs and memory follow its GPUs: the computed binding, the argv of each runtime,
and a real process bound by taskset (simulated topology, the CPUs of this machine)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from agent import systemd_task
from agent.collectors.base import GpuDevice
from agent.collectors.simulated import SimulatedGpus
from agent.cpu_binding import CpuBinding, binding_for, process_prefix, systemd_properties
from agent.runtime import TaskRuntime
from common.pb.gptrm.v1 import agent_pb2
from common.topology import format_cpu_list
from common.types import TaskState
from tests.helpers.builders import start_decision

ALL = frozenset(range(32))


def pairs_server(cpus: range | None = range(32)) -> SimulatedGpus:
    """A simulated two-socket PCIe server, NVLink pairs, CPUs 0-15 on socket 0 and 16-31 on socket 1."""
    return SimulatedGpus("8xH100-80GB", "n1", topology="pcie-nvlink-pairs", cpus=cpus)


class TestBindingFor:
    """The union of the chosen GPUs' affinity, kept to usable CPUs; their NUMA nodes for memory."""

    @pytest.mark.parametrize(("gpus", "cpus", "nodes"), [
        ([0, 1], "0-15", "0"), ([2, 3], "0-15", "0"), ([4, 5], "16-31", "1"), ([6, 7], "16-31", "1"),
        ([4, 5, 6, 7], "16-31", "1"), ([0], "0-15", "0"), (list(range(8)), "0-31", "0-1"),
    ])
    def test_follows_the_gpus_socket(self, gpus: list[int], cpus: str, nodes: str) -> None:
        """Each GPU set is bound to its socket's CPUs and NUMA node."""
        binding = binding_for(pairs_server().devices(), gpus, ALL)
        assert binding is not None and (binding.cpu_list, binding.node_list) == (cpus, nodes)

    def test_cpu_only_task_is_not_bound(self) -> None:
        """No GPU, no binding."""
        assert binding_for(pairs_server().devices(), [], ALL) is None

    def test_unknown_affinity_is_not_bound(self) -> None:
        """One GPU of the task with unknown affinity: no binding at all."""
        devices = pairs_server().devices()
        devices[1] = GpuDevice(index=1, uuid="u", model="m", mem_total_bytes=1)
        assert binding_for(devices, [0, 1], ALL) is None
        assert binding_for(devices, [0], ALL) is not None

    def test_unknown_numa_binds_cpus_only(self) -> None:
        """Affinity known but NUMA node unknown: CPUs bound, memory left alone."""
        devices = [GpuDevice(index=0, uuid="u", model="m", mem_total_bytes=1, cpu_affinity=(2, 3))]
        assert binding_for(devices, [0], ALL) == CpuBinding(cpus=(2, 3), numa_nodes=())

    def test_clipped_to_usable_cpus(self) -> None:
        """CPUs the agent may not use are dropped; none left means no binding."""
        assert binding_for(pairs_server().devices(), [4], frozenset({0, 17, 18})).cpus == (17, 18)  # type: ignore[union-attr]
        assert binding_for(pairs_server().devices(), [4], frozenset({0, 1})) is None

    def test_unknown_gpu_index(self) -> None:
        """An index the node does not have: no binding."""
        assert binding_for(pairs_server().devices(), [9], ALL) is None


class TestArgv:
    """What each runtime adds."""

    def test_process_prefix(self) -> None:
        """taskset always; numactl --membind only when numactl exists and the nodes are known."""
        binding = CpuBinding(cpus=(0, 1, 2, 3), numa_nodes=(0,))
        assert process_prefix(binding, taskset="/usr/bin/taskset", numactl="") == [
            "/usr/bin/taskset", "--cpu-list", "0-3"]
        assert process_prefix(binding, taskset="taskset", numactl="numactl") == [
            "taskset", "--cpu-list", "0-3", "numactl", "--membind=0", "--"]
        assert process_prefix(CpuBinding(cpus=(1,)), taskset="taskset", numactl="numactl") == [
            "taskset", "--cpu-list", "1"]
        assert process_prefix(binding, taskset="", numactl="numactl") == []
        assert process_prefix(None, taskset="taskset") == []

    def test_systemd_properties(self, tmp_path: Path) -> None:
        """AllowedCPUs, NUMAPolicy=bind and NUMAMask on the unit."""
        binding = binding_for(pairs_server().devices(), [6, 7], ALL)
        argv = systemd_task.unit_argv("t-1", gpu_indices=[6, 7], workdir=tmp_path,
                                      binding=binding)
        assert argv[-3:] == ["--property=AllowedCPUs=16-31", "--property=NUMAPolicy=bind",
                             "--property=NUMAMask=1"]
        assert systemd_properties(None) == []


def _start(task_id: str, argv: list[str], gpus: list[int]) -> agent_pb2.Decision:
    return start_decision(task_id, argv, gpus)


def _allowed(status: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list"))


async def _wait_for(check, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.mark.skipif(not os.path.exists("/usr/bin/taskset") and not os.path.exists("/bin/taskset"),
                    reason="taskset (util-linux) not installed")
class TestProcessRuntime:
    """A real task under the process runtime, on the simulated pairs server over this machine's CPUs."""

    def test_task_bound_to_its_gpus_socket(self, tmp_path: Path) -> None:
        """The task's Cpus_allowed_list is its GPUs' socket's CPUs; the wrapper stays unbound."""
        gpus = pairs_server(cpus=None)   # affinity drawn from the CPUs this process may use
        expected = format_cpu_list(gpus.devices()[4].cpu_affinity)
        agent_cpus = _allowed(Path("/proc/self/status").read_text())

        async def scenario() -> None:
            statuses: list[agent_pb2.TaskStatus] = []
            rt = TaskRuntime(tmp_path / "state", statuses.append, gpus=gpus, runtime="process")
            script = "grep Cpus_allowed_list /proc/self/status; exec sleep 30"
            assert (await rt.handle(_start("t1", ["/bin/sh", "-c", script], [4, 5]))).ok
            log = tmp_path / "state" / "tasks" / "t1" / "output.log"
            out = await _wait_for(lambda: log.exists() and "Cpus_allowed_list" in log.read_text() and log.read_text())
            assert _allowed(out) == expected
            wrapper = rt.table.tasks["t1"].pid
            assert _allowed(Path(f"/proc/{wrapper}/status").read_text()) == agent_cpus
            stop = agent_pb2.Decision(decision_id="stop-t1")
            stop.stop.task_id = "t1"
            stop.stop.grace_s = 1.0
            assert (await rt.handle(stop)).ok
            await _wait_for(lambda: any(s.state == int(TaskState.CANCELLED) for s in statuses))
            await rt.shutdown()

        asyncio.run(scenario())

    def test_cpu_only_task_unbound(self, tmp_path: Path) -> None:
        """A task without GPUs runs on every CPU the agent has."""
        agent_cpus = _allowed(Path("/proc/self/status").read_text())

        async def scenario() -> None:
            rt = TaskRuntime(tmp_path / "state", lambda s: None, gpus=pairs_server(cpus=None), runtime="process")
            assert (await rt.handle(_start("t2", ["grep", "Cpus_allowed_list", "/proc/self/status"], []))).ok
            log = tmp_path / "state" / "tasks" / "t2" / "output.log"
            out = await _wait_for(lambda: log.exists() and "Cpus_allowed_list" in log.read_text() and log.read_text())
            assert _allowed(out) == agent_cpus
            await rt.shutdown()

        asyncio.run(scenario())
