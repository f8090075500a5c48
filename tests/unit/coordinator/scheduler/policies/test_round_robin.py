"""Tests for the round-robin baseline (coordinator/policies/round_robin.py)."""

from __future__ import annotations

import numpy as np

from coordinator.scheduler.policies import round_robin
from tests.helpers.builders import place_one, sequence, table_cluster


class TestRoundRobin:
    """The next feasible node after the last one used, wrapping around."""

    def test_walks_the_nodes(self) -> None:
        """1-GPU requests visit n1, n2, n3, n4, then skip the full n1 (7 + 1 > 7.2)."""
        assert sequence(round_robin.NAME, [1] * 6) == ["n1", "n2", "n3", "n4", "n2", "n3"]

    def test_first_request_starts_at_the_first_feasible_node(self) -> None:
        """A 2-GPU request skips n1 (6 + 2 > 7.2) and takes n2."""
        assert place_one(round_robin.NAME, 2) == "n2"

    def test_rotate_and_cursor(self) -> None:
        """rotate wraps past the end; the cursor moves past the last chosen node."""
        mask = np.array([True, False, True, True])
        assert round_robin.rotate(mask, 3, 2).tolist() == [3, 0]
        assert round_robin.next_cursor(np.array([3, 0]), 4) == 1
        assert round_robin.rank(table_cluster().nodes, 2) == ["n3", "n4", "n1", "n2"]

    def test_queue_order(self) -> None:
        """The baseline keeps queue order and waits instead of scaling out."""
        policy = round_robin.build()
        assert not policy.sorts_requests and not policy.scale_out and policy.cursor == 0
