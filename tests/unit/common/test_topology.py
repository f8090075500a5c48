"""GPU topology: islands from links, the inventory round trip, CPU lists and link codes."""

from __future__ import annotations

import pytest

from agent.collectors.base import GpuDevice
from common.topology import (
    LinkLevel,
    build_topology,
    cpu_list_union,
    format_cpu_list,
    link_code,
    parse_cpu_list,
    simulated_topology,
    topology_from_facts,
    topology_from_gpus,
)


class TestIslands:
    """Single-linkage islands by link distance, nested from closest to the whole node."""

    def test_hgx_islands_are_sockets_then_node(self) -> None:
        """All-NVLink boards split by socket first."""
        topo = topology_from_facts(simulated_topology("hgx", 8, range(4)))
        assert topo is not None
        islands = [topo.islands(k) for k in range(len(topo.island_of))]
        assert islands == [[(0, 1, 2, 3), (4, 5, 6, 7)], [tuple(range(8))]]
        assert topo.cpus[0] == (0, 1) and topo.cpus[7] == (2, 3)

    def test_nothing_known_is_none(self) -> None:
        """No link known: no topology, the allocator keeps its memory best fit."""
        assert topology_from_facts(simulated_topology("none", 4, range(4))) is None
        assert build_topology([0, 0], [(), ()], {(0, 1): (int(LinkLevel.UNKNOWN), 0)}) is None

    def test_one_cpu_host(self) -> None:
        """On a host with one CPU both sockets' GPUs get that CPU."""
        facts = simulated_topology("pcie-nvlink-pairs", 4, [0])
        assert {f.cpu_affinity for f in facts} == {(0,)}

    def test_unknown_name(self) -> None:
        """A name that is not a preset is refused with the choices."""
        with pytest.raises(ValueError, match="hgx"):
            simulated_topology("torus", 8, range(2))

    def test_inventory_round_trip(self) -> None:
        """What the agent sends (GpuInfo) gives the coordinator the same topology."""
        facts = simulated_topology("pcie-nvlink-pairs", 8, range(16))
        gpus = [
            GpuDevice(index=i, uuid=f"u{i}", model="m", mem_total_bytes=1, numa_node=f.numa_node,
                      cpu_affinity=f.cpu_affinity, links=f.links).to_proto()
            for i, f in enumerate(facts)
        ]
        assert gpus[0].numa_node_plus_one == 1 and gpus[4].numa_node_plus_one == 2
        assert topology_from_gpus(reversed(gpus)) == topology_from_facts(facts)


class TestCpuLists:
    """The kernel's list format, as taskset and AllowedCPUs take it."""

    @pytest.mark.parametrize(("cpus", "text"), [((0, 1, 2, 3), "0-3"), ((0, 2, 3, 7), "0,2-3,7"), ((), "")])
    def test_format_and_parse(self, cpus: tuple[int, ...], text: str) -> None:
        """Ranges collapse and expand back."""
        assert format_cpu_list(cpus) == text
        assert parse_cpu_list(text) == cpus

    def test_union_unknown_is_empty(self) -> None:
        """One GPU without affinity: no binding at all."""
        assert cpu_list_union([(0, 1), (4, 5)]) == (0, 1, 4, 5)
        assert cpu_list_union([(0, 1), ()]) == ()

    def test_bad_list(self) -> None:
        """Reversed ranges are refused."""
        with pytest.raises(ValueError):
            parse_cpu_list("3-1")

    def test_link_codes(self) -> None:
        """nvidia-smi's codes."""
        assert [link_code(1, 18), link_code(2, 0), link_code(3, 0), link_code(4, 0), link_code(0, 0)] == [
            "NV18", "PIX", "NODE", "SYS", "?"]
