"""GPU topology inside one node: links between GPUs, NUMA nodes and CPU affinity.

The agent reports, per GPU, its NUMA node, the CPUs close to it and how it reaches every other
GPU (:class:`LinkLevel`). The coordinator turns one node's report into a :class:`NodeTopology`
once per registration; the allocator reads its nested *islands*:

* the distance between two GPUs orders their links, best first: NVLink within one NUMA node (0),
  NVLink across sockets (1, e.g. an NVSwitch board), the same PCIe switch (2), the same socket
  through its host bridge (3), across sockets (4); an unknown link is never close;
* islands at distance ``t`` are the connected groups of GPUs joined by links of distance ≤ ``t``
  (single linkage), so each level's islands nest inside the next level's, the last being the
  whole node. On a two-socket PCIe server with NVLink-bridged pairs: pairs, then sockets, then
  the node; on an HGX board: sockets, then the node.

Everything here is plain data and pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from common.errors import ValidationError

__all__ = [
    "MAX_CPUS",
    "MAX_LINKS_PER_GPU",
    "MAX_NUMA_NODE",
    "MAX_NVLINKS",
    "SIMULATED_TOPOLOGIES",
    "GpuTopologyFacts",
    "LinkLevel",
    "NodeTopology",
    "build_topology",
    "cpu_list_union",
    "format_cpu_list",
    "link_code",
    "parse_cpu_list",
    "simulated_topology",
    "topology_from_facts",
    "topology_from_gpus",
    "validate_gpu_topology",
]

MAX_CPUS = 4096
"""CPU ids a GPU's affinity may name (and the highest id + 1)."""
MAX_NUMA_NODE = 1023
MAX_NVLINKS = 64
MAX_LINKS_PER_GPU = 255
"""One link per other GPU of the node at most."""


class LinkLevel(IntEnum):
    """How one GPU reaches another; the values are ``GpuLinkLevel`` on the wire."""

    UNKNOWN = 0
    NVLINK = 1
    SAME_SWITCH = 2
    SAME_SOCKET = 3
    CROSS_SOCKET = 4


_UNKNOWN_DISTANCE = 5


def _distance(level: int, same_numa: bool) -> int:
    """Order of preference of a link between two GPUs (lower is closer)."""
    if level == LinkLevel.NVLINK:
        return 0 if same_numa else 1
    if level in (LinkLevel.SAME_SWITCH, LinkLevel.SAME_SOCKET, LinkLevel.CROSS_SOCKET):
        return int(level)
    return _UNKNOWN_DISTANCE


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """One node's GPU topology as the allocator and ``gptrmctl`` read it.

    :param levels: ``levels[i][j]``: the :class:`LinkLevel` from GPU i to GPU j (0 on the diagonal).
    :param nvlinks: ``nvlinks[i][j]``: active NVLinks between them.
    :param numa: NUMA node per GPU, -1 unknown.
    :param cpus: CPU affinity per GPU, ``()`` unknown.
    :param island_of: per level (closest first), the island number of each GPU; the last level
        puts every GPU in island 0.
    :param island_counts: islands per level.
    """

    levels: tuple[tuple[int, ...], ...]
    nvlinks: tuple[tuple[int, ...], ...]
    numa: tuple[int, ...]
    cpus: tuple[tuple[int, ...], ...]
    island_of: tuple[tuple[int, ...], ...]
    island_counts: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        """GPUs on the node."""
        return len(self.numa)

    def islands(self, level: int) -> list[tuple[int, ...]]:
        """The islands at ``level`` as ascending GPU positions, in order of their lowest GPU."""
        groups: dict[int, list[int]] = {}
        for i, island in enumerate(self.island_of[level]):
            groups.setdefault(island, []).append(i)
        return [tuple(g) for g in groups.values()]


@dataclass(frozen=True, slots=True)
class GpuTopologyFacts:
    """What an agent knows of one GPU's place in the node.

    :param numa_node: its NUMA node, -1 unknown.
    :param cpu_affinity: the CPUs close to it, ``()`` unknown.
    :param links: ``(peer index, LinkLevel, active NVLinks)`` per other GPU whose link is known.
    """

    numa_node: int = -1
    cpu_affinity: tuple[int, ...] = ()
    links: tuple[tuple[int, int, int], ...] = ()


SIMULATED_TOPOLOGIES = ("auto", "hgx", "pcie-nvlink-pairs", "pcie", "none")
"""Names accepted by :func:`simulated_topology` (``auto`` is resolved by the caller)."""

_HGX_NVLINKS = 18
_BRIDGE_NVLINKS = 4


