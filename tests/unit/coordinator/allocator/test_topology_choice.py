"""Topology-aware GPU choice on simulated topologies, and the CPU binding that follows it."""

from __future__ import annotations

import dataclasses

import pytest

from common.topology import (
    NodeTopology,
    cpu_list_union,
    simulated_topology,
    topology_from_facts,
)
from coordinator.allocator.gpus import choose_gpu_indices
from coordinator.domain import ClusterSnapshot, Placement
from coordinator.scheduler.placement.engine import PlacementEngine
from tests.helpers.builders import GIB, make_node, make_request

CPUS = tuple(range(32))   # a two-socket host: CPUs 0-15 on socket 0, 16-31 on socket 1
SOCKET_CPUS = (tuple(range(16)), tuple(range(16, 32)))


def pairs_server() -> NodeTopology:
    topo = topology_from_facts(simulated_topology("pcie-nvlink-pairs", 8, CPUS))
    assert topo is not None
    return topo


def hgx_board() -> NodeTopology:
    topo = topology_from_facts(simulated_topology("hgx", 8, CPUS))
    assert topo is not None
    return topo


class Node:
    """Eight free 80 GiB GPUs and the allocator called the way the placement engine calls it."""

    def __init__(self, links: NodeTopology | None) -> None:
        self.links = links
        self.mem = [80 * GIB] * 8
        self.share = [1.0] * 8

    def take(self, whole: int) -> tuple[int, ...]:
        chosen = choose_gpu_indices(self.mem, self.share, [-1] * 8, whole=whole, share=0.0, mem_per_gpu=GIB,
                                    links=self.links)
        assert chosen is not None
        for i in chosen:
            self.share[i] = 0.0
        return chosen

    def cpus(self, chosen: tuple[int, ...]) -> tuple[int, ...]:
        """What the agent binds the task to: the union of its GPUs' CPU affinity."""
        assert self.links is not None
        return cpu_list_union(self.links.cpus[i] for i in chosen)


class TestPairsServer:
    """Two sockets (GPUs 0-3 and 4-7), NVLink bridges on 0-1, 2-3, 4-5, 6-7."""

    def test_islands(self) -> None:
        """Pairs, then sockets, then the node."""
        topo = pairs_server()
        assert [topo.islands(k) for k in range(len(topo.island_of))] == [
            [(0, 1), (2, 3), (4, 5), (6, 7)], [(0, 1, 2, 3), (4, 5, 6, 7)], [tuple(range(8))],
        ]

    def test_four_two_gpu_tasks_get_the_four_pairs(self) -> None:
        """Each 2-GPU task gets a whole bridged pair, bound to that pair's socket's CPUs."""
        node = Node(pairs_server())
        chosen = [node.take(2) for _ in range(4)]
        assert chosen == [(0, 1), (2, 3), (4, 5), (6, 7)]
        assert [node.cpus(c) for c in chosen] == [SOCKET_CPUS[0], SOCKET_CPUS[0], SOCKET_CPUS[1], SOCKET_CPUS[1]]

    def test_four_gpu_task_gets_one_socket(self) -> None:
        """A 4-GPU task takes one socket's four GPUs and its CPUs; the next one the other socket."""
        node = Node(pairs_server())
        first, second = node.take(4), node.take(4)
        assert (first, second) == ((0, 1, 2, 3), (4, 5, 6, 7))
        assert (node.cpus(first), node.cpus(second)) == SOCKET_CPUS

    def test_four_gpu_task_after_a_pair_goes_to_the_whole_socket(self) -> None:
        """With pair 0-1 taken, a 4-GPU task takes socket 1 rather than spreading over both."""
        node = Node(pairs_server())
        node.take(2)
        assert node.take(4) == (4, 5, 6, 7)

    def test_one_gpu_tasks_do_not_break_pairs_needlessly(self) -> None:
        """The second 1-GPU task takes the other half of the pair the first one broke."""
        node = Node(pairs_server())
        assert [node.take(1) for _ in range(4)] == [(0,), (1,), (2,), (3,)]

    def test_one_gpu_task_takes_the_broken_pair(self) -> None:
        """With GPUs 0-1 and 4 busy, a 1-GPU task takes GPU 5 (the broken pair), not a whole pair."""
        node = Node(pairs_server())
        for i in (0, 1, 4):
            node.share[i] = 0.0
        assert node.take(1) == (5,)
        assert node.cpus((5,)) == SOCKET_CPUS[1]

    def test_two_gpu_task_skips_broken_pairs(self) -> None:
        """With GPU 0 and GPU 2 busy, a 2-GPU task takes pair 4-5, not GPUs 1 and 3."""
        node = Node(pairs_server())
        node.share[0] = node.share[2] = 0.0
        assert node.take(2) == (4, 5)

    def test_three_gpu_task_stays_on_one_socket(self) -> None:
        """Three GPUs: a whole pair and one more from the same socket."""
        node = Node(pairs_server())
        node.share[4] = 0.0
        assert node.take(3) == (5, 6, 7)

    def test_no_room(self) -> None:
        """More GPUs than are free: None."""
        node = Node(pairs_server())
        node.take(8)
        assert choose_gpu_indices(node.mem, node.share, [-1] * 8, whole=1, share=0.0, mem_per_gpu=GIB,
                                  links=node.links) is None


