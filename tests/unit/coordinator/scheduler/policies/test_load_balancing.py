"""Tests for Alg. 2, load-balancing (coordinator/policies/load_balancing.py)."""

from __future__ import annotations

import pytest

from common.errors import ValidationError
from coordinator.scheduler.policies import load_balancing
from coordinator.scheduler.policies.base import node_arrays
from tests.helpers.builders import make_request, place_one, sequence, table_cluster


class TestLoadBalancing:
    """Emptiest feasible node first (ascending compute utilization, ties by node order)."""

    @pytest.mark.parametrize(
        ("gpus", "expected"),
        [
            # n3 (0.0): 0 + 1 = 1 ≤ 0.9·4 = 3.6.
            (1, "n3"),
            # n3: 2 ≤ 3.6.
            (2, "n3"),
            # n3: 3 ≤ 3.6.
            (3, "n3"),
            # n3: 4 > 3.6; next emptiest n2 (0.25): 2 + 4 = 6 ≤ 7.2.
            (4, "n2"),
            # n3 6 > 3.6, n2 8, n4 10, n1 12 > 7.2 → nobody.
            (6, None),
        ],
    )
    def test_single_requests(self, gpus: float, expected: str | None) -> None:
        """One request on the table cluster lands on the emptiest node it fits."""
        assert place_one(load_balancing.NAME, gpus) == expected

    def test_spreads_and_breaks_ties_by_node_order(self) -> None:
        """1-GPU requests alternate between the two emptiest nodes; equal utilization goes to the earlier node."""
        # n3 0→0.25; n2 0.25 = n3 0.25 → n2 (earlier) → 0.375; n3 0.25 → 0.5; n2 0.375 → 0.5;
        # n2 = n3 = n4 = 0.5 → n2 → 0.625; n3 = n4 = 0.5 → n3.
        assert sequence(load_balancing.NAME, [1] * 6) == ["n3", "n2", "n3", "n2", "n2", "n3"]

    def test_rank_and_key(self) -> None:
        """rank orders by ascending utilization; the key is the utilization itself."""
        assert load_balancing.rank(make_request("t"), table_cluster().nodes) == ["n3", "n2", "n4", "n1"]
        view = node_arrays(table_cluster().nodes)
        assert load_balancing.build().key(view, make_request("t")).tolist() == view.util.tolist()

    def test_flags(self) -> None:
        """Alg. 2 sorts the batch by demand and asks for a new node when nothing fits."""
        policy = load_balancing.build()
        assert policy.sorts_requests and policy.scale_out and policy.threshold == 0.9

    def test_threshold_is_validated(self) -> None:
        """A threshold of 0 is refused when the args are built."""
        with pytest.raises(ValidationError):
            load_balancing.LoadBalancingArgs(threshold=0.0)
