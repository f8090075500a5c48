"""NVML's GPU health signals against the fake pynvml: XID events, ECC, remapped rows, retired pages, clocks
event reasons, PCIe, NVLink, a lost GPU, and each failing soft where unsupported."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
import structlog
from structlog.testing import capture_logs

from agent.collectors.base import GpuReading
from agent.collectors.nvml import NvmlCollector, open_nvml
from agent.health import HealthOptions, XidPolicy
from tests.helpers import fake_pynvml
from tests.helpers.clock import FakeClock
from tests.helpers.fake_pynvml import FakeGpu, FakeNvml, make_gpus

Log = structlog.typing.FilteringBoundLogger
T = TypeVar("T")
NOT_SUPPORTED = fake_pynvml.NVML_ERROR_CODES["NOT_SUPPORTED"]
FUNCTION_NOT_FOUND = fake_pynvml.NVML_ERROR_CODES["FUNCTION_NOT_FOUND"]
WAIT_MS = 20   # the event thread's wait: it notices close() this soon


def wait_for(fn: Callable[[], T | None], what: str, timeout_s: float = 10.0) -> T:
    """Poll ``fn`` until it returns something truthy (the event thread files events on its own time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def opened(log: Log, clock: FakeClock) -> Iterator[Callable[..., NvmlCollector]]:
    """Open NVML over fake GPUs (closed after the test) with a fast event wait."""
    collectors: list[NvmlCollector] = []

    def open_(nvml: FakeNvml, **health: object) -> NvmlCollector:
        gpus = open_nvml(log, nvml, clock=clock, health=HealthOptions(**health),  # type: ignore[arg-type]
                         event_wait_ms=WAIT_MS)
        collectors.append(gpus)
        return gpus

    yield open_
    for gpus in collectors:
        gpus.close()


def health(reading: GpuReading) -> tuple[str, str, str]:
    assert reading.health is not None
    return reading.health.state, reading.health.action, reading.health.reason


class TestXidEvents:
    """XIDs arrive through nvmlEventSetWait_v2 in a thread of their own."""

    def test_xid_79_makes_the_gpu_unhealthy(self, opened: Callable[..., NvmlCollector]) -> None:
        nvml = FakeNvml(make_gpus(2))
        gpus = opened(nvml)
        assert [r.healthy for r in gpus.collect()] == [True, True]
        nvml.raise_xid(1, 79)
        reading = wait_for(lambda: next((r for r in [gpus.collect()[1]] if not r.healthy), None), "xid 79")
        assert health(reading) == ("unhealthy", "replace", "xid 79")
        assert reading.xid_last == 79 and reading.health is not None and reading.health.evidence == "xid=79"
        assert reading.to_proto().xid_last == 79
        assert gpus.collect()[0].healthy

    def test_application_xid_counted_gpu_healthy(self, opened: Callable[..., NvmlCollector]) -> None:
        nvml = FakeNvml(make_gpus(1))
        gpus = opened(nvml)
        nvml.raise_xid(0, 13)
        reading = wait_for(lambda: next((r for r in gpus.collect() if r.health and r.health.app_xid_count), None),
                           "xid 13 counted")
        assert reading.healthy and health(reading)[0] == "healthy"
        assert reading.health is not None and reading.health.app_xid_last == 13

    def test_configured_lists_apply(self, opened: Callable[..., NvmlCollector]) -> None:
        nvml = FakeNvml(make_gpus(1))
        gpus = opened(nvml, policy=XidPolicy.from_lists("", "79", "13"))
        nvml.raise_xid(0, 13)
        reading = wait_for(lambda: next((r for r in gpus.collect() if not r.healthy), None), "xid 13")
        assert health(reading) == ("unhealthy", "replace", "xid 13")

    def test_double_bit_ecc_event_is_xid_48_until_a_reset(self, opened: Callable[..., NvmlCollector]) -> None:
        """A double-bit ECC event reads as XID 48 (reset kind); the volatile counter going back (a GPU reset)
        clears it."""
        nvml = FakeNvml([FakeGpu(index=0, ecc_uncorrected=0, ecc_corrected=5)])
        gpus = opened(nvml)
        gpus.collect()
        nvml.raise_event(0, fake_pynvml.EVENT_DOUBLE_BIT_ECC)
        reading = wait_for(lambda: next((r for r in gpus.collect() if not r.healthy), None), "dbe event")
        assert health(reading) == ("unhealthy", "reset", "xid 48")
        assert not gpus.collect()[0].healthy
        nvml.gpus[0].ecc_corrected = 0   # a reset clears the volatile counters
        assert gpus.collect()[0].healthy

    def test_event_for_no_one_gpu_concerns_all(self, opened: Callable[..., NvmlCollector]) -> None:
        nvml = FakeNvml(make_gpus(2))
        gpus = opened(nvml)
        nvml.raise_xid(None, 79)
        wait_for(lambda: all(not r.healthy for r in gpus.collect()) or None, "xid 79 on both")

    def test_wait_times_out_and_stops_on_close(self, opened: Callable[..., NvmlCollector]) -> None:
        """Without events the wait times out (NVMLError_Timeout) and waits again; close() ends the thread
        and frees the event set."""
        nvml = FakeNvml(make_gpus(1))
        gpus = opened(nvml)
        wait_for(lambda: nvml.waits >= 3 or None, "the wait to time out and wait again")
        assert gpus._watcher is not None
        thread = gpus._watcher.events._thread
        assert thread is not None and thread.is_alive()
        gpus.close()
        assert not thread.is_alive() and nvml.event_sets[0].freed

    def test_events_unsupported_skipped_and_logged_once(self, log: Log, clock: FakeClock) -> None:
        """No event set where NVML cannot make one; a GPU offering no XID events is not registered."""
        nvml = FakeNvml(make_gpus(2))
        nvml.module_errors["nvmlEventSetCreate"] = NOT_SUPPORTED
        with capture_logs() as logs:
            gpus = open_nvml(log, nvml, clock=clock, event_wait_ms=WAIT_MS)
            gpus.collect()
            gpus.collect()
        assert [e["signal"] for e in logs if e["event"] == "gpu_health_signal_unsupported"] == ["xid_events"]
        assert gpus._watcher is not None and gpus._watcher.events._thread is None
        gpus.close()
        nvml = FakeNvml([FakeGpu(index=0, event_types=0), FakeGpu(index=1)])
        gpus = open_nvml(log, nvml, clock=clock, event_wait_ms=WAIT_MS)
        assert gpus._watcher is not None and gpus._watcher.events.registered == [1]
        assert nvml.event_sets[0].registered == {1: fake_pynvml.EVENT_XID | fake_pynvml.EVENT_DOUBLE_BIT_ECC}
        gpus.close()

    def test_driver_without_the_wait_ends_the_thread(self, opened: Callable[..., NvmlCollector]) -> None:
        nvml = FakeNvml(make_gpus(1))
        nvml.module_errors["nvmlEventSetWait_v2"] = FUNCTION_NOT_FOUND
        gpus = opened(nvml)
        assert gpus._watcher is not None
        thread = gpus._watcher.events._thread
        assert thread is not None
        thread.join(10)
        assert not thread.is_alive() and gpus.collect()[0].healthy

    def test_wait_failure_logged_once_and_retried(self, opened: Callable[..., NvmlCollector]) -> None:
        nvml = FakeNvml(make_gpus(1))
        nvml.module_errors["nvmlEventSetWait_v2"] = fake_pynvml.NVML_ERROR_CODES["UNKNOWN"]
        with capture_logs() as logs:
            gpus = opened(nvml)
            assert gpus._watcher is not None
            wait_for(lambda: any(e["event"] == "gpu_xid_wait_failed" for e in logs) or None, "the failure logged")
            del nvml.module_errors["nvmlEventSetWait_v2"]
            nvml.raise_xid(0, 79)
            wait_for(lambda: not gpus.collect()[0].healthy or None, "xid 79 after the failure")
        assert len([e for e in logs if e["event"] == "gpu_xid_wait_failed"]) == 1


class TestSignals:
    """The signals read with the tick, and the slow ones."""

    def test_remapped_rows_pending_then_cleared_then_failed(self, opened: Callable[..., NvmlCollector],
                                                             clock: FakeClock) -> None:
        nvml = FakeNvml([FakeGpu(index=0, remapped_rows=(0, 1, 1, 0))])
        gpus = opened(nvml, read_s=10.0)
        [r] = gpus.collect()
        assert health(r) == ("unhealthy", "reset", "row remap pending")
        assert r.signals is not None and (r.signals.remapped_uncorrectable, r.signals.remap_pending) == (1, True)
        nvml.gpus[0].remapped_rows = (0, 1, 0, 0)   # a reset applied the remap
        assert not gpus.collect()[0].healthy       # not read again before 10 s
        clock.advance(10.0)
        assert gpus.collect()[0].healthy
        nvml.gpus[0].remapped_rows = (0, 2, 0, 1)
        clock.advance(10.0)
        assert health(gpus.collect()[0]) == ("unhealthy", "replace", "row remap failure")

    def test_slow_signals_read_at_their_interval(self, opened: Callable[..., NvmlCollector], clock: FakeClock) -> None:
        nvml = FakeNvml(make_gpus(1))
        gpus = opened(nvml, read_s=10.0)
        for _ in range(5):
            gpus.collect()
            clock.advance(1.0)
        assert nvml.calls[("nvmlDeviceGetRemappedRows", 0)] == 1
        assert nvml.calls[("nvmlDeviceGetCurrPcieLinkWidth", 0)] == 1
        assert nvml.calls[("nvmlDeviceGetCurrentClocksEventReasons", 0)] == 5
        clock.advance(6.0)
        gpus.collect()
        assert nvml.calls[("nvmlDeviceGetRemappedRows", 0)] == 2

    def test_retired_pages_where_rows_are_not_remapped(self, opened: Callable[..., NvmlCollector]) -> None:
        """Older GPUs retire pages instead: a pending retirement needs a reset; rows remapping is asked once."""
        nvml = FakeNvml([FakeGpu(index=0, unsupported={"nvmlDeviceGetRemappedRows"}, retired_pages_pending=1,
                                 retired_pages_dbe=[0x1000, 0x2000])])
        gpus = opened(nvml, read_s=0.0)
        with capture_logs() as logs:
            [r] = gpus.collect()
            gpus.collect()
        assert health(r) == ("unhealthy", "reset", "page retirement pending")
        assert r.signals is not None and r.signals.retired_pages_dbe == 2
        assert nvml.calls[("nvmlDeviceGetRemappedRows", 0)] == 1
        assert [e["signal"] for e in logs if e["event"] == "gpu_health_signal_unsupported"] == ["remapped_rows"]

    @pytest.mark.parametrize(("bits", "reason"), [
        (fake_pynvml.CLOCKS_HW_SLOWDOWN | fake_pynvml.CLOCKS_HW_THERMAL, "thermal slowdown"),
        (fake_pynvml.CLOCKS_HW_SLOWDOWN | fake_pynvml.CLOCKS_HW_POWER_BRAKE, "power brake"),
        (fake_pynvml.CLOCKS_HW_SLOWDOWN, "hardware slowdown"),
    ])
    def test_clocks_event_reasons(self, opened: Callable[..., NvmlCollector], bits: int, reason: str) -> None:
        nvml = FakeNvml([FakeGpu(index=0, clocks_reasons=bits)])
        assert health(opened(nvml).collect()[0]) == ("degraded", "none", reason)

    def test_power_cap_is_not_throttling(self, opened: Callable[..., NvmlCollector]) -> None:
        nvml = FakeNvml([FakeGpu(index=0, clocks_reasons=fake_pynvml.CLOCKS_SW_POWER_CAP)])
        assert health(opened(nvml).collect()[0])[0] == "healthy"

    def test_older_driver_throttle_reasons(self, opened: Callable[..., NvmlCollector]) -> None:
        """Where the driver lacks nvmlDeviceGetCurrentClocksEventReasons the older name is read."""
        gpu = FakeGpu(index=0, clocks_reasons=fake_pynvml.CLOCKS_HW_SLOWDOWN,
                      errors={"nvmlDeviceGetCurrentClocksEventReasons": FUNCTION_NOT_FOUND})
        nvml = FakeNvml([gpu])
        assert health(opened(nvml).collect()[0])[2] == "hardware slowdown"
        assert nvml.calls[("nvmlDeviceGetCurrentClocksThrottleReasons", 0)] == 1

    def test_unsupported_signal_skipped(self, opened: Callable[..., NvmlCollector]) -> None:
        """A signal the GPU does not support is absent, the GPU healthy, and it is never asked again."""
        gpu = FakeGpu(index=0, unsupported={"nvmlDeviceGetCurrentClocksEventReasons",
                                            "nvmlDeviceGetMaxPcieLinkGeneration"})
        nvml = FakeNvml([gpu])
        gpus = opened(nvml, read_s=0.0)
        gpus.collect()
        [r] = gpus.collect()
        assert r.healthy and r.signals is not None
        assert r.signals.clocks_event_reasons is None and r.signals.pcie_width is None
        assert nvml.calls[("nvmlDeviceGetCurrentClocksEventReasons", 0)] == 1
        assert nvml.calls[("nvmlDeviceGetCurrPcieLinkWidth", 0)] == 0

    def test_pcie_narrower_degrades(self, opened: Callable[..., NvmlCollector]) -> None:
        nvml = FakeNvml([FakeGpu(index=0, pcie_width=8)])
        [r] = opened(nvml).collect()
        assert health(r) == ("degraded", "none", "pcie link narrower")
        assert r.health is not None and r.health.evidence == "pcie_width=8 max=16"

    def test_pcie_slower_only_while_busy(self, opened: Callable[..., NvmlCollector], clock: FakeClock) -> None:
        nvml = FakeNvml([FakeGpu(index=0, pcie_gen=1)])
        gpus = opened(nvml, read_s=0.0)
        assert gpus.collect()[0].healthy and health(gpus.collect()[0])[0] == "healthy"
        nvml.gpus[0].util_gpu = 90
        assert health(gpus.collect()[0]) == ("degraded", "none", "pcie link slower")

    def test_nvlink_up_at_start_then_down(self, opened: Callable[..., NvmlCollector], clock: FakeClock) -> None:
        """Only links that were up when the agent started count; one going down degrades the GPU."""
        nvml = FakeNvml([FakeGpu(index=0, nvswitch_links=4), FakeGpu(index=1)])
        gpus = opened(nvml, read_s=10.0)
        assert [health(r)[0] for r in gpus.collect()] == ["healthy", "healthy"]
        nvml.gpus[0].nvlink_down = {2}
        clock.advance(10.0)
        r = gpus.collect()[0]
        assert health(r) == ("degraded", "none", "nvlink down")
        assert r.health is not None and r.health.evidence == "nvlink 2 down"
        nvml.gpus[0].nvlink_down = set()
        clock.advance(10.0)
        assert gpus.collect()[0].healthy and health(gpus.collect()[0])[0] == "healthy"

    def test_gpu_lost_during_a_slow_read(self, opened: Callable[..., NvmlCollector], clock: FakeClock) -> None:
        nvml = FakeNvml(make_gpus(1, errors={"nvmlDeviceGetRemappedRows": fake_pynvml.NVML_ERROR_CODES["GPU_IS_LOST"]}))
        assert health(opened(nvml).collect()[0]) == ("unhealthy", "replace", "gpu lost")

    def test_reset_required_then_reset(self, opened: Callable[..., NvmlCollector]) -> None:
        """NVML saying a GPU needs a reset makes it unhealthy (reset); answering again afterwards shows the reset,
        which also clears a reset-kind XID that no counter would show cleared."""
        code = fake_pynvml.NVML_ERROR_CODES["RESET_REQUIRED"]
        nvml = FakeNvml(make_gpus(1))
        gpus = opened(nvml)
        nvml.raise_xid(0, 119)
        wait_for(lambda: not gpus.collect()[0].healthy or None, "xid 119")
        assert health(gpus.collect()[0]) == ("unhealthy", "reset", "xid 119")
        nvml.gpus[0].errors["nvmlDeviceGetUtilizationRates"] = code
        assert health(gpus.collect()[0]) == ("unhealthy", "reset", "xid 119")
        nvml.gpus[0].errors.clear()
        assert gpus.collect()[0].healthy

    def test_health_off_reads_nothing_more(self, opened: Callable[..., NvmlCollector]) -> None:
        """--gpu-health off: no event set, no extra NVML calls; what is read anyway is still classified."""
        nvml = FakeNvml(make_gpus(1, remapped_rows=(0, 1, 1, 0), ecc_uncorrected=2))
        gpus = opened(nvml, enabled=False)
        [r] = gpus.collect()
        assert not nvml.event_sets and nvml.calls[("nvmlDeviceGetRemappedRows", 0)] == 0
        assert health(r) == ("unhealthy", "reset", "uncorrectable ecc")


def test_fake_matches_the_real_module() -> None:
    """The fake's health constants and error codes are the real pynvml's."""
    real = pytest.importorskip("pynvml", reason="nvidia-ml-py not installed")
    fake = FakeNvml([])
    for name in ("nvmlEventTypeXidCriticalError", "nvmlEventTypeDoubleBitEccError", "nvmlClocksEventReasonHwSlowdown",
                 "nvmlClocksEventReasonSwThermalSlowdown", "nvmlClocksEventReasonHwThermalSlowdown",
                 "nvmlClocksEventReasonHwPowerBrakeSlowdown", "nvmlClocksEventReasonSwPowerCap",
                 "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", "NVML_FEATURE_ENABLED"):
        assert getattr(fake, name) == getattr(real, name), name
    for name in ("NVMLError_Timeout", "NVMLError_Uninitialized", "NVMLError_ResetRequired",
                 "NVMLError_FunctionNotFound"):
        assert getattr(fake_pynvml, name)().value == getattr(real, name)().value, name
    for function in ("nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlDeviceGetSupportedEventTypes",
                     "nvmlEventSetWait_v2", "nvmlEventSetFree", "nvmlDeviceGetIndex", "nvmlDeviceGetRemappedRows",
                     "nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus",
                     "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
                     "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
                     "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetNvLinkState"):
        assert callable(getattr(real, function)) and callable(getattr(fake, function)), function
