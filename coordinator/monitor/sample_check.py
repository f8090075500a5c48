"""Telemetry sanity checks: a sample with an impossible value is dropped before it reaches history.

One NaN timestamp or negative power would otherwise poison the cluster's energy and objectives
for good (sums and integrals never recover from NaN). A sample is refused, whole, when:

- its time is not finite, negative, or more than :data:`MAX_CLOCK_AHEAD_S` ahead of the
  coordinator's clock;
- any GPU or host number is NaN, infinite or negative;
- a utilization (GPU, memory controller, host CPU) is above 1;
- a GPU's power is above :data:`MAX_GPU_POWER_W`, or its temperature above :data:`MAX_TEMPERATURE_C`;
- used memory exceeds total memory (GPU or host).

:func:`sample_problem` names the first problem found (for the log), or returns None.
"""

from __future__ import annotations

import math

from google.protobuf.descriptor import FieldDescriptor

from common.pb.gptrm.v1 import types_pb2

__all__ = ["MAX_CLOCK_AHEAD_S", "MAX_GPU_POWER_W", "MAX_TEMPERATURE_C", "sample_problem"]

MAX_CLOCK_AHEAD_S = 86_400.0
"""A sample stamped more than a day after the coordinator's clock is refused."""
MAX_GPU_POWER_W = 5_000.0
"""No GPU draws more (the largest boards are around 1.2 kW)."""
MAX_TEMPERATURE_C = 250.0

_FRACTIONS = ("util_gpu", "util_mem")


def _number_problem(where: str, name: str, value: float) -> str | None:
    if not math.isfinite(value):
        return f"{where}.{name} is {value}"
    if value < 0:
        return f"{where}.{name} is negative ({value})"
    return None


_FD = FieldDescriptor
_GPU_FLOATS = tuple(f.name for f in types_pb2.GpuSample.DESCRIPTOR.fields
                    if f.cpp_type in (_FD.CPPTYPE_DOUBLE, _FD.CPPTYPE_FLOAT)
                    and not getattr(f, "is_repeated", getattr(f, "label", 0) == _FD.LABEL_REPEATED))
_HOST_NUMBERS = ("cpu_util", "load1", "load5", "load15", "cpu_power_w")


def _numbers_fine(values: list[float]) -> bool:
    # Any NaN or infinity makes the sum non-finite; with none, min() is exact.
    return math.isfinite(sum(values)) and min(values, default=0.0) >= 0.0


def _plainly_fine(sample: types_pb2.TelemetrySample, now: float) -> bool:
    """A quick sufficient test (no strings, no field lists): True only where :func:`_first_problem` finds
    nothing. Anything unusual goes to the full check, which names the problem."""
    if not 0.0 <= sample.time_unix_s <= now + MAX_CLOCK_AHEAD_S:   # also False for NaN
        return False
    for g in sample.gpus:
        if not _numbers_fine([getattr(g, name) for name in _GPU_FLOATS]):
            return False
        if g.util_gpu > 1.0 or g.util_mem > 1.0 or g.power_w > MAX_GPU_POWER_W \
                or g.temperature_c > MAX_TEMPERATURE_C or g.mem_used_bytes > g.mem_total_bytes:
            return False
    h = sample.host
    if not _numbers_fine([getattr(h, name) for name in _HOST_NUMBERS]):
        return False
    return h.cpu_util <= 1.0 and not (h.mem_total_bytes and h.mem_used_bytes > h.mem_total_bytes)


def sample_problem(sample: types_pb2.TelemetrySample, now: float) -> str | None:
    """The first impossible value of ``sample`` as ``field: problem``, or None if it is usable."""
    if _plainly_fine(sample, now):
        return None
    return _first_problem(sample, now)


def _first_problem(sample: types_pb2.TelemetrySample, now: float) -> str | None:
    t = sample.time_unix_s
    if not math.isfinite(t) or t < 0:
        return f"time_unix_s is {t}"
    if t > now + MAX_CLOCK_AHEAD_S:
        return f"time_unix_s is {t - now:.0f} s ahead of the coordinator's clock"
    for g in sample.gpus:
        where = f"gpus[{g.index}]"
        for fd, value in g.ListFields():
            if isinstance(value, float):
                problem = _number_problem(where, fd.name, value)
                if problem:
                    return problem
        for name in _FRACTIONS:
            if g.HasField(name) and getattr(g, name) > 1.0:
                return f"{where}.{name} is above 1 ({getattr(g, name)})"
        if g.HasField("power_w") and g.power_w > MAX_GPU_POWER_W:
            return f"{where}.power_w is above {MAX_GPU_POWER_W:.0f} W ({g.power_w})"
        if g.HasField("temperature_c") and g.temperature_c > MAX_TEMPERATURE_C:
            return f"{where}.temperature_c is above {MAX_TEMPERATURE_C:.0f} ({g.temperature_c})"
        if g.HasField("mem_total_bytes") and g.HasField("mem_used_bytes") and g.mem_used_bytes > g.mem_total_bytes:
            return f"{where}.mem_used_bytes is above mem_total_bytes"
    h = sample.host
    for name in _HOST_NUMBERS:
        problem = _number_problem("host", name, getattr(h, name))
        if problem:
            return problem
    if h.cpu_util > 1.0:
        return f"host.cpu_util is above 1 ({h.cpu_util})"
    if h.mem_total_bytes and h.mem_used_bytes > h.mem_total_bytes:
        return "host.mem_used_bytes is above mem_total_bytes"
    return None
