"""Tests for the first-fit baseline (coordinator/policies/first_fit.py)."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.scheduler.policies import first_fit
from tests.helpers.builders import place_one, sequence, table_cluster


class TestFirstFit:
    """The first feasible node in snapshot order."""

    @pytest.mark.parametrize(
        ("gpus", "expected"),
        [
            (1, "n1"),  # n1: 6 + 1 = 7 ≤ 7.2
            (2, "n2"),  # n1: 8 > 7.2; n2: 4 ≤ 7.2
            (4, "n2"),  # n2: 6 ≤ 7.2
            (6, None),  # n2 8 > 7.2, n3 6 > 3.6, n4 10 > 7.2
        ],
    )
    def test_single_requests(self, gpus: float, expected: str | None) -> None:
        """One request lands on the first node it fits."""
        assert place_one(first_fit.NAME, gpus) == expected

    def test_fills_in_order(self) -> None:
        """After n1 reaches 7 GPUs, everything goes to n2 until it reaches 7 too."""
        assert sequence(first_fit.NAME, [1] * 6) == ["n1", "n2", "n2", "n2", "n2", "n2"]

    def test_first_k(self) -> None:
        """first_k returns the first feasible indices, or nothing."""
        assert first_fit.first_k(np.array([False, True, True]), 1).tolist() == [1]
        assert first_fit.first_k(np.array([False, True, True]), 2).tolist() == [1, 2]
        assert first_fit.first_k(np.array([False, False]), 1).tolist() == []
        assert first_fit.rank(table_cluster().nodes) == ["n1", "n2", "n3", "n4"]
