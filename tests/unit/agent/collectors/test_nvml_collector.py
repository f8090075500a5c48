"""NVML collector against the fake pynvml module (no GPU, no driver)."""

from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace

import pytest
import structlog
from structlog.testing import capture_logs

from agent.collectors.nvml import (
    EnergyCounter,
    NvmlCollector,
    load_pynvml,
    open_nvml,
    parse_gpu_reading,
    parse_topology_groups,
)
from common.errors import CollectorError, ValidationError
from tests.helpers import fake_pynvml
from tests.helpers.clock import FakeClock
from tests.helpers.fake_pynvml import FakeGpu, FakeNvml, make_gpus

Log = structlog.typing.FilteringBoundLogger
GIB = 1 << 30


def busy_gpu(index: int = 0, **overrides: object) -> FakeGpu:
    """A GPU in the middle of a training step, raw NVML units."""
    values: dict[str, object] = {
        "mem_used": 60 * GIB,
        "util_gpu": 87,
        "util_mem": 41,
        "power_mw": 350_500,
        "limit_mw": 500_000,
        "energy_mj": 123_456_789,
        "temperature": 71,
        "sm_clock": 1755,
        "mem_clock": 2619,
        "ecc_corrected": 3,
        "ecc_uncorrected": 1,
        "processes": [(4242, 59 * GIB), (4243, None)],
    }
    values.update(overrides)
    return FakeGpu(index=index, **values)  # type: ignore[arg-type]


class TestFakeModule:
    """The fake's error scheme matches the real pynvml module."""

    def test_error_codes_match_real_module(self) -> None:
        """Each fake NVMLError subclass carries the same code as the real one."""
        real = pytest.importorskip("pynvml", reason="nvidia-ml-py not installed")
        for name in ("NVMLError_NotSupported", "NVMLError_GpuIsLost", "NVMLError_LibraryNotFound",
                     "NVMLError_InvalidArgument"):
            assert getattr(fake_pynvml, name)().value == getattr(real, name)().value

    def test_base_class_builds_subclass(self) -> None:
        """``NVMLError(code)`` is an instance of that code's subclass, as in pynvml."""
        err = fake_pynvml.NVMLError(3)
        assert isinstance(err, fake_pynvml.NVMLError_NotSupported)
        assert str(err) == "Not Supported"


