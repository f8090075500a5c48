"""Telemetry summaries: one sample per report interval instead of every sample.

The coordinator keeps its ingest within a budget by asking for a longer report interval as
nodes grow (``TelemetryRate``; see docs/internals.md, "Telemetry rate"). The agent keeps sampling at its
own interval — power capping, its ``/metrics`` endpoint and task attribution read every sample —
and sends one summary of the samples of each report interval. What a summary holds, per field:

- the **mean** over the summarised samples: GPU ``util_gpu``, ``util_mem``, ``power_w``,
  ``temperature_c``, ``sm_clock_mhz``, ``mem_clock_mhz``; host ``cpu_util`` and ``cpu_power_w``.
  These fluctuate from second to second; the mean is what the cluster objectives (Eq. 1–3) and the
  power curves want, and mean power × the span is the interval's energy;
- the **maximum** in the ``*_max`` fields: ``util_gpu_max``, ``power_w_max``, ``temperature_c_max``,
  ``mem_used_bytes_max`` per GPU, host ``cpu_util_max``, ``mem_used_bytes_max``, ``cpu_power_w_max``;
- the **last** sample's value for everything else: levels a reader compares with what it needs now
  (memory used and total, power limit, health, processes, load averages, task usage and QoS) and
  counters, which stay cumulative (energy, ECC, network, disk, task energy shares);
- ``time_unix_s`` is the last sample's, ``summarised_samples`` the count and ``summary_of_s`` the
  seconds covered since the previous report's last sample.

After each change of interval the first window has a random length (between one sampling interval
and the report interval): every agent hears of a change at the same moment, and without this their
reports would all fall in the same second of each interval.

Memory is bounded whatever the interval: running sums, counts and maxima per GPU and field, and
the last sample, never the samples themselves.
"""

from __future__ import annotations

import math
import random

from common.pb.gptrm.v1 import types_pb2

__all__ = ["GPU_MEAN_FIELDS", "HOST_MEAN_FIELDS", "Summariser"]

GPU_MEAN_FIELDS = ("util_gpu", "util_mem", "power_w", "temperature_c", "sm_clock_mhz", "mem_clock_mhz")
HOST_MEAN_FIELDS = ("cpu_util", "cpu_power_w")
_GPU_MAX = (("util_gpu", "util_gpu_max"), ("power_w", "power_w_max"), ("temperature_c", "temperature_c_max"),
            ("mem_used_bytes", "mem_used_bytes_max"))
_HOST_MAX = (("cpu_util", "cpu_util_max"), ("mem_used_bytes", "mem_used_bytes_max"),
             ("cpu_power_w", "cpu_power_w_max"))
_INT_FIELDS = frozenset({"sm_clock_mhz", "mem_clock_mhz"})
MAX_GPUS = 256
"""GPUs summarised per sample at most (the coordinator refuses more at registration)."""


class _Acc:
    """Sum, count and maximum of one number."""

    __slots__ = ("count", "max", "sum")

    def __init__(self) -> None:
        self.sum = 0.0
        self.count = 0
        self.max = -math.inf

    def add(self, value: float) -> None:
        self.sum += value
        self.count += 1
        if value > self.max:
            self.max = value


