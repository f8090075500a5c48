"""The NVML collector's topology: NVLink peers and NVSwitches, PCIe levels, NUMA nodes, CPU
affinity, and how each query failing leaves its fact unknown (fake pynvml, no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from agent.collectors.nvml import open_nvml
from common.topology import LinkLevel, topology_from_gpus
from tests.helpers import fake_pynvml
from tests.helpers.fake_pynvml import FakeGpu, FakeNvml

Log = structlog.typing.FilteringBoundLogger
NV, SWITCH, SOCKET, CROSS = (int(LinkLevel.NVLINK), int(LinkLevel.SAME_SWITCH), int(LinkLevel.SAME_SOCKET),
                             int(LinkLevel.CROSS_SOCKET))


def pairs_server(**overrides: object) -> list[FakeGpu]:
    """A two-socket PCIe server: GPUs 0-3 on NUMA node 0 (CPUs 0-15), 4-7 on node 1 (CPUs 16-31),
    each on its own PCIe switch, NVLink-bridged in pairs with four links."""
    return [
        FakeGpu(index=i, switch=i, numa_node=i // 4, cpus=tuple(range(16 * (i // 4), 16 * (i // 4) + 16)),
                nvlink_peers={i ^ 1: 4}, **overrides)  # type: ignore[arg-type]
        for i in range(8)
    ]


def links_of(device: object) -> dict[int, tuple[int, int]]:
    return {peer: (level, n) for peer, level, n in device.links}  # type: ignore[attr-defined]


class TestTopology:
    """What open_nvml reads into each GpuDevice."""

    def test_pairs_server(self, log: Log, tmp_path: Path) -> None:
        """Bridged pairs are NVLink (NV4), the rest of a socket NODE, the other socket SYS."""
        devices = open_nvml(log, FakeNvml(pairs_server()), sysfs=tmp_path).devices()
        assert links_of(devices[0]) == {1: (NV, 4), 2: (SOCKET, 0), 3: (SOCKET, 0), 4: (CROSS, 0), 5: (CROSS, 0),
                                        6: (CROSS, 0), 7: (CROSS, 0)}
        assert [d.numa_node for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
        assert devices[5].cpu_affinity == tuple(range(16, 32))
        topo = topology_from_gpus(d.to_proto() for d in devices)
        assert topo is not None and topo.islands(0) == [(0, 1), (2, 3), (4, 5), (6, 7)]

    def test_nvswitch_board(self, log: Log, tmp_path: Path) -> None:
        """GPUs whose links all go to NVSwitches are NVLinked to each other (NV18)."""
        gpus = [FakeGpu(index=i, switch=i, numa_node=i // 4, nvswitch_links=18) for i in range(8)]
        devices = open_nvml(log, FakeNvml(gpus), sysfs=tmp_path).devices()
        assert all(links_of(d)[p] == (NV, 18) for d in devices for p in range(8) if p != d.index)

    def test_same_pcie_switch(self, log: Log, tmp_path: Path) -> None:
        """Two GPUs behind one PCIe switch without NVLink: PIX (same switch); no warning for missing NVLink."""
        with capture_logs() as logs:
            devices = open_nvml(log, FakeNvml([FakeGpu(index=0), FakeGpu(index=1)]), sysfs=tmp_path).devices()
        assert links_of(devices[0]) == {1: (SWITCH, 0)}
        assert not [e for e in logs if e["event"] == "gpu_topology_unknown"]

    def test_cpu_affinity_unsupported(self, log: Log, tmp_path: Path) -> None:
        """CPU affinity NotSupported on one GPU: its CPUs are unknown, the rest still read, logged once."""
        gpus = pairs_server()
        gpus[3].unsupported = {"nvmlDeviceGetCpuAffinity"}
        with capture_logs() as logs:
            collector = open_nvml(log, FakeNvml(gpus), sysfs=tmp_path)
            collector.collect()
            collector.collect()
        devices = collector.devices()
        assert devices[3].cpu_affinity == () and devices[3].numa_node == 0
        assert devices[2].cpu_affinity == tuple(range(16))
        warned = [e for e in logs if e["event"] == "gpu_topology_unknown"]
        assert [(e["gpu_index"], e["failed"]) for e in warned] == [(3, ["cpu_affinity"])]
        assert warned[0]["reason"] == "Not Supported"

    def test_common_ancestor_error(self, log: Log, tmp_path: Path) -> None:
        """An unknown error from the common-ancestor query: PCIe links unknown, NVLink pairs still known."""
        gpus = pairs_server(errors={"nvmlDeviceGetTopologyCommonAncestor": fake_pynvml.NVML_ERROR_CODES["UNKNOWN"]})
        with capture_logs() as logs:
            devices = open_nvml(log, FakeNvml(gpus), sysfs=tmp_path).devices()
        assert links_of(devices[0]) == {1: (NV, 4)}
        assert {e["gpu_index"] for e in logs if e["event"] == "gpu_topology_unknown"} == set(range(8))

    def test_nvlink_state_error(self, log: Log, tmp_path: Path) -> None:
        """NvLinkState failing with another error: that GPU's NVLinks unknown; the bridge is seen from its peer."""
        gpus = pairs_server()
        gpus[0].errors = {"nvmlDeviceGetNvLinkState": fake_pynvml.NVML_ERROR_CODES["UNKNOWN"]}
        with capture_logs() as logs:
            devices = open_nvml(log, FakeNvml(gpus), sysfs=tmp_path).devices()
        assert links_of(devices[0])[1] == (NV, 4)
        assert [e["failed"] for e in logs if e["event"] == "gpu_topology_unknown"] == [["nvlink"]]

    def test_numa_from_sysfs(self, log: Log, tmp_path: Path) -> None:
        """Memory affinity not supported: the NUMA node comes from sysfs, -1 when sysfs has none."""
        gpus = pairs_server(unsupported={"nvmlDeviceGetMemoryAffinity"})
        device_dir = tmp_path / "bus" / "pci" / "devices" / "0000:1d:00.0"   # GPU 5's bus id, as sysfs names it
        device_dir.mkdir(parents=True)
        (device_dir / "numa_node").write_text("1\n")
        with capture_logs() as logs:
            devices = open_nvml(log, FakeNvml(gpus), sysfs=tmp_path).devices()
        assert devices[5].numa_node == 1
        assert devices[4].numa_node == -1
        assert {e["gpu_index"] for e in logs if e["event"] == "gpu_topology_unknown"} == set(range(8)) - {5}

    def test_lost_gpu_at_open(self, log: Log, tmp_path: Path) -> None:
        """A GPU lost while its topology is read: everything about it unknown, no crash."""
        gpus = pairs_server()
        gpus[7].lost = True
        devices = open_nvml(log, FakeNvml(gpus), sysfs=tmp_path).devices()
        assert (devices[7].numa_node, devices[7].cpu_affinity) == (-1, ())
        assert 7 not in links_of(devices[6]) or links_of(devices[6])[7][0] != NV
        assert links_of(devices[4])[5] == (NV, 4)

    def test_on_the_wire(self, log: Log, tmp_path: Path) -> None:
        """The inventory message carries NUMA node + 1, the CPUs and one link per peer."""
        msg = open_nvml(log, FakeNvml(pairs_server()), sysfs=tmp_path).devices()[4].to_proto()
        assert msg.numa_node_plus_one == 2 and list(msg.cpu_affinity) == list(range(16, 32))
        assert [(link.peer_index, link.level, link.nvlinks) for link in msg.links][:2] == [(0, CROSS, 0), (1, CROSS, 0)]
        assert (msg.links[4].peer_index, msg.links[4].level, msg.links[4].nvlinks) == (5, NV, 4)


class TestFakeMatchesRealModule:
    """The topology constants the collector reads have pynvml's values."""

    def test_constants(self) -> None:
        """Link count, feature state, affinity scope and topology levels."""
        real = pytest.importorskip("pynvml", reason="nvidia-ml-py not installed")
        for name in ("NVML_FEATURE_ENABLED", "NVML_AFFINITY_SCOPE_NODE", "NVML_TOPOLOGY_SINGLE",
                     "NVML_TOPOLOGY_MULTIPLE", "NVML_TOPOLOGY_NODE", "NVML_TOPOLOGY_SYSTEM"):
            assert getattr(FakeNvml, name) == getattr(real, name), name
        for name in ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetCpuAffinity",
                     "nvmlDeviceGetMemoryAffinity", "nvmlDeviceGetTopologyCommonAncestor"):
            assert callable(getattr(real, name)) and callable(getattr(FakeNvml, name)), name
