"""The sampling loop: one TelemetrySample per tick, failures contained, GPU usage attributed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest
import structlog
from structlog.testing import capture_logs

from agent.collectors import GpuProcessReading, GpuReading, HostReading, PowerReading, Sample, TaskUsage
from agent.collectors.simulated import SimulatedGpus
from agent.sampler import Sampler, attribute_gpu_usage
from common.errors import CollectorError, NoData
from common.pb.gptrm.v1 import types_pb2
from tests.helpers.clock import FakeClock

Log = structlog.typing.FilteringBoundLogger
GIB = 1 << 30


class StubCollector:
    """A collector whose ``collect`` runs a given function."""

    def __init__(self, name: str, collect: Callable[[], Sequence[Sample]]) -> None:
        self.name = name
        self._collect = collect

    def collect(self) -> Sequence[Sample]:
        return self._collect()


def host_with_tasks(*tasks: TaskUsage) -> StubCollector:
    """A host collector returning a fixed reading with ``tasks``."""
    reading = HostReading(
        cpu_util=0.5, load1=1.0, load5=1.0, load15=1.0, mem_used_bytes=1, mem_total_bytes=2, tasks=tasks
    )
    return StubCollector("host", lambda: [reading])


def raises(error: Exception) -> Callable[[], Sequence[Sample]]:
    """A collect function that raises ``error``."""

    def collect() -> Sequence[Sample]:
        raise error

    return collect


def make_sampler(clock: FakeClock, log: Log, *collectors: StubCollector, spec: str = "2xH100-80GB") -> Sampler:
    """A sampler over jitter-free simulated GPUs and the given collectors, all on the fake clock."""
    gpus = SimulatedGpus(spec, "n1", clock=clock, jitter=0.0)
    return Sampler(gpus, collectors, interval_s=1.0, log=log, now=clock, clock=clock, sleep=clock.sleep)


def events(logs: list[dict[str, object]], event: str) -> list[dict[str, object]]:
    """The captured log entries named ``event``."""
    return [e for e in logs if e["event"] == event]


class TestSampleOnce:
    """Building one TelemetrySample from all collectors."""

    def test_sample_contents(self, clock: FakeClock, log: Log) -> None:
        """GPUs, host and CPU power land in one sample stamped with the wall clock and simulated flag."""
        power = StubCollector("power", lambda: [PowerReading(cpu_power_w=88.0)])
        sample = make_sampler(clock, log, host_with_tasks(), power).sample_once()
        assert isinstance(sample, types_pb2.TelemetrySample)
        assert sample.time_unix_s == 1000.0 and sample.simulated
        assert [g.uuid for g in sample.gpus] == ["GPU-sim-n1-0", "GPU-sim-n1-1"]
        assert all(g.simulated for g in sample.gpus)
        assert sample.host.cpu_util == 0.5 and sample.host.cpu_power_w == 88.0

    def test_failing_collector_contained(self, clock: FakeClock, log: Log) -> None:
        """A failing collector is logged with ok=False and the others still report."""
        broken = StubCollector("power", raises(CollectorError("sensor unreadable")))
        sampler = make_sampler(clock, log, host_with_tasks(), broken)
        with capture_logs() as logs:
            sample = sampler.sample_once()
        assert len(sample.gpus) == 2 and sample.host.cpu_util == 0.5
        assert not sample.host.HasField("cpu_power_w")
        [failed] = events(logs, "collector_failed")
        assert failed["collector"] == "power" and failed["ok"] is False and failed["reason"] == "sensor unreadable"
        assert failed["log_level"] == "warning" and "duration_s" in failed

    def test_unexpected_exception_contained(self, clock: FakeClock, log: Log) -> None:
        """Even a bug (any exception) in a collector does not stop the tick."""
        sampler = make_sampler(clock, log, StubCollector("host", raises(RuntimeError("boom"))))
        with capture_logs() as logs:
            sample = sampler.sample_once()
        assert len(sample.gpus) == 2
        assert events(logs, "collector_failed")[0]["reason"] == "RuntimeError: boom"

    def test_repeated_failure_logged_once_as_warning(self, clock: FakeClock, log: Log) -> None:
        """The same failure again goes to debug; recovery is logged at info."""
        outcome: list[Exception | None] = [CollectorError("down"), CollectorError("down"), None]

        def collect() -> Sequence[Sample]:
            error = outcome.pop(0)
            if error is not None:
                raise error
            return [PowerReading(cpu_power_w=1.0)]

        sampler = make_sampler(clock, log, StubCollector("power", collect))
        with capture_logs() as logs:
            for _ in range(3):
                sampler.sample_once()
        assert [e["log_level"] for e in events(logs, "collector_failed")] == ["warning", "debug"]
        assert events(logs, "collector_recovered")[0]["ok"] is True

    def test_no_data_is_debug_not_failure(self, clock: FakeClock, log: Log) -> None:
        """NoData is logged at debug and never as a failure."""
        sampler = make_sampler(clock, log, StubCollector("power", raises(NoData("first reading"))))
        with capture_logs() as logs:
            sampler.sample_once()
        [entry] = events(logs, "collector_had_no_data")
        assert entry["log_level"] == "debug" and entry["collector"] == "power"
        assert events(logs, "collector_failed") == []

    def test_each_collector_timed(self, clock: FakeClock, log: Log) -> None:
        """Every collector that ran is logged with its name, duration and ok=True."""
        with capture_logs() as logs:
            make_sampler(clock, log, host_with_tasks()).sample_once()
        ran = events(logs, "collector_ran")
        assert [e["collector"] for e in ran] == ["simulated", "host"]
        assert all(e["ok"] is True and e["duration_s"] == 0.0 for e in ran)

    def test_task_gpu_usage_and_energy(self, clock: FakeClock, log: Log) -> None:
        """A task's GPU memory, utilization and power shares are filled in and its energy accumulates."""
        sampler = make_sampler(clock, log, host_with_tasks(TaskUsage("t1", 1.0, 10, pids=(100, 101))))
        sampler.gpus.place("t1", [0, 1], util_per_gpu=0.5, mem_bytes_per_gpu=GIB, pids=[101])  # type: ignore[attr-defined]
        sampler.sample_once()
        clock.advance(2.0)
        task = sampler.sample_once().host.tasks[0]
        assert task.gpu_mem_bytes == 2 * GIB
        assert task.gpu_util_share == pytest.approx(1.0)  # half of each of two GPUs
        assert task.power_share_w == pytest.approx(770.0)  # 2 × (70 + 630 × 0.5)
        assert task.energy_share_j == pytest.approx(1540.0)  # 770 W over the 2 s tick

    def test_inventory_and_backend(self, clock: FakeClock, log: Log) -> None:
        """The inventory comes as GpuInfo messages with the backend's name."""
        sampler = make_sampler(clock, log)
        inventory = sampler.inventory()
        assert all(isinstance(g, types_pb2.GpuInfo) for g in inventory)
        assert [g.index for g in inventory] == [0, 1]
        assert (sampler.backend, sampler.simulated) == ("simulated", True)


