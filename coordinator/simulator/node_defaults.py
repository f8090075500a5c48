"""What a replayed node gets where the trace is silent (kept apart so that gptrmctl's parser can show
the defaults without loading the simulator)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NodeDefaults"]


@dataclass(frozen=True, slots=True)
class NodeDefaults:
    """What a node gets where the trace is silent.

    :param gpu_model: GPU model name (Philly publishes none; its servers held P100s and P40s).
    :param gpu_mem_gib: memory per GPU.
    :param cpu_cores_per_gpu: host cores per GPU (a CPU-only node counts as 4 GPUs).
    :param mem_gib_per_gpu: host memory per GPU.
    :param disk_gib: local disk per node (neither trace says; LLM jobs ask for disk).
    :param host_idle_w: constant host power per powered node (CPU package, fans) added to the
        power model's GPU curve; 0 keeps the power model's GPU-only curve.
    """

    gpu_model: str = "NVIDIA Tesla P100-PCIE-16GB"
    gpu_mem_gib: float = 16.0
    cpu_cores_per_gpu: float = 8.0
    mem_gib_per_gpu: float = 64.0
    disk_gib: float = 4096.0
    host_idle_w: float = 0.0

    def __post_init__(self) -> None:
        for name in ("gpu_mem_gib", "cpu_cores_per_gpu", "mem_gib_per_gpu"):
            if not getattr(self, name) > 0:
                raise ValueError(f"node default {name} must be > 0, got {getattr(self, name)!r}")
        if self.disk_gib < 0 or self.host_idle_w < 0:
            raise ValueError("node defaults disk_gib and host_idle_w must be ≥ 0")
