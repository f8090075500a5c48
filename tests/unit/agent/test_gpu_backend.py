"""Choosing the GPU backend once at start-up: auto, nvml, simulated."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from agent.collectors import NvmlCollector, SimulatedGpus
from agent.health import HealthOptions
from agent.sampler import build_sampler, open_gpu_backend
from common.errors import ConfigError
from tests.helpers import fake_pynvml
from tests.helpers.fake_pynvml import FakeNvml, make_gpus

Log = structlog.typing.FilteringBoundLogger
LIBRARY_NOT_FOUND = fake_pynvml.NVML_ERROR_CODES["LIBRARY_NOT_FOUND"]


def missing_nvml() -> FakeNvml:
    """A pynvml whose nvmlInit fails as on a machine without the NVIDIA driver."""
    return FakeNvml([], init_error=LIBRARY_NOT_FOUND)


class TestOpenGpuBackend:
    """``--gpu-backend`` semantics."""

    def test_auto_uses_nvml_when_it_works(self, log: Log) -> None:
        """auto picks NVML when nvmlInit succeeds."""
        gpus = open_gpu_backend("auto", "", log, nvml_module=FakeNvml(make_gpus(4)))
        assert isinstance(gpus, NvmlCollector)
        assert (gpus.backend, gpus.simulated, len(gpus.devices())) == ("nvml", False, 4)

    def test_auto_falls_back_loudly(self, log: Log) -> None:
        """auto without NVML simulates the spec's GPUs and warns that they are simulated."""
        with capture_logs() as logs:
            gpus = open_gpu_backend("auto", "2xL4-24GB", log, node_id="n3", nvml_module=missing_nvml())
        assert isinstance(gpus, SimulatedGpus)
        assert [d.uuid for d in gpus.devices()] == ["GPU-sim-n3-0", "GPU-sim-n3-1"]
        [warning] = [e for e in logs if e["event"] == "gpu_backend_fell_back"]
        assert warning["log_level"] == "warning" and warning["backend"] == "simulated"
        assert "NVML Shared Library Not Found" in str(warning["reason"]) and "SIMULATED" in str(warning["reason"])

    def test_auto_without_pynvml_module(self, log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
        """auto falls back too when nvidia-ml-py is not installed at all."""
        monkeypatch.setitem(sys.modules, "pynvml", None)
        assert open_gpu_backend("auto", "1xT4-16GB", log).simulated

    def test_auto_default_spec(self, log: Log) -> None:
        """Falling back with no spec simulates the default 8xH100-80GB."""
        gpus = open_gpu_backend("auto", "", log, nvml_module=missing_nvml())
        assert [d.model for d in gpus.devices()] == ["H100-80GB"] * 8

    def test_nvml_without_nvml_fails_fast(self, log: Log) -> None:
        """nvml without NVML is a one-line ConfigError naming the flag."""
        with pytest.raises(ConfigError, match="--gpu-backend nvml: NVML unavailable") as info:
            open_gpu_backend("nvml", "", log, nvml_module=missing_nvml())
        assert "\n" not in str(info.value)

    def test_nvml_without_module_fails_fast(self, log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
        """nvml with nvidia-ml-py missing is a ConfigError, not an ImportError."""
        monkeypatch.setitem(sys.modules, "pynvml", None)
        with pytest.raises(ConfigError, match="cannot import pynvml"):
            open_gpu_backend("nvml", "", log)

    def test_simulated_never_touches_nvml(self, log: Log) -> None:
        """simulated does not even initialise NVML when it is there."""
        nvml = FakeNvml(make_gpus(1))
        gpus = open_gpu_backend("simulated", "4xA100-80GB", log, nvml_module=nvml)
        assert gpus.simulated and len(gpus.devices()) == 4
        assert not nvml.initialised

    def test_bad_spec(self, log: Log) -> None:
        """A malformed --simulate-gpus is a ConfigError naming the flag and the entry."""
        with pytest.raises(ConfigError, match=r"--simulate-gpus '8xH100': bad GPU spec entry '8xH100'"):
            open_gpu_backend("simulated", "8xH100", log)

    def test_simulated_faults_refused_on_real_gpus(self, log: Log) -> None:
        """--simulate-faults on real GPUs is a ConfigError, and NVML is shut down again."""
        nvml = FakeNvml(make_gpus(1))
        with pytest.raises(ConfigError, match="--simulate-faults /tmp/f: faults are simulated on simulated GPUs only"):
            open_gpu_backend("auto", "", log, nvml_module=nvml, health=HealthOptions(simulate_faults="/tmp/f"))
        assert not nvml.initialised and nvml.event_sets[0].freed

    def test_simulated_faults_on_simulated_gpus(self, log: Log, tmp_path: Path) -> None:
        faults = tmp_path / "faults.jsonl"
        faults.write_text('{"gpu": 1, "xid": 79}\n')
        gpus = open_gpu_backend("simulated", "2xL4-24GB", log, health=HealthOptions(simulate_faults=str(faults)))
        assert [r.healthy for r in gpus.collect()] == [True, False]

    def test_unknown_backend(self, log: Log) -> None:
        """A backend name outside auto|nvml|simulated is a ConfigError."""
        with pytest.raises(ConfigError, match="expected one of auto, nvml, simulated"):
            open_gpu_backend("cuda", "", log)


class TestBuildSampler:
    """Wiring the backend and the host collectors together."""

    def test_simulated_sampler(self, log: Log, tmp_path: Path) -> None:
        """A sampler built for simulated GPUs samples them and the host."""
        sampler = build_sampler(
            node_id="n9",
            gpu_backend="simulated",
            simulate_spec="2xA100-40GB",
            interval_s=1.0,
            log=log,
            data_paths=[str(tmp_path)],
            powercap_root=tmp_path / "no-rapl",
        )
        sample = sampler.sample_once()
        assert sample.simulated and len(sample.gpus) == 2
        assert sample.host.mem_total_bytes > 0 and sample.host.disks[0].path == str(tmp_path)
        assert [g.uuid for g in sampler.inventory()] == ["GPU-sim-n9-0", "GPU-sim-n9-1"]
        sampler.close()
