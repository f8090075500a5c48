"""Simulated GPUs: the spec grammar and the deterministic power/utilization model."""

from __future__ import annotations

import pytest

from agent.collectors.simulated import (
    SimGpuSpec,
    SimulatedGpus,
    model_for,
    parse_sim_load,
    parse_simulate_spec,
    simulated_power_w,
)
from common.errors import ValidationError
from tests.helpers.clock import FakeClock

GIB = 1 << 30


def make_gpus(clock: FakeClock, spec: str = "8xH100-80GB") -> SimulatedGpus:
    """Simulated GPUs without random variation, so expected values are exact."""
    return SimulatedGpus(spec, "n1", clock=clock, jitter=0.0)


class TestParseSimulateSpec:
    """The ``--simulate-gpus`` grammar."""

    def test_single_entry(self) -> None:
        """``8xH100-80GB`` is eight H100s with 80 GiB each."""
        gpus = parse_simulate_spec("8xH100-80GB")
        assert gpus == [SimGpuSpec("H100", 80, 0)] * 8

    def test_mixed_entries(self) -> None:
        """Comma-separated entries append in order, each entry its own group."""
        gpus = parse_simulate_spec("4xA100-40GB, 2xl4-24gb")
        assert [g.label for g in gpus] == ["A100-40GB"] * 4 + ["L4-24GB"] * 2
        assert [g.group for g in gpus] == [0, 0, 0, 0, 1, 1]

    @pytest.mark.parametrize(
        ("spec", "problem"),
        [
            ("", "empty GPU spec"),
            ("8H100-80GB", "bad GPU spec entry '8H100-80GB'"),
            ("8xH100", "bad GPU spec entry '8xH100'"),
            ("axH100-80GB", "bad GPU spec entry 'axH100-80GB'"),
            ("8xH100-80GB,", "bad GPU spec entry ''"),
            ("0xH100-80GB", "GPU count and memory must be at least 1"),
            ("2xT4-0GB", "GPU count and memory must be at least 1"),
            ("300xT4-16GB", "at most 256 per node"),
        ],
    )
    def test_bad_specs(self, spec: str, problem: str) -> None:
        """A malformed spec is a ValueError naming the offending entry or limit."""
        with pytest.raises(ValueError, match=problem):
            parse_simulate_spec(spec)


class TestPowerModel:
    """The per-model power table and the power line."""

    @pytest.mark.parametrize(
        ("spec", "idle_w", "max_w"),
        [
            ("H100-80GB", 70, 700),
            ("A100-80GB", 50, 400),
            ("L4-24GB", 16, 72),
            ("V100-32GB", 35, 300),  # by model alone
            ("H100-94GB", 70, 700),  # another memory size of a known model
            ("X9-12GB", 10, 70),  # unknown model: by memory
            ("X9-192GB", 70, 700),
        ],
    )
    def test_model_table(self, spec: str, idle_w: float, max_w: float) -> None:
        """Known models use the table; unknown ones fall back by memory size."""
        [gpu] = parse_simulate_spec(f"1x{spec}")
        model = model_for(gpu)
        assert (model.idle_w, model.max_w) == (idle_w, max_w)

    @pytest.mark.parametrize(
        ("util", "limit_w", "expected"),
        [
            (0.0, 700, 70.0),
            (0.5, 700, 385.0),  # 70 + (700 - 70) * 0.5
            (1.0, 700, 700.0),
            (1.0, 400, 400.0),  # capped by the limit
        ],
    )
    def test_power_line(self, util: float, limit_w: float, expected: float) -> None:
        """Power is linear in utilization from idle to max, capped by the limit."""
        assert simulated_power_w(model_for(SimGpuSpec("H100", 80, 0)), util, limit_w) == pytest.approx(expected)


