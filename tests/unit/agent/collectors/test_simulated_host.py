"""The simulated host beside simulated GPUs: its shape, its readings, how the agent chooses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from agent.collectors import HostReading, SimulatedGpus, default_host_shape, parse_simulate_host
from agent.collectors.simulated_host import HostShape, SimulatedHost, check_simulate_host, scale_host_reading
from agent.config import AgentConfig
from agent.sampler import build_sampler, choose_host_shape, open_gpu_backend
from common.config import load_config
from common.errors import ConfigError
from tests.helpers.fake_pynvml import FakeNvml, make_gpus

Log = structlog.typing.FilteringBoundLogger
GIB = 1 << 30


def make_reading(cpu_util: float = 0.5, mem_used_gib: float = 4, mem_total_gib: float = 16) -> HostReading:
    """A real-host reading with the given CPU utilization and memory."""
    return HostReading(cpu_util=cpu_util, load1=1.0, load5=1.0, load15=1.0,
                       mem_used_bytes=int(mem_used_gib * GIB), mem_total_bytes=int(mem_total_gib * GIB))


class _Fixed:
    """A collector returning one fixed reading."""

    name = "host"

    def __init__(self, reading: HostReading) -> None:
        self.reading = reading

    def collect(self) -> list[HostReading]:
        return [self.reading]


class TestParseSimulateHost:
    """``--simulate-host CORES:MEM_GIB``."""

    @pytest.mark.parametrize(("spec", "cores", "mem_bytes"), [
        ("112:2048", 112, 2048 * GIB),
        (" 4:0.5 ", 4, GIB // 2),
    ])
    def test_valid(self, spec: str, cores: int, mem_bytes: int) -> None:
        """CORES:MEM_GIB parses into cores and bytes (fractional GiB allowed)."""
        assert parse_simulate_host(spec) == HostShape(cores, mem_bytes)

    @pytest.mark.parametrize(("spec", "problem"), [
        ("112", "is not CORES:MEM_GIB"),
        ("a:b", "is not CORES:MEM_GIB"),
        ("0:16", "cores must be"),
        ("8:0", "memory must be above 0"),
        ("-1:16", "is not CORES:MEM_GIB"),
    ])
    def test_invalid_names_the_problem(self, spec: str, problem: str) -> None:
        """A malformed value is a ValueError that says what is wrong."""
        with pytest.raises(ValueError, match=problem):
            parse_simulate_host(spec)

    def test_config_check_accepts_default_and_real(self) -> None:
        """The config check accepts the empty default and 'real' and reports a bad shape."""
        assert check_simulate_host("") is None and check_simulate_host("real") is None
        assert "CORES:MEM_GIB" in str(check_simulate_host("lots"))


class TestDefaultShape:
    """The DGX-like default."""

    def test_eight_gpus_is_a_dgx(self) -> None:
        """Eight GPUs come with 112 cores and 2 TiB, as a DGX H100."""
        assert default_host_shape(8) == HostShape(112, 2048 * GIB)

    def test_scales_with_gpus(self) -> None:
        """Fewer GPUs come with proportionally fewer cores and less memory (at least one GPU's worth)."""
        assert default_host_shape(2) == HostShape(28, 512 * GIB)
        assert default_host_shape(0) == default_host_shape(1)


class TestSimulatedHost:
    """Readings rescaled against the simulated shape."""

    def test_real_busy_cores_over_simulated_cores(self) -> None:
        """Half of 2 real cores busy is 1 busy core, 1/112 of the simulated host."""
        out = scale_host_reading(make_reading(cpu_util=0.5), HostShape(112, 2048 * GIB), real_cores=2)
        assert out.cpu_util == pytest.approx(1 / 112)
        assert (out.mem_total_bytes, out.mem_used_bytes, out.simulated) == (2048 * GIB, 4 * GIB, True)

    def test_caps_at_the_simulated_totals(self) -> None:
        """A simulated host smaller than the machine never reports more than 100 % or its memory."""
        out = scale_host_reading(make_reading(cpu_util=1.0, mem_used_gib=12), HostShape(1, 8 * GIB), real_cores=4)
        assert out.cpu_util == 1.0 and out.mem_used_bytes == 8 * GIB

    def test_collector_wraps_and_marks_proto(self) -> None:
        """The wrapping collector keeps the name, rescales, and its proto says simulated."""
        host = SimulatedHost(_Fixed(make_reading()), HostShape(56, 1024 * GIB), real_cores=2)
        [reading] = host.collect()
        assert host.name == "host" and reading.simulated
        msg = reading.to_proto()
        assert msg.simulated and msg.mem_total_bytes == 1024 * GIB

    def test_real_reading_not_marked(self) -> None:
        """A reading of the real host says simulated false on the wire."""
        assert not make_reading().to_proto().simulated


class TestChooseHostShape:
    """Which host the agent reports."""

    def test_simulated_gpus_default_to_dgx_like(self, log: Log) -> None:
        """Simulated GPUs come with the default simulated host for their count, logged."""
        with capture_logs() as logs:
            shape = choose_host_shape(SimulatedGpus("8xH100-80GB", "n1"), "", log)
        assert shape == HostShape(112, 2048 * GIB)
        assert any(e["event"] == "host_simulated" and e["cpu_cores"] == 112 for e in logs)

    def test_explicit_and_real(self, log: Log) -> None:
        """CORES:MEM_GIB sets the shape; 'real' keeps this machine."""
        gpus = SimulatedGpus("2xL4-24GB", "n1")
        assert choose_host_shape(gpus, "16:64", log) == HostShape(16, 64 * GIB)
        assert choose_host_shape(gpus, "real", log) is None

    def test_real_gpus_keep_the_real_host(self, log: Log) -> None:
        """With NVML GPUs the host is never simulated; an explicit value is ignored with a warning."""
        gpus = open_gpu_backend("nvml", "", log, nvml_module=FakeNvml(make_gpus(2)))
        with capture_logs() as logs:
            assert choose_host_shape(gpus, "16:64", log) is None
        assert [e["log_level"] for e in logs if e["event"] == "host_simulation_ignored"] == ["warning"]

    def test_bad_shape_is_config_error(self, log: Log) -> None:
        """A malformed shape reaching the sampler is one ConfigError naming the flag."""
        with pytest.raises(ConfigError, match="--simulate-host"):
            choose_host_shape(SimulatedGpus("1xT4-16GB", "n1"), "x:y", log)

    def test_sampler_reports_simulated_host(self, log: Log, tmp_path: Path) -> None:
        """A sampler over simulated GPUs sends host telemetry against the simulated shape, marked simulated."""
        sampler = build_sampler(node_id="n1", gpu_backend="simulated", simulate_spec="2xL4-24GB", interval_s=1,
                                log=log, powercap_root=tmp_path, real_cores=2)
        try:
            sample = sampler.sample_once()
        finally:
            sampler.close()
        assert sampler.host_shape == HostShape(28, 512 * GIB)
        assert sample.host.simulated and sample.host.mem_total_bytes == 512 * GIB


class TestSimulateHostConfig:
    """The setting comes from flags, environment and TOML like every agent setting."""

    def test_env_and_flag(self) -> None:
        """GPTRM_SIMULATE_HOST sets it; the flag wins over the environment."""
        env = {"GPTRM_SIMULATE_HOST": "8:32"}
        assert load_config(AgentConfig, [], prog="a", env=env).simulate_host == "8:32"
        assert load_config(AgentConfig, ["--simulate-host", "4:16"], prog="a", env=env).simulate_host == "4:16"

    def test_toml(self, tmp_path: Path) -> None:
        """The TOML key simulate_host sets it."""
        f = tmp_path / "agent.toml"
        f.write_text('simulate_host = "64:512"\n')
        assert load_config(AgentConfig, ["--config", str(f)], prog="a", env={}).simulate_host == "64:512"

    def test_bad_value_names_field(self) -> None:
        """A malformed value stops the config with an error naming the setting."""
        with pytest.raises(ConfigError, match=r"simulate.host"):
            load_config(AgentConfig, ["--simulate-host", "many"], prog="a", env={})
