"""Simulated GPU topologies: the presets, ``auto``, CPUs that exist, and the flag."""

from __future__ import annotations

import os

import pytest
import structlog

from agent import config
from agent.collectors.simulated import SimulatedGpus
from agent.sampler import open_gpu_backend
from common.errors import ConfigError
from common.topology import LinkLevel, topology_from_gpus

Log = structlog.typing.FilteringBoundLogger
NV = int(LinkLevel.NVLINK)


def links(gpus: SimulatedGpus, index: int) -> dict[int, tuple[int, int]]:
    return {peer: (level, n) for peer, level, n in gpus.devices()[index].links}


class TestPresets:
    """What each topology gives the inventory."""

    def test_default_h100_is_hgx(self) -> None:
        """Eight simulated H100s are an HGX board: every pair NV18, sockets 0-3 and 4-7, still simulated."""
        gpus = SimulatedGpus("8xH100-80GB", "n1", cpus=range(32))
        assert gpus.topology == "hgx"
        assert all(links(gpus, i)[j] == (NV, 18) for i in range(8) for j in range(8) if i != j)
        devices = gpus.devices()
        assert [d.numa_node for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
        assert devices[0].cpu_affinity == tuple(range(16)) and devices[7].cpu_affinity == tuple(range(16, 32))
        assert all(d.simulated for d in devices)

    def test_pcie_nvlink_pairs(self) -> None:
        """Bridged pairs NV4, the rest of a socket NODE, the other socket SYS; islands are the pairs."""
        gpus = SimulatedGpus("8xH100-80GB", "n1", topology="pcie-nvlink-pairs", cpus=range(32))
        assert links(gpus, 2) == {3: (NV, 4), 0: (int(LinkLevel.SAME_SOCKET), 0), 1: (int(LinkLevel.SAME_SOCKET), 0),
                                  **{j: (int(LinkLevel.CROSS_SOCKET), 0) for j in range(4, 8)}}
        topo = topology_from_gpus(d.to_proto() for d in gpus.devices())
        assert topo is not None and topo.islands(0) == [(0, 1), (2, 3), (4, 5), (6, 7)]

    @pytest.mark.parametrize(("spec", "expected"), [("4xL4-24GB", "pcie"), ("1xH100-80GB", "none"),
                                                    ("4xA100-40GB,2xL4-24GB", "none"), ("4xA100-80GB", "hgx")])
    def test_auto(self, spec: str, expected: str) -> None:
        """auto: hgx for several SXM-class GPUs of one model, pcie for other models, none otherwise."""
        assert SimulatedGpus(spec, "n1").topology == expected

    def test_none_reports_nothing(self) -> None:
        """none: no NUMA node, CPUs or links."""
        device = SimulatedGpus("2xL4-24GB", "n1", topology="none").devices()[0]
        assert (device.numa_node, device.cpu_affinity, device.links) == (-1, (), ())

    def test_affinity_within_usable_cpus(self) -> None:
        """Without a CPU list the affinity only names CPUs this process may run on."""
        usable = os.sched_getaffinity(0)
        for device in SimulatedGpus("8xH100-80GB", "n1", topology="pcie-nvlink-pairs").devices():
            assert device.cpu_affinity and set(device.cpu_affinity) <= usable

    def test_unknown_name(self, log: Log) -> None:
        """A bad name is a one-line ConfigError naming the flag."""
        with pytest.raises(ConfigError, match="--simulate-topology 'ring'"):
            open_gpu_backend("simulated", "2xL4-24GB", log, simulate_topology="ring")

    def test_flag(self) -> None:
        """The agent flag reaches the configuration."""
        cfg = config.load(["--simulate-topology", "pcie-nvlink-pairs", "--insecure"])
        assert cfg.simulate_topology == "pcie-nvlink-pairs"
        assert config.load(["--insecure"]).simulate_topology == "auto"
