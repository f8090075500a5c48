"""Readings → protobuf at the edge (``to_proto`` helpers in agent.collectors.base)."""

from __future__ import annotations

from agent.collectors.base import (
    DiskReading,
    GpuDevice,
    GpuProcessReading,
    GpuReading,
    HostReading,
    TaskUsage,
    telemetry_to_proto,
)


def host_reading(**overrides: object) -> HostReading:
    """A host reading with small literal values."""
    values: dict[str, object] = {
        "cpu_util": 0.25,
        "load1": 1.0,
        "load5": 0.5,
        "load15": 0.25,
        "mem_used_bytes": 4,
        "mem_total_bytes": 16,
    }
    values.update(overrides)
    return HostReading(**values)  # type: ignore[arg-type]


class TestGpuReadingToProto:
    """GpuReading → GpuSample."""

    def test_absent_fields_stay_absent(self) -> None:
        """None fields are not set, so the receiver can tell 'unsupported' from zero."""
        msg = GpuReading(index=1, uuid="GPU-a", power_w=0.0, healthy=False, health_reason="gpu is lost").to_proto()
        assert msg.HasField("power_w") and msg.power_w == 0.0
        assert not msg.HasField("energy_j") and not msg.HasField("util_gpu")
        assert (msg.index, msg.uuid, msg.healthy, msg.health_reason) == (1, "GPU-a", False, "gpu is lost")

    def test_processes(self) -> None:
        """Processes carry pid and memory; unknown memory is sent as 0."""
        reading = GpuReading(index=0, uuid="GPU-b", processes=(GpuProcessReading(5, 100), GpuProcessReading(6)))
        assert [(p.pid, p.used_mem_bytes) for p in reading.to_proto().processes] == [(5, 100), (6, 0)]


class TestGpuDeviceToProto:
    """GpuDevice → GpuInfo."""

    def test_fields(self) -> None:
        """Every inventory field reaches the message."""
        device = GpuDevice(
            index=3,
            uuid="GPU-c",
            model="H100-80GB",
            mem_total_bytes=80,
            power_limit_w=500.0,
            power_min_w=200.0,
            power_max_w=700.0,
            power_default_w=700.0,
            pci_bus_id="0000:1b:00.0",
            topology_group=1,
            mig_enabled=True,
        )
        msg = device.to_proto()
        assert (msg.index, msg.uuid, msg.model, msg.mem_total_bytes) == (3, "GPU-c", "H100-80GB", 80)
        assert (msg.power_limit_w, msg.power_min_w, msg.power_max_w, msg.power_default_w) == (500, 200, 700, 700)
        assert (msg.pci_bus_id, msg.topology_group, msg.mig_enabled) == ("0000:1b:00.0", 1, True)


class TestTelemetryToProto:
    """One tick's readings → TelemetrySample."""

    def test_full_sample(self) -> None:
        """GPUs, host, disks, tasks, CPU power and the simulated flag all arrive."""
        host = host_reading(
            disks=(DiskReading("/data", 100, 40, 7, 8),),
            tasks=(TaskUsage("t1", cpu_util=1.5, rss_bytes=9, gpu_mem_bytes=3, energy_share_j=2.0),),
            net_rx_bytes_total=11,
        )
        msg = telemetry_to_proto(12.5, [GpuReading(index=0, uuid="GPU-a")], host, 95.0, simulated=True)
        assert (msg.time_unix_s, msg.simulated, len(msg.gpus)) == (12.5, True, 1)
        assert msg.host.cpu_util == 0.25 and msg.host.cpu_power_w == 95.0 and msg.host.net_rx_bytes_total == 11
        assert msg.host.disks[0].path == "/data" and msg.host.disks[0].write_bytes_total == 8
        task = msg.host.tasks[0]
        assert (task.task_id, task.cpu_util, task.rss_bytes, task.gpu_mem_bytes, task.energy_share_j) == (
            "t1",
            1.5,
            9,
            3,
            2.0,
        )

    def test_unknown_cpu_power_absent(self) -> None:
        """Without RAPL the CPU power field is absent, not zero."""
        msg = telemetry_to_proto(1.0, [], host_reading(), None, simulated=False)
        assert not msg.host.HasField("cpu_power_w")
        assert not msg.simulated

    def test_host_missing(self) -> None:
        """When the host collector failed, the sample still carries the GPUs and CPU power."""
        msg = telemetry_to_proto(1.0, [GpuReading(index=0, uuid="GPU-a")], None, 50.0, simulated=False)
        assert len(msg.gpus) == 1 and msg.host.cpu_power_w == 50.0