class TestSimulatedGpus:
    """Behaviour of the simulated backend."""

    def test_inventory(self, clock: FakeClock) -> None:
        """Deterministic UUIDs, model, memory, power range, all marked simulated."""
        gpus = make_gpus(clock, "2xA100-40GB")
        devices = gpus.devices()
        assert [d.uuid for d in devices] == ["GPU-sim-n1-0", "GPU-sim-n1-1"]
        assert devices[0].model == "A100-40GB" and devices[0].mem_total_bytes == 40 * GIB
        assert (devices[0].power_min_w, devices[0].power_max_w, devices[0].power_limit_w) == (100, 400, 400)
        assert all(d.simulated for d in devices)
        assert (gpus.backend, gpus.simulated) == ("simulated", True)

    def test_idle(self, clock: FakeClock) -> None:
        """With nothing placed every GPU idles at the model's idle power and holds no memory."""
        readings = make_gpus(clock).collect()
        assert {(r.util_gpu, r.power_w, r.mem_used_bytes) for r in readings} == {(0.0, 70.0, 0)}
        assert all(r.simulated and r.healthy for r in readings)

    def test_placement_drives_util_memory_power(self, clock: FakeClock) -> None:
        """A placed task sets utilization, memory and power on its GPUs only."""
        gpus = make_gpus(clock)
        gpus.place("t1", [0, 1], util_per_gpu=0.5, mem_bytes_per_gpu=30 * GIB, pids=[321])
        readings = gpus.collect()
        assert (readings[0].util_gpu, readings[0].mem_used_bytes, readings[0].power_w) == (0.5, 30 * GIB, 385.0)
        assert readings[0].processes[0].pid == 321 and readings[0].processes[0].used_mem_bytes == 30 * GIB
        assert readings[2].power_w == 70.0 and readings[2].processes == ()

    def test_tasks_share_a_gpu(self, clock: FakeClock) -> None:
        """Tasks on one GPU add up, utilization capped at 1 and memory at the GPU's size."""
        gpus = make_gpus(clock)
        gpus.place("a", [0], util_per_gpu=0.7, mem_bytes_per_gpu=50 * GIB)
        gpus.place("b", [0], util_per_gpu=0.6, mem_bytes_per_gpu=50 * GIB)
        [first, *_] = gpus.collect()
        assert (first.util_gpu, first.mem_used_bytes, first.power_w) == (1.0, 80 * GIB, 700.0)

    def test_remove(self, clock: FakeClock) -> None:
        """Removing a task returns its GPUs to idle; removing twice is harmless."""
        gpus = make_gpus(clock)
        gpus.place("t1", [3], util_per_gpu=1.0, mem_bytes_per_gpu=GIB)
        gpus.remove("t1")
        gpus.remove("t1")
        assert gpus.collect()[3].power_w == 70.0

    def test_power_limit_caps_power(self, clock: FakeClock) -> None:
        """A lower limit caps power, slows the SM clock and shows in the inventory."""
        gpus = make_gpus(clock)
        gpus.place("t1", [0, 1], util_per_gpu=1.0, mem_bytes_per_gpu=0)
        gpus.set_power_limit(0, 385.0)
        first, second = gpus.collect()[:2]
        assert (first.power_w, first.power_limit_w) == (385.0, 385.0)
        assert first.sm_clock_mhz < second.sm_clock_mhz == 1980
        assert gpus.devices()[0].power_limit_w == 385.0

    @pytest.mark.parametrize(
        ("index", "watts", "field"), [(0, 100.0, "power_limit_w"), (0, 701.0, "power_limit_w"), (8, 300.0, "gpu_index")]
    )
    def test_power_limit_out_of_range(self, clock: FakeClock, index: int, watts: float, field: str) -> None:
        """Limits outside [min, max] or unknown GPUs are refused with the allowed range."""
        with pytest.raises(ValidationError, match=r"\[200|does not exist") as info:
            make_gpus(clock).set_power_limit(index, watts)
        assert info.value.field == field

    def test_energy_integrates_power(self, clock: FakeClock) -> None:
        """The energy counter grows by power times elapsed time."""
        gpus = make_gpus(clock, "1xH100-80GB")
        gpus.collect()
        clock.advance(10.0)
        assert gpus.collect()[0].energy_j == pytest.approx(700.0)  # 70 W idle for 10 s
        gpus.place("t1", [0], util_per_gpu=1.0, mem_bytes_per_gpu=0)
        clock.advance(2.0)
        assert gpus.collect()[0].energy_j == pytest.approx(700.0 + 1400.0)  # then 700 W for 2 s

    def test_deterministic_variation(self, clock: FakeClock) -> None:
        """Two agents with the same node id see the same small variation, within its bounds."""
        a = SimulatedGpus("2xL4-24GB", "n7", clock=clock)
        b = SimulatedGpus("2xL4-24GB", "n7", clock=clock)
        for gpus in (a, b):
            gpus.place("t", [0], util_per_gpu=0.5, mem_bytes_per_gpu=0)
        utils_a = [a.collect()[0].util_gpu for _ in range(5)]
        utils_b = [b.collect()[0].util_gpu for _ in range(5)]
        assert utils_a == utils_b
        assert all(0.48 <= u <= 0.52 for u in utils_a)  # type: ignore[operator]

    def test_unhealthy_gpu(self, clock: FakeClock) -> None:
        """A GPU marked unhealthy reports it lost, then recovers when marked healthy."""
        gpus = make_gpus(clock)
        gpus.set_healthy(2, False)
        assert (gpus.collect()[2].healthy, gpus.collect()[2].health_reason) == (False, "gpu lost (simulated)")
        gpus.set_healthy(2, True)
        assert gpus.collect()[2].healthy

    @pytest.mark.parametrize(
        ("indices", "util", "mem", "field"),
        [
            ([8], 0.5, 0, "gpu_indices"),
            ([0, 0], 0.5, 0, "gpu_indices"),
            ([0], 1.5, 0, "util_per_gpu"),
            ([0], 0.5, -1, "mem_bytes_per_gpu"),
        ],
    )
    def test_place_validation(self, clock: FakeClock, indices: list[int], util: float, mem: int, field: str) -> None:
        """Bad placements are refused naming the offending argument."""
        with pytest.raises(ValidationError) as info:
            make_gpus(clock).place("t", indices, util_per_gpu=util, mem_bytes_per_gpu=mem)
        assert info.value.field == field