def simulated_topology(name: str, count: int, cpus: Sequence[int]) -> list[GpuTopologyFacts]:
    """A described topology for ``count`` simulated GPUs on a two-socket host.

    GPUs ``0..count/2-1`` sit on socket (NUMA node) 0, the rest on socket 1; each socket's GPUs
    get half of ``cpus`` (all of them when there is one CPU), so the affinity names CPUs that exist.

    * ``hgx``: every pair NVLinked through NVSwitch (NV18), as on an HGX/DGX board;
    * ``pcie-nvlink-pairs``: PCIe GPUs NVLink-bridged in pairs (0-1, 2-3, ...; NV4), other
      GPUs of a socket through its host bridge, the others across sockets;
    * ``pcie``: the same without bridges;
    * ``none``: nothing known.

    :raises ValueError: on an unknown name.
    """
    if name not in SIMULATED_TOPOLOGIES or name == "auto":
        raise ValueError(f"unknown simulated topology {name!r}: expected one of {', '.join(SIMULATED_TOPOLOGIES[1:])}")
    if name == "none" or count <= 0:
        return [GpuTopologyFacts() for _ in range(count)]
    ordered = sorted(set(cpus)) or [0]
    half = max(1, len(ordered) // 2)
    per_socket = (tuple(ordered[:half]), tuple(ordered[half:]) or tuple(ordered[:half]))
    socket = [0 if i < max(1, count // 2) else 1 for i in range(count)]
    facts = []
    for i in range(count):
        links = []
        for j in range(count):
            if j == i:
                continue
            if name == "hgx":
                links.append((j, int(LinkLevel.NVLINK), _HGX_NVLINKS))
            elif name == "pcie-nvlink-pairs" and i // 2 == j // 2:
                links.append((j, int(LinkLevel.NVLINK), _BRIDGE_NVLINKS))
            elif socket[i] == socket[j]:
                links.append((j, int(LinkLevel.SAME_SOCKET), 0))
            else:
                links.append((j, int(LinkLevel.CROSS_SOCKET), 0))
        facts.append(GpuTopologyFacts(socket[i], per_socket[socket[i]], tuple(links)))
    return facts


def topology_from_facts(facts: Sequence[GpuTopologyFacts]) -> NodeTopology | None:
    """A node's topology from what its agent knows of each GPU (index order)."""
    links = {(i, peer): (level, nv) for i, f in enumerate(facts) for peer, level, nv in f.links}
    return build_topology([f.numa_node for f in facts], [f.cpu_affinity for f in facts], links)


def build_topology(
    numa: Sequence[int], cpus: Sequence[Sequence[int]], links: Mapping[tuple[int, int], tuple[int, int]]
) -> NodeTopology | None:
    """A node's topology from per-GPU facts.

    :param numa: NUMA node per GPU, -1 unknown.
    :param cpus: CPU affinity per GPU.
    :param links: ``(i, j) → (LinkLevel, nvlinks)``; a pair given once in either order is enough.
    :returns: the topology, or None when no link between two GPUs is known (nothing to prefer).
    """
    n = len(numa)
    levels = [[0] * n for _ in range(n)]
    nv = [[0] * n for _ in range(n)]
    known = False
    for (i, j), (level, count) in links.items():
        if i == j or not (0 <= i < n and 0 <= j < n):
            continue
        if level != LinkLevel.UNKNOWN:
            known = True
        for a, b in ((i, j), (j, i)):
            if levels[a][b] == LinkLevel.UNKNOWN:
                levels[a][b], nv[a][b] = int(level), int(count)
    if not known:
        return None
    island_of: list[tuple[int, ...]] = []
    for threshold in range(_UNKNOWN_DISTANCE):
        parent = list(range(n))

        def root(x: int, parent: list[int] = parent) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for i in range(n):
            for j in range(i + 1, n):
                same_numa = numa[i] < 0 or numa[j] < 0 or numa[i] == numa[j]
                if _distance(levels[i][j], same_numa) <= threshold:
                    ri, rj = root(i), root(j)
                    if ri != rj:
                        parent[max(ri, rj)] = min(ri, rj)
        numbers: dict[int, int] = {}
        islands = tuple(numbers.setdefault(root(i), len(numbers)) for i in range(n))
        if not island_of or islands != island_of[-1]:
            island_of.append(islands)
    if island_of[-1] != (0,) * n:
        island_of.append((0,) * n)
    # A level where every GPU is alone tells nothing the leaf choice does not.
    island_of = [lv for lv in island_of if len(set(lv)) < n or n <= 1] or [(0,) * n]
    return NodeTopology(
        levels=tuple(tuple(r) for r in levels),
        nvlinks=tuple(tuple(r) for r in nv),
        numa=tuple(int(x) for x in numa),
        cpus=tuple(tuple(int(c) for c in cs) for cs in cpus),
        island_of=tuple(island_of),
        island_counts=tuple(len(set(level)) for level in island_of),
    )


def topology_from_gpus(gpus: Iterable[Any]) -> NodeTopology | None:
    """A node's topology from its inventory's ``GpuInfo`` messages (validated beforehand).

    :param gpus: ``NodeInventory.gpus``, any order (positions are their ``index``).
    :returns: the topology, or None when the agent reported no link.
    """
    gpus = sorted(gpus, key=lambda g: g.index)
    n = len(gpus)
    numa = [int(g.numa_node_plus_one) - 1 for g in gpus]
    cpus = [tuple(g.cpu_affinity) for g in gpus]
    links: dict[tuple[int, int], tuple[int, int]] = {}
    for pos, g in enumerate(gpus):
        for link in g.links:
            if link.peer_index < n:
                links[(pos, int(link.peer_index))] = (int(link.level), int(link.nvlinks))
    return build_topology(numa, cpus, links) if links else None


def validate_gpu_topology(gpus: Sequence[Any], field: str) -> None:
    """Refuse topology fields that are out of bounds (the inventory comes from an agent).

    :param gpus: ``NodeInventory.gpus``.
    :param field: the prefix of the field names in errors (``register.inventory.gpus``).
    :raises ValidationError: naming the first bad field.
    """
    n = len(gpus)
    for i, g in enumerate(gpus):
        where = f"{field}[{i}]"
        if g.numa_node_plus_one > MAX_NUMA_NODE + 1:
            raise ValidationError(f"{where}.numa_node_plus_one", f"NUMA node {g.numa_node_plus_one - 1} out of range")
        affinity = g.cpu_affinity
        if len(affinity) > MAX_CPUS:
            raise ValidationError(f"{where}.cpu_affinity", f"{len(affinity)} CPUs is more than {MAX_CPUS}")
        if any(c >= MAX_CPUS for c in affinity):
            raise ValidationError(f"{where}.cpu_affinity", f"a CPU id is not below {MAX_CPUS}")
        links = g.links
        if len(links) > min(MAX_LINKS_PER_GPU, max(0, n - 1)):
            raise ValidationError(f"{where}.links", f"{len(links)} links for a node of {n} GPUs")
        peers = set()
        for k, link in enumerate(links):
            if link.peer_index >= n or link.peer_index == g.index:
                raise ValidationError(f"{where}.links[{k}].peer_index", f"peer {link.peer_index} is not another GPU")
            if link.peer_index in peers:
                raise ValidationError(f"{where}.links[{k}].peer_index", f"peer {link.peer_index} repeated")
            peers.add(link.peer_index)
            if link.level not in LinkLevel._value2member_map_:
                raise ValidationError(f"{where}.links[{k}].level", f"unknown link level {link.level}")
            if link.nvlinks > MAX_NVLINKS:
                raise ValidationError(f"{where}.links[{k}].nvlinks", f"{link.nvlinks} is more than {MAX_NVLINKS}")


def link_code(level: int, nvlinks: int) -> str:
    """The ``nvidia-smi topo -m`` code of a link: ``NV4``, ``PIX``, ``NODE``, ``SYS``, ``?``."""
    if level == LinkLevel.NVLINK:
        return f"NV{nvlinks}" if nvlinks else "NV"
    return {LinkLevel.SAME_SWITCH: "PIX", LinkLevel.SAME_SOCKET: "NODE", LinkLevel.CROSS_SOCKET: "SYS"}.get(
        LinkLevel(level) if level in LinkLevel._value2member_map_ else LinkLevel.UNKNOWN, "?"
    )


def cpu_list_union(affinities: Iterable[Sequence[int]]) -> tuple[int, ...]:
    """The sorted union of CPU lists; ``()`` when any of them is unknown (empty)."""
    union: set[int] = set()
    for cpus in affinities:
        if not cpus:
            return ()
        union.update(cpus)
    return tuple(sorted(union))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``0-3,8,10-11``: the kernel's list format (taskset, cpuset, AllowedCPUs)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    k = 0
    while k < len(ordered):
        start = end = ordered[k]
        while k + 1 < len(ordered) and ordered[k + 1] == end + 1:
            k += 1
            end = ordered[k]
        parts.append(str(start) if start == end else f"{start}-{end}")
        k += 1
    return ",".join(parts)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The kernel's list format back to CPU ids (``"0-2,5"`` → ``(0, 1, 2, 5)``).

    :raises ValueError: on a malformed list or a range past :data:`MAX_CPUS`.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi) if hi else int(lo)
        if first < 0 or last < first or last >= MAX_CPUS:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))