class Summariser:
    """Turns samples taken every ``sampling_interval_s`` into one sample per report interval.

    ``add`` returns what to send: the sample itself while the report interval is at most the
    sampling interval (nothing changes for a 1 Hz cluster), else None until the samples added
    since the last report cover the report interval, then their summary.

    :param sampling_interval_s: the agent's own sampling interval.
    :param rng: draws the length of the first window after a change; None: a whole report interval
        (deterministic, for tests).
    """

    def __init__(self, sampling_interval_s: float, rng: random.Random | None = None) -> None:
        self.sampling_interval_s = sampling_interval_s
        self.report_interval_s = sampling_interval_s
        self._rng = rng
        self._window_s = sampling_interval_s   # the current window's length (the first after a change: random)
        self._last: types_pb2.TelemetrySample | None = None
        self._count = 0
        self._gpu: dict[tuple[int, str], _Acc] = {}
        self._host: dict[str, _Acc] = {}
        self._since: float | None = None   # the previous report's last sample time

    @property
    def summarising(self) -> bool:
        return self.report_interval_s > self.sampling_interval_s

    @property
    def pending(self) -> int:
        """Samples taken since the last report."""
        return self._count

    def set_report_interval(self, report_interval_s: float) -> types_pb2.TelemetrySample | None:
        """The coordinator asked for another interval. Returns the summary of what was pending when
        the new interval no longer summarises (so nothing sampled is lost), else None."""
        was, old = self.summarising, self.report_interval_s
        self.report_interval_s = max(self.sampling_interval_s, report_interval_s)
        if self.report_interval_s != old:
            self._window_s = (self._rng.uniform(self.sampling_interval_s, self.report_interval_s)
                              if self._rng is not None else self.report_interval_s)
        if was and not self.summarising and self._count:
            return self._flush()
        return None

    def add(self, sample: types_pb2.TelemetrySample) -> types_pb2.TelemetrySample | None:
        """Take one sample; returns the sample or summary to send now, or None."""
        if not self.summarising:
            self._since = sample.time_unix_s
            return sample
        if self._since is None or sample.time_unix_s < self._since:
            self._since = sample.time_unix_s - self.sampling_interval_s   # first sample, or the clock went back
        self._accumulate(sample)
        # Half a sampling interval of slack: sample times jitter, and a report due now must not wait a tick.
        if sample.time_unix_s - self._since >= self._window_s - 0.5 * self.sampling_interval_s:
            self._window_s = self.report_interval_s
            return self._flush()
        return None

    def _accumulate(self, sample: types_pb2.TelemetrySample) -> None:
        self._count += 1
        self._last = sample
        gpu = self._gpu
        for g in sample.gpus[:MAX_GPUS]:
            for name in GPU_MEAN_FIELDS:
                if g.HasField(name):
                    key = (g.index, name)
                    acc = gpu.get(key)
                    if acc is None:
                        acc = gpu[key] = _Acc()
                    acc.add(getattr(g, name))
            if g.HasField("mem_used_bytes"):
                key = (g.index, "mem_used_bytes")
                acc = gpu.get(key)
                if acc is None:
                    acc = gpu[key] = _Acc()
                acc.add(g.mem_used_bytes)
        h = sample.host
        host = self._host
        for name, value in (("cpu_util", h.cpu_util), ("mem_used_bytes", h.mem_used_bytes),
                            ("cpu_power_w", h.cpu_power_w if h.HasField("cpu_power_w") else None)):
            if value is None:
                continue
            acc = host.get(name)
            if acc is None:
                acc = host[name] = _Acc()
            acc.add(value)

    def _flush(self) -> types_pb2.TelemetrySample:
        last = self._last
        assert last is not None
        out = types_pb2.TelemetrySample()
        out.CopyFrom(last)
        out.summarised_samples = self._count
        out.summary_of_s = max(0.0, last.time_unix_s - (self._since or last.time_unix_s))
        gpu = self._gpu
        for g in out.gpus[:MAX_GPUS]:
            for name in GPU_MEAN_FIELDS:
                acc = gpu.get((g.index, name))
                if acc is not None and acc.count:
                    mean = acc.sum / acc.count
                    setattr(g, name, round(mean) if name in _INT_FIELDS else mean)
            for name, max_name in _GPU_MAX:
                acc = gpu.get((g.index, name))
                if acc is not None and acc.count:
                    setattr(g, max_name, int(acc.max) if name == "mem_used_bytes" else acc.max)
        h, host = out.host, self._host
        for name in HOST_MEAN_FIELDS:
            acc = host.get(name)
            if acc is not None and acc.count:
                setattr(h, name, acc.sum / acc.count)
        for name, max_name in _HOST_MAX:
            acc = host.get(name)
            if acc is not None and acc.count:
                setattr(h, max_name, int(acc.max) if name == "mem_used_bytes" else acc.max)
        self._since = last.time_unix_s
        self._last = None
        self._count = 0
        self._gpu.clear()
        self._host.clear()
        return out
