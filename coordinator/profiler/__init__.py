"""GPT Task Profiler (paper §3): a task spec becomes a validated spec, a resource demand vector and QoS
requirements; finished tasks teach it per-model corrections.
"""

from __future__ import annotations

from coordinator.profiler.profiler import (
    Profiler,
    QosRequirements,
    TaskProfile,
    estimate_gpu_memory_bytes,
    model_shape,
    run_key,
    spec_data,
    spec_from_mapping,
    spec_to_proto,
    validate_profiled_demand,
    validate_spec,
)
from coordinator.profiler.taskspec import gpus_used

__all__ = [
    "Profiler",
    "QosRequirements",
    "TaskProfile",
    "estimate_gpu_memory_bytes",
    "gpus_used",
    "model_shape",
    "run_key",
    "spec_data",
    "spec_from_mapping",
    "spec_to_proto",
    "validate_profiled_demand",
    "validate_spec",
]
