"""Tests for the random baseline (coordinator/policies/random_policy.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from common.errors import ValidationError
from coordinator.scheduler.policies import random_policy
from tests.helpers.builders import place_one, table_cluster


class TestRandomPolicy:
    """A uniformly random feasible node from an injected, seeded RNG."""

    def test_same_seed_same_choice(self) -> None:
        """Two engines with the same seed choose the same node."""
        assert place_one(random_policy.NAME, 2, seed=42) == place_one(random_policy.NAME, 2, seed=42)

    def test_only_feasible_nodes_and_all_of_them(self) -> None:
        """A 2-GPU request never lands on n1 (8 > 7.2) and lands on each of n2, n3, n4 over many seeds."""
        counts = Counter(place_one(random_policy.NAME, 2, seed=seed) for seed in range(300))
        assert set(counts) == {"n2", "n3", "n4"}
        assert min(counts.values()) > 60  # 100 expected each

    def test_draw_uses_the_injected_rng(self) -> None:
        """draw is rng.integers for one node and a choice without replacement for a gang."""
        assert random_policy.draw(5, 1, np.random.default_rng(3)).tolist() == [
            int(np.random.default_rng(3).integers(5))
        ]
        gang = random_policy.draw(5, 3, np.random.default_rng(3))
        assert len(set(gang.tolist())) == 3
        policy = random_policy.RandomPolicy(random_policy.RandomArgs(), np.random.default_rng(0))
        assert sorted(policy.rank(None, table_cluster().nodes)) == ["n1", "n2", "n3", "n4"]  # type: ignore[arg-type]

    @pytest.mark.parametrize("seed", [-1, "x"])
    def test_seed_is_validated(self, seed: object) -> None:
        """A negative or non-integer seed is refused."""
        with pytest.raises(ValidationError) as info:
            random_policy.build(0.9, seed=seed)  # type: ignore[arg-type]
        assert info.value.field == "policy.seed"