class TestHgxBoard:
    """All eight GPUs on NVSwitch, sockets 0-3 and 4-7."""

    def test_pairs_and_quads_stay_on_one_socket(self) -> None:
        """Two 2-GPU tasks fill socket 0 before socket 1 is touched; a 4-GPU task takes socket 1."""
        node = Node(hgx_board())
        assert [node.take(2), node.take(2), node.take(4)] == [(0, 1), (2, 3), (4, 5, 6, 7)]

    def test_eight_gpu_task_binds_every_cpu(self) -> None:
        """The whole board: both sockets' CPUs."""
        node = Node(hgx_board())
        assert node.cpus(node.take(8)) == CPUS


class TestFallback:
    """Nodes without link information keep the memory best fit."""

    def test_unknown_topology(self) -> None:
        """No links: the two tightest fits, as before."""
        mem = [80 * GIB, 40 * GIB, 50 * GIB, 80 * GIB]
        assert choose_gpu_indices(mem, [1.0] * 4, [-1] * 4, whole=2, share=0.0, mem_per_gpu=GIB) == (1, 2)

    def test_topology_of_another_size_is_ignored(self) -> None:
        """A topology that does not match the node's GPU count is not used."""
        mem = [80 * GIB, 40 * GIB, 50 * GIB, 80 * GIB]
        assert choose_gpu_indices(mem, [1.0] * 4, [-1] * 4, whole=2, share=0.0, mem_per_gpu=GIB,
                                  links=pairs_server()) == (1, 2)

    def test_memory_breaks_ties_within_an_island(self) -> None:
        """Inside the chosen pair the GPU with the least free memory goes first."""
        node = Node(pairs_server())
        node.mem[0] = 70 * GIB
        node.mem[1] = 60 * GIB
        assert node.take(1) == (1,)


class TestPlacementEngine:
    """The engine passes each node's topology to the allocator."""

    @pytest.mark.parametrize("policy", ["first-fit", "max-utilization"])
    def test_two_gpu_requests_get_the_pairs(self, policy: str) -> None:
        """Four 2-GPU requests on one pairs server: the four bridged pairs."""
        node = dataclasses.replace(make_node("n1", gpus=8, cpu=64.0), topology=pairs_server())
        engine = PlacementEngine.from_name(ClusterSnapshot(nodes=(node,), taken_at_s=0.0), policy, threshold=1.0)
        requests = [make_request(f"t{k}", gpus=2, per_gpu_gib=10, cpu=4) for k in range(4)]
        decisions = engine.place_batch(requests)
        got = sorted(d.assignments[0].gpu_indices for d in decisions if isinstance(d, Placement))
        assert got == [(0, 1), (2, 3), (4, 5), (6, 7)]
        assert engine.node_snapshot(0).topology is node.topology