class TestRun:
    """The loop's schedule."""

    def test_emits_every_interval_until_stopped(self, clock: FakeClock, log: Log) -> None:
        """One sample per interval reaches the callback, and the loop ends when stop is set."""
        stop = threading.Event()
        samples: list[types_pb2.TelemetrySample] = []

        def emit(sample: types_pb2.TelemetrySample) -> None:
            samples.append(sample)
            if len(samples) == 3:
                stop.set()

        make_sampler(clock, log).run(emit, stop)
        assert [s.time_unix_s for s in samples] == [1000.0, 1001.0, 1002.0]
        assert clock.sleeps == [1.0, 1.0, 1.0]

    def test_overrun_skips_ticks(self, clock: FakeClock, log: Log) -> None:
        """A tick that takes longer than the interval skips the missed ticks instead of bursting."""
        stop = threading.Event()
        samples: list[float] = []

        def slow_collect() -> Sequence[Sample]:
            clock.advance(2.5 if not samples else 0.0)
            return []

        def emit(sample: types_pb2.TelemetrySample) -> None:
            samples.append(sample.time_unix_s)
            if len(samples) == 2:
                stop.set()

        make_sampler(clock, log, StubCollector("slow", slow_collect)).run(emit, stop)
        assert samples == [1002.5, 1003.0]  # ticks at 1001 and 1002 skipped; next on schedule at 1003
        assert clock.sleeps[0] == pytest.approx(0.5)

    def test_close_closes_backend(self, clock: FakeClock, log: Log) -> None:
        """close() closes the GPU backend."""
        closed: list[bool] = []
        gpus = SimulatedGpus("1xT4-16GB", "n1", clock=clock)
        gpus.close = lambda: closed.append(True)  # type: ignore[method-assign]
        Sampler(gpus, log=log).close()
        assert closed == [True]


class TestAttributeGpuUsage:
    """Sharing GPU usage among the tasks whose processes run there."""

    @staticmethod
    def gpu(index: int, util: float, power_w: float, *procs: tuple[int, int | None]) -> GpuReading:
        return GpuReading(
            index=index,
            uuid=f"GPU-{index}",
            util_gpu=util,
            power_w=power_w,
            processes=tuple(GpuProcessReading(pid, mem) for pid, mem in procs),
        )

    def test_split_by_memory(self) -> None:
        """Two tasks on one GPU share it in proportion to their memory."""
        tasks = [TaskUsage("a", 0, 0, pids=(1,)), TaskUsage("b", 0, 0, pids=(2,))]
        # a holds 30 of 40 GiB: 3/4 of 0.8 util and of 400 W.
        a, b = attribute_gpu_usage(tasks, [self.gpu(0, 0.8, 400.0, (1, 30 * GIB), (2, 10 * GIB))])
        assert (a.gpu_mem_bytes, a.gpu_util_share, a.power_share_w) == (30 * GIB, pytest.approx(0.6), 300.0)
        assert (b.gpu_mem_bytes, b.gpu_util_share, b.power_share_w) == (10 * GIB, pytest.approx(0.2), 100.0)

    def test_unknown_memory_split_evenly(self) -> None:
        """When the driver hides process memory, processes share the GPU equally."""
        tasks = [TaskUsage("a", 0, 0, pids=(1,))]
        [a] = attribute_gpu_usage(tasks, [self.gpu(0, 1.0, 300.0, (1, None), (9, None))])
        assert (a.gpu_mem_bytes, a.gpu_util_share, a.power_share_w) == (0, 0.5, 150.0)

    def test_task_without_gpu(self) -> None:
        """A task with no GPU processes keeps zero GPU usage; foreign processes keep their share."""
        tasks = [TaskUsage("cpu-only", 2.0, 5, pids=(3,))]
        [t] = attribute_gpu_usage(tasks, [self.gpu(0, 1.0, 300.0, (1, GIB))])
        assert (t.gpu_mem_bytes, t.gpu_util_share, t.power_share_w, t.cpu_util) == (0, 0.0, 0.0, 2.0)