class TestFollowsLoad:
    """A task's utilization follows its own load: idle while it sleeps, busy while it computes."""

    def test_idle_until_its_processes_are_busy(self, clock: FakeClock) -> None:
        """Placed following its load, a task leaves its GPUs idle (idle power) until its CPU usage is observed;
        one busy core over two GPUs is half of each; a fixed placement is unchanged."""
        gpus = make_gpus(clock)
        gpus.place("t", [0, 1], 1.0, 10 * GIB, follows_load=True)
        gpus.place("fixed", [2], 0.9, 0)
        readings = gpus.collect()
        assert [r.util_gpu for r in readings[:3]] == [0.0, 0.0, 0.9]
        assert readings[0].power_w == model_for(SimGpuSpec("H100", 80, 0)).idle_w and readings[0].simulated
        gpus.observe_load({"t": 1.0, "fixed": 0.0, "unknown": 3.0})
        assert [r.util_gpu for r in gpus.collect()[:3]] == [0.5, 0.5, 0.9]
        gpus.observe_load({"t": 8.0})   # capped at a fully busy GPU
        assert [r.util_gpu for r in gpus.collect()[:2]] == [1.0, 1.0]

    def test_a_shared_gpu_reaches_its_share(self, clock: FakeClock) -> None:
        """A task holding half a GPU fills half of it at full load."""
        gpus = make_gpus(clock)
        gpus.place("half", [0], 0.5, 0, follows_load=True)
        gpus.observe_load({"half": 2.0})
        assert gpus.collect()[0].util_gpu == 0.5

    @pytest.mark.parametrize(("text", "load"), [("0.7", 0.7), (" 70% ", 0.7), ("0", 0.0), ("100%", 1.0)])
    def test_declared_load(self, text: str, load: float) -> None:
        """GPTRM_SIM_LOAD takes a fraction or a percentage."""
        assert parse_sim_load(text) == pytest.approx(load)

    @pytest.mark.parametrize("text", ["busy", "1.5", "-1%", "nan", ""])
    def test_bad_declared_load(self, text: str) -> None:
        """What is not a load in 0..1 is refused naming the variable."""
        with pytest.raises(ValueError, match="GPTRM_SIM_LOAD"):
            parse_sim_load(text)
