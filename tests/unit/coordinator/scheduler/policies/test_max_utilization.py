"""Tests for Alg. 1, max-utilization (coordinator/policies/max_utilization.py)."""

from __future__ import annotations

import math

import pytest

from common.errors import ValidationError
from coordinator.scheduler.policies import max_utilization
from coordinator.scheduler.policies.base import node_arrays
from tests.helpers.builders import make_request, place_one, sequence, table_cluster


class TestMaxUtilization:
    """Fullest feasible node first (descending compute utilization, ties by node order)."""

    @pytest.mark.parametrize(
        ("gpus", "expected"),
        [
            # n1 0.75: 6 + 1 = 7 ≤ 0.9·8 = 7.2 → the fullest node takes it.
            (1, "n1"),
            # n1: 6 + 2 = 8 > 7.2; next fullest n4 (0.5): 4 + 2 = 6 ≤ 7.2.
            (2, "n4"),
            # n1: 9 > 7.2; n4: 4 + 3 = 7 ≤ 7.2.
            (3, "n4"),
            # n1: 10, n4: 8 > 7.2; n2 (0.25): 2 + 4 = 6 ≤ 7.2.
            (4, "n2"),
            # n1 12, n4 10, n2 8 > 7.2; n3: 6 > 0.9·4 = 3.6 → nobody: scale-out.
            (6, None),
        ],
    )
    def test_single_requests(self, gpus: float, expected: str | None) -> None:
        """One request on the table cluster lands on the fullest node it fits."""
        assert place_one(max_utilization.NAME, gpus) == expected

    def test_packs_one_node_until_the_threshold(self) -> None:
        """1-GPU requests fill n1 to 7, then n4 from 4 to 7, then go to n2."""
        # n1 6→7 (0.875, full at 7.2); n4 4→5→6→7 (stays the fullest feasible); then n2 2→3→….
        assert sequence(max_utilization.NAME, [1] * 6) == ["n1", "n4", "n4", "n4", "n2", "n2"]

    def test_rank_and_key(self) -> None:
        """rank orders by descending utilization; the key negates utilization."""
        assert max_utilization.rank(make_request("t"), table_cluster().nodes) == ["n1", "n4", "n2", "n3"]
        view = node_arrays(table_cluster().nodes)
        assert max_utilization.build().key(view, make_request("t")).tolist() == (-view.util).tolist()

    def test_scale_out_and_sorting(self) -> None:
        """Alg. 1 sorts the batch by demand and asks for a new node when nothing fits."""
        policy = max_utilization.build(0.8)
        assert policy.sorts_requests and policy.scale_out and policy.threshold == 0.8

    @pytest.mark.parametrize("threshold", [0.0, -0.1, 1.01, math.nan, math.inf, True, "0.5"])
    def test_threshold_is_validated(self, threshold: object) -> None:
        """A threshold outside (0, 1] is refused when the policy is built."""
        with pytest.raises(ValidationError) as info:
            max_utilization.build(threshold)  # type: ignore[arg-type]
        assert info.value.field == "policy.threshold"
