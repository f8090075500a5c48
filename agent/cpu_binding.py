"""Binding a task's CPUs and memory to its GPUs' NUMA nodes.

The coordinator sends the GPU indices; the agent knows its own topology, so it computes the
binding itself: the union of the chosen GPUs' CPU affinity, kept to the CPUs this agent may use,
and their NUMA nodes for memory. A CPU-only task, or one with a GPU whose affinity is unknown,
is not bound.

* process runtime: ``taskset --cpu-list LIST`` (util-linux) before the task's argv, inside the
  wrapper, so only the task is bound; ``numactl --membind=NODES`` as well when numactl is
  installed and every GPU's NUMA node is known;
* systemd-run runtime: ``AllowedCPUs=LIST``, and ``NUMAPolicy=bind`` with ``NUMAMask=NODES``
  when the NUMA nodes are known.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from agent.collectors.base import GpuDevice
from common.topology import cpu_list_union, format_cpu_list

__all__ = ["CpuBinding", "binding_for", "process_prefix", "systemd_properties", "usable_cpus"]


@dataclass(frozen=True, slots=True)
class CpuBinding:
    """Where a task's threads and memory go.

    :param cpus: the CPUs it may run on (never empty).
    :param numa_nodes: the NUMA nodes its memory is bound to; ``()`` leaves memory unbound.
    """

    cpus: tuple[int, ...]
    numa_nodes: tuple[int, ...] = ()

    @property
    def cpu_list(self) -> str:
        """The CPUs in the kernel's list format (``0-15,32-47``)."""
        return format_cpu_list(self.cpus)

    @property
    def node_list(self) -> str:
        """The NUMA nodes in the kernel's list format ("" when unbound)."""
        return format_cpu_list(self.numa_nodes)


def usable_cpus() -> frozenset[int]:
    """The CPUs this process may run on."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def binding_for(
    devices: Sequence[GpuDevice], gpu_indices: Sequence[int], allowed: frozenset[int] | None = None
) -> CpuBinding | None:
    """The binding of a task on ``gpu_indices``, or None when it is not bound.

    :param devices: the node's GPUs (the backend's inventory).
    :param gpu_indices: the task's GPUs (empty for a CPU-only task).
    :param allowed: CPUs a task may be bound to (those this agent may use when None); CPUs of the
        affinity outside it are dropped, and no binding is made when none is left.
    """
    if not gpu_indices:
        return None
    by_index = {d.index: d for d in devices}
    found = [by_index.get(int(i)) for i in gpu_indices]
    chosen = [d for d in found if d is not None]
    if len(chosen) != len(found):
        return None
    cpus = cpu_list_union(d.cpu_affinity for d in chosen)
    allowed = usable_cpus() if allowed is None else allowed
    cpus = tuple(c for c in cpus if c in allowed)
    if not cpus:
        return None
    nodes = {d.numa_node for d in chosen}
    return CpuBinding(cpus=cpus, numa_nodes=() if any(n < 0 for n in nodes) else tuple(sorted(nodes)))


def process_prefix(binding: CpuBinding | None, *, taskset: str | None = None, numactl: str | None = None) -> list[str]:
    """The argv prefix that binds a process: ``taskset --cpu-list LIST [numactl --membind=NODES]``.

    :param taskset: the taskset path (looked up on PATH when None); without taskset nothing is bound.
    :param numactl: the numactl path (looked up when None); without it memory is not bound.
    """
    if binding is None:
        return []
    taskset = taskset if taskset is not None else shutil.which("taskset")
    if not taskset:
        return []
    prefix = [taskset, "--cpu-list", binding.cpu_list]
    numactl = numactl if numactl is not None else shutil.which("numactl")
    if numactl and binding.numa_nodes:
        prefix += [numactl, f"--membind={binding.node_list}", "--"]
    return prefix


def systemd_properties(binding: CpuBinding | None) -> list[str]:
    """``systemd-run`` arguments that bind the task's unit."""
    if binding is None:
        return []
    props = [f"--property=AllowedCPUs={binding.cpu_list}"]
    if binding.numa_nodes:
        props += ["--property=NUMAPolicy=bind", f"--property=NUMAMask={binding.node_list}"]
    return props
