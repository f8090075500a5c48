"""Gangs prefer nodes that share a topology label value (one rack), best fit among racks."""

from __future__ import annotations

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.domain import ClusterSnapshot, Placement
from coordinator.scheduler.placement.engine import PlacementEngine
from tests.helpers.builders import make_node, make_request

RACKS = ("a", "b", "b", "c", "c", "c", None)


def cluster() -> ClusterSnapshot:
    """n1 in rack a, n2-n3 in rack b, n4-n6 in rack c, n7 without a rack label."""
    nodes = tuple(make_node(f"n{k + 1}", gpus=8, labels={"rack": rack} if rack else {})
                  for k, rack in enumerate(RACKS))
    return ClusterSnapshot(nodes=nodes, taken_at_s=0.0)


def place(nodes: int, label: str = "rack", policy: str = "first-fit") -> list[str]:
    engine = PlacementEngine.from_name(cluster(), policy, gang_label=label)
    [decision] = engine.place_batch([make_request("g", gpus=4, per_gpu_gib=10, nodes=nodes)])
    assert isinstance(decision, Placement)
    return sorted(a.node_id for a in decision.assignments)


class TestGangTopology:
    @pytest.mark.parametrize("policy", ["first-fit", "max-utilization", "load-balancing", "round-robin"])
    def test_two_node_gang_takes_the_smallest_rack_that_holds_it(self, policy: str) -> None:
        """First fit alone would take n1 and n2 across racks a and b; the label keeps the gang in rack b."""
        assert place(2, policy=policy) == ["n2", "n3"]

    def test_three_node_gang_takes_rack_c(self) -> None:
        """Only rack c has three nodes."""
        assert place(3) == ["n4", "n5", "n6"]

    def test_gang_larger_than_every_rack_spans_racks(self) -> None:
        """No rack holds four nodes: placed across racks as without the label."""
        assert place(4) == ["n1", "n2", "n3", "n4"]

    def test_busy_rack_is_skipped(self) -> None:
        """A rack whose nodes cannot take the gang is not a candidate."""
        snap = cluster()
        nodes = list(snap.nodes)
        nodes[2] = make_node("n3", gpus=8, used_gpus=8, labels={"rack": "b"})
        engine = PlacementEngine.from_name(ClusterSnapshot(nodes=tuple(nodes), taken_at_s=0.0), "first-fit",
                                           gang_label="rack")
        [decision] = engine.place_batch([make_request("g", gpus=4, per_gpu_gib=10, nodes=2)])
        assert isinstance(decision, Placement)
        assert sorted(a.node_id for a in decision.assignments) == ["n4", "n5"]

    def test_no_label_no_preference(self) -> None:
        """Without a gang label (or a label no node has) the policy's own choice stands."""
        assert place(2, label="") == ["n1", "n2"]
        assert place(2, label="row") == ["n1", "n2"]

    def test_single_node_requests_unaffected(self) -> None:
        """A one-node request ignores racks."""
        assert place(1) == ["n1"]

    def test_flag_default(self) -> None:
        """The coordinator's default gang label is rack."""
        assert CoordinatorConfig().gang_topology_label == "rack"