class TestOpenNvml:
    """Opening NVML reads the inventory once and fails clearly when NVML is missing."""

    def test_inventory_in_si_units(self, log: Log) -> None:
        """UUID, model, memory, power limits (mW → W), PCI bus id and MIG mode are read."""
        nvml = FakeNvml([busy_gpu(0, mig_mode=1), busy_gpu(1)])
        gpus = open_nvml(log, nvml)
        first = gpus.devices()[0]
        assert (first.index, first.uuid, first.model) == (0, "GPU-fake-0000", "NVIDIA H100 80GB HBM3")
        assert first.mem_total_bytes == 80 * GIB
        assert (first.power_limit_w, first.power_min_w, first.power_max_w, first.power_default_w) == (
            500.0,
            200.0,
            700.0,
            700.0,
        )
        assert first.pci_bus_id == "00000000:18:00.0"
        assert first.mig_enabled is True
        assert gpus.devices()[1].mig_enabled is False
        assert not first.simulated

    def test_library_missing_is_collector_error(self, log: Log) -> None:
        """nvmlInit failing with LibraryNotFound becomes a one-line CollectorError."""
        nvml = FakeNvml([], init_error=fake_pynvml.NVML_ERROR_CODES["LIBRARY_NOT_FOUND"])
        with pytest.raises(CollectorError, match="nvmlInit failed: NVML Shared Library Not Found") as info:
            open_nvml(log, nvml)
        assert "\n" not in str(info.value)

    def test_module_missing_is_collector_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without nvidia-ml-py installed, loading pynvml raises CollectorError, not ImportError."""
        monkeypatch.setitem(sys.modules, "pynvml", None)
        with pytest.raises(CollectorError, match="cannot import pynvml"):
            load_pynvml()

    def test_module_from_sys_modules(self, log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
        """With no module passed, the ``pynvml`` found by import is used."""
        nvml = FakeNvml(make_gpus(2))
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
        assert len(open_nvml(log).devices()) == 2
        assert importlib.import_module("pynvml") is nvml

    def test_topology_groups_by_switch(self, log: Log) -> None:
        """GPUs behind the same PCIe switch share a group; groups number in index order."""
        nvml = FakeNvml([FakeGpu(index=i, switch=1 - i // 4) for i in range(8)])
        assert [d.topology_group for d in open_nvml(log, nvml).devices()] == [0, 0, 0, 0, 1, 1, 1, 1]

    def test_topology_groups_by_nvlink(self, log: Log) -> None:
        """NVLink peers share a group even across PCIe switches."""
        nvml = FakeNvml([FakeGpu(index=i, switch=i, nvlink=i < 2) for i in range(3)])
        assert [d.topology_group for d in open_nvml(log, nvml).devices()] == [0, 0, 1]

    def test_topology_unknown(self, log: Log) -> None:
        """When NVML cannot tell the topology, every group is -1."""
        hidden = {"nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetP2PStatus"}
        nvml = FakeNvml(make_gpus(2, unsupported=hidden))
        assert [d.topology_group for d in open_nvml(log, nvml).devices()] == [-1, -1]


class TestNvmlCollector:
    """Sampling every GPU, per-field support, lost GPUs, power limits and shutdown."""

    def test_sample_values_and_units(self, log: Log) -> None:
        """Percent becomes 0..1, mW becomes W, mJ becomes J; the rest is passed through."""
        [reading] = open_nvml(log, FakeNvml([busy_gpu()])).collect()
        assert (reading.util_gpu, reading.util_mem) == (0.87, 0.41)
        assert (reading.mem_used_bytes, reading.mem_total_bytes) == (60 * GIB, 80 * GIB)
        assert (reading.power_w, reading.power_limit_w) == (350.5, 500.0)
        assert reading.energy_j == pytest.approx(123_456.789)
        assert (reading.temperature_c, reading.sm_clock_mhz, reading.mem_clock_mhz) == (71.0, 1755, 2619)
        assert (reading.ecc_corrected_total, reading.ecc_uncorrected_total) == (3, 1)
        assert [(p.pid, p.used_mem_bytes) for p in reading.processes] == [(4242, 59 * GIB), (4243, None)]
        assert reading.mig_enabled is False
        assert not reading.simulated
        # An uncorrectable volatile ECC error needs a reset (agent/health).
        assert reading.health is not None and (reading.health.state, reading.health.reason) == (
            "unhealthy", "uncorrectable ecc")
        assert (reading.healthy, reading.health_reason) == (False, "uncorrectable ecc")

    def test_unsupported_field_absent_and_not_requeried(self, log: Log) -> None:
        """A NotSupported field is None and its NVML call is never made again on that GPU."""
        nvml = FakeNvml([busy_gpu(0, unsupported={"nvmlDeviceGetTemperature"}), busy_gpu(1)])
        gpus = open_nvml(log, nvml)
        first = gpus.collect()
        second = gpus.collect()
        assert first[0].temperature_c is None and second[0].temperature_c is None
        assert second[1].temperature_c == 71.0
        assert nvml.calls[("nvmlDeviceGetTemperature", 0)] == 1
        assert nvml.calls[("nvmlDeviceGetTemperature", 1)] == 2
        assert second[0].power_w == 350.5

    def test_other_error_drops_field_this_tick_only(self, log: Log) -> None:
        """A field failing for another reason is absent but asked for again next tick."""
        no_permission = fake_pynvml.NVML_ERROR_CODES["NO_PERMISSION"]
        nvml = FakeNvml([busy_gpu(0, errors={"nvmlDeviceGetTemperature": no_permission})])
        gpus = open_nvml(log, nvml)
        assert gpus.collect()[0].temperature_c is None
        nvml.gpus[0].errors.clear()
        assert gpus.collect()[0].temperature_c == 71.0

    def test_lost_gpu_unhealthy_others_sampled(self, log: Log) -> None:
        """A GPU that fell off the bus is reported unhealthy (replace) while the others keep their values."""
        nvml = FakeNvml([busy_gpu(0), busy_gpu(1), busy_gpu(2)])
        gpus = open_nvml(log, nvml)
        nvml.gpus[1].lost = True
        with capture_logs() as logs:
            readings = gpus.collect()
            gpus.collect()
        assert [r.health.reason for r in readings if r.health] == ["uncorrectable ecc", "gpu lost", "uncorrectable ecc"]
        assert readings[1].health_reason == "gpu lost" and not readings[1].healthy
        assert readings[1].health is not None and readings[1].health.action == "replace"
        assert readings[1].health.evidence == "GPU is lost"
        assert readings[1].uuid == "GPU-fake-0001" and readings[1].power_w is None
        assert readings[2].power_w == 350.5
        lost = [e for e in logs if e["event"] == "gpu_health_changed" and e["gpu_index"] == 1]
        assert len(lost) == 1 and lost[0]["reason"] == "gpu lost"
        gpus.close()

    def test_lost_gpu_stays_unhealthy_when_it_answers_again(self, log: Log) -> None:
        """A GPU once lost is read again when it answers, but stays unhealthy until the agent restarts (an
        admin resumes it after repair)."""
        nvml = FakeNvml([busy_gpu(0, ecc_uncorrected=0)])
        gpus = open_nvml(log, nvml)
        nvml.gpus[0].lost = True
        gpus.collect()
        nvml.gpus[0].lost = False
        [reading] = gpus.collect()
        assert reading.power_w == 350.5 and not reading.healthy
        assert reading.health is not None and reading.health.action == "replace"
        gpus.close()

    def test_enforced_limit_refreshes_inventory(self, log: Log) -> None:
        """A limit changed outside the agent shows in ``devices()`` after the next sample."""
        nvml = FakeNvml([busy_gpu(0)])
        gpus = open_nvml(log, nvml)
        nvml.gpus[0].limit_mw = 300_000
        gpus.collect()
        assert gpus.devices()[0].power_limit_w == 300.0

    def test_set_power_limit(self, log: Log) -> None:
        """Setting a limit passes milliwatts to NVML and updates the inventory."""
        nvml = FakeNvml([busy_gpu(0)])
        gpus = open_nvml(log, nvml)
        gpus.set_power_limit(0, 450.0)
        assert nvml.gpus[0].limit_mw == 450_000
        assert gpus.devices()[0].power_limit_w == 450.0

    @pytest.mark.parametrize(("index", "watts", "field"), [(0, 150.0, "power_limit_w"), (5, 400.0, "gpu_index")])
    def test_set_power_limit_rejected(self, log: Log, index: int, watts: float, field: str) -> None:
        """A limit outside [min, max] or an unknown GPU is refused before NVML is called."""
        nvml = FakeNvml([busy_gpu(0)])
        with pytest.raises(ValidationError) as info:
            open_nvml(log, nvml).set_power_limit(index, watts)
        assert info.value.field == field
        assert nvml.calls[("nvmlDeviceSetPowerManagementLimit", 0)] == 0

    def test_set_power_limit_refused_by_nvml(self, log: Log) -> None:
        """NVML refusing (no permission) becomes a CollectorError naming the GPU."""
        no_permission = fake_pynvml.NVML_ERROR_CODES["NO_PERMISSION"]
        nvml = FakeNvml([busy_gpu(0, errors={"nvmlDeviceSetPowerManagementLimit": no_permission})])
        with pytest.raises(CollectorError, match=r"GPU 0 to 400\.0 W failed: Insufficient Permissions"):
            open_nvml(log, nvml).set_power_limit(0, 400.0)

    def test_close_shuts_down_once(self, log: Log) -> None:
        """close() calls nvmlShutdown once, however often it is called."""
        nvml = FakeNvml(make_gpus(1))
        gpus = open_nvml(log, nvml)
        gpus.close()
        gpus.close()
        assert nvml.shutdowns == 1

    def test_backend_identity(self, log: Log) -> None:
        """The collector names itself nvml and is not simulated."""
        gpus = open_nvml(log, FakeNvml(make_gpus(1)))
        assert isinstance(gpus, NvmlCollector)
        assert (gpus.name, gpus.backend, gpus.simulated) == ("nvml", "nvml", False)


class TestParseGpuReading:
    """The pure conversion from raw NVML values."""

    def test_literal_values(self) -> None:
        """Raw values convert to SI units and 0..1 fractions."""
        raw = {
            "utilization": SimpleNamespace(gpu=50, memory=25),
            "power_usage": 69_123,
            "energy": 1_500,
            "mig_mode": [1, 1],
            "processes": [SimpleNamespace(pid=7, usedGpuMemory=1024)],
        }
        reading = parse_gpu_reading(2, "GPU-x", raw)
        assert (reading.index, reading.uuid) == (2, "GPU-x")
        assert (reading.util_gpu, reading.util_mem, reading.power_w, reading.energy_j) == (0.5, 0.25, 69.123, 1.5)
        assert reading.mig_enabled is True
        assert reading.processes[0].pid == 7 and reading.processes[0].used_mem_bytes == 1024

    def test_missing_fields_are_none(self) -> None:
        """Fields absent from the raw values are None in the reading."""
        reading = parse_gpu_reading(0, "GPU-y", {})
        assert reading.util_gpu is None and reading.power_w is None and reading.mig_enabled is None
        assert reading.processes == () and reading.healthy and reading.health is None


class TestParseTopologyGroups:
    """Grouping GPUs from pairwise closeness."""

    @pytest.mark.parametrize(
        ("count", "linked", "expected"),
        [
            (1, {}, [0]),
            (2, {(0, 1): None}, [-1, -1]),
            (2, {(0, 1): False}, [0, 1]),
            # 0-2 and 1-3 are linked; group numbers follow the lowest index in each group.
            (4, {(0, 2): True, (1, 3): True, (0, 1): False}, [0, 1, 0, 1]),
            # transitive: 0-1 and 1-2 put 0, 1, 2 together.
            (3, {(0, 1): True, (1, 2): True, (0, 2): None}, [0, 0, 0]),
        ],
    )
    def test_groups(self, count: int, linked: dict[tuple[int, int], bool | None], expected: list[int]) -> None:
        """Linked GPUs share a group, unlinked ones do not, all-unknown gives -1."""
        assert parse_topology_groups(count, linked) == expected


class TestEnergyCounter:
    """The energy counter is read every ENERGY_READ_S and carried forward by the power in between."""

    def collector(self, log: Log, nvml: FakeNvml, clock: FakeClock, every_s: float = 10.0) -> NvmlCollector:
        return open_nvml(log, nvml, clock=clock, energy_read_s=every_s)

    def test_read_when_due_carried_by_power_between(self, log: Log) -> None:
        """One counter read per 10 s; in between the counter grows by the trapezoid of the power;
        at the next read it is the counter again; the other fields are read every tick."""
        gpu = busy_gpu(0, power_mw=300_000, energy_mj=1_000_000)
        nvml, clock = FakeNvml([gpu]), FakeClock()
        gpus = self.collector(log, nvml, clock)
        calls = nvml.calls[("nvmlDeviceGetTotalEnergyConsumption", 0)]
        assert gpus.collect()[0].energy_j == pytest.approx(1_000.0)
        clock.t += 1.0
        gpu.power_mw = 500_000
        assert gpus.collect()[0].energy_j == pytest.approx(1_000.0 + 400.0)      # (300 + 500) / 2 W × 1 s
        clock.t += 2.0
        assert gpus.collect()[0].energy_j == pytest.approx(1_400.0 + 1_000.0)    # 500 W × 2 s
        assert nvml.calls[("nvmlDeviceGetTotalEnergyConsumption", 0)] == calls + 1
        assert nvml.calls[("nvmlDeviceGetPowerUsage", 0)] >= 3
        clock.t += 7.0
        gpu.energy_mj = 1_000_000 + 4_000_000                                    # what the GPU really used
        assert gpus.collect()[0].energy_j == pytest.approx(5_000.0)
        assert nvml.calls[("nvmlDeviceGetTotalEnergyConsumption", 0)] == calls + 2

    def test_never_goes_back_unless_the_counter_does(self, log: Log) -> None:
        """A carried value ahead of the counter is held until the estimate from the counter passes it (its
        error is not carried on); a counter that went back (a driver reload) is taken as it is."""
        gpu = busy_gpu(0, power_mw=600_000, energy_mj=0)
        nvml, clock = FakeNvml([gpu]), FakeClock()
        gpus = self.collector(log, nvml, clock)
        gpus.collect()
        clock.t += 9.0
        assert gpus.collect()[0].energy_j == pytest.approx(5_400.0)
        clock.t += 1.0
        gpu.energy_mj = 4_500_000   # the GPU drew less than its power readings said
        assert gpus.collect()[0].energy_j == pytest.approx(5_400.0)   # held
        clock.t += 1.0            # estimated from the counter: 4,500 + 600, still below what was reported
        assert gpus.collect()[0].energy_j == pytest.approx(5_400.0)
        clock.t += 1.0            # 4,500 + 1,200 passes it
        assert gpus.collect()[0].energy_j == pytest.approx(5_700.0)
        clock.t += 10.0
        gpu.energy_mj = 3_000       # below the last read: the counter restarted
        assert gpus.collect()[0].energy_j == pytest.approx(3.0)

    def test_without_power_read_every_tick(self, log: Log) -> None:
        """A GPU without a power reading has nothing to carry the counter by: it is read every tick."""
        nvml, clock = FakeNvml([busy_gpu(0, unsupported={"nvmlDeviceGetPowerUsage"})]), FakeClock()
        gpus = self.collector(log, nvml, clock)
        before = nvml.calls[("nvmlDeviceGetTotalEnergyConsumption", 0)]
        for _ in range(3):
            clock.t += 1.0
            assert gpus.collect()[0].energy_j == pytest.approx(123_456.789)
        assert nvml.calls[("nvmlDeviceGetTotalEnergyConsumption", 0)] == before + 3

    def test_every_tick_when_asked(self, log: Log) -> None:
        """energy_read_s 0 reads the counter at every tick, as the value the GPU gives."""
        gpu = busy_gpu(0)
        nvml, clock = FakeNvml([gpu]), FakeClock()
        gpus = self.collector(log, nvml, clock, every_s=0.0)
        for k in range(3):
            clock.t += 1.0
            gpu.energy_mj = 1_000 * k
            assert gpus.collect()[0].energy_j == pytest.approx(max(1.0 * k, 0.0))

    def test_counter_alone(self) -> None:
        """No value before the first read; a read without power makes the next tick due."""
        counter = EnergyCounter()
        assert counter.carry(1.0, 100_000) is None and counter.due(1.0, 10.0)
        assert counter.read(1.0, 50_000, None) == 50_000
        assert counter.due(2.0, 10.0)
        counter.read(2.0, 60_000, 100_000)
        assert not counter.due(3.0, 10.0) and counter.due(12.0, 10.0)
