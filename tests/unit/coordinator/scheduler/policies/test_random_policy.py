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

    def test_uniforms_are_the_generators_one_at_a_time(self) -> None:
        """Uniforms, drawn in chunks, gives rng.random()'s values call after call, across chunk ends."""
        uniform = random_policy.Uniforms(np.random.default_rng(3))
        one_at_a_time = np.random.default_rng(3)
        assert [uniform() for _ in range(2 * random_policy.CHUNK + 5)] == [
            one_at_a_time.random() for _ in range(2 * random_policy.CHUNK + 5)]

    def test_dense_draws_reject_until_a_feasible_node(self) -> None:
        """With at least a quarter feasible, the node is floor(u N) of the first u that lands on one."""
        mask = np.array([i % 3 == 0 for i in range(30)])   # 10 of 30
        for seed in range(50):
            us = np.random.default_rng(seed)
            expected = int(us.random() * 30)
            while not mask[expected]:
                expected = int(us.random() * 30)
            chosen = random_policy.draw(random_policy.Listing(mask), 30, 1,
                                        random_policy.Uniforms(np.random.default_rng(seed)))
            assert chosen == [expected]

    def test_sparse_draws_take_the_kth_feasible_node(self) -> None:
        """With fewer than a quarter feasible, the floor(u r)-th feasible node, set aside for the gang's next."""
        mask = np.zeros(100, dtype=np.bool_)
        mask[[3, 17, 40, 41, 99]] = True
        for seed in range(50):
            us = np.random.default_rng(seed)
            left = [3, 17, 40, 41, 99]
            expected = [left.pop(int(us.random() * r)) for r in (5, 4, 3)]
            chosen = random_policy.draw(random_policy.Listing(mask), 100, 3,
                                        random_policy.Uniforms(np.random.default_rng(seed)))
            assert chosen == expected

    def test_too_few_feasible_draws_nothing(self) -> None:
        """A gang larger than the feasible set gets no node and leaves the stream untouched."""
        uniform = random_policy.Uniforms(np.random.default_rng(1))
        assert random_policy.draw(random_policy.Listing(np.array([True, False, True])), 3, 3, uniform) == []
        assert uniform() == np.random.default_rng(1).random()

    @pytest.mark.parametrize("feasible", [2, 9, 40])
    def test_every_feasible_node_equally_likely(self, feasible: int) -> None:
        """Over many draws, each feasible node (sparse: 2 of 40, dense: 9 and 40 of 40) comes up about
        equally often, and no other does; gangs take distinct nodes."""
        mask = np.zeros(40, dtype=np.bool_)
        mask[np.linspace(0, 39, feasible).astype(int)] = True
        uniform = random_policy.Uniforms(np.random.default_rng(11))
        counts = Counter(i for _ in range(4000)
                         for i in random_policy.draw(random_policy.Listing(mask), 40, 1, uniform))
        assert set(counts) == set(np.flatnonzero(mask).tolist())
        expected = 4000 / feasible
        assert all(abs(c - expected) < 5 * expected**0.5 for c in counts.values()), counts
        for _ in range(200):
            gang = random_policy.draw(random_policy.Listing(mask), 40, min(2, feasible), uniform)
            assert len(set(gang)) == len(gang) == min(2, feasible) and all(mask[gang])

    def test_floor_stays_below_the_count(self) -> None:
        """The largest uniform below 1 times any count floors below the count."""
        u = float(np.nextafter(1.0, 0.0))
        for n in [*range(1, 5000), 2**31 - 1, 2**40 + 3]:
            assert int(u * n) < n

    def test_rank_is_a_permutation(self) -> None:
        """rank gives every node once, in the generator's permutation order."""
        policy = random_policy.RandomPolicy(random_policy.RandomArgs(), np.random.default_rng(0))
        assert sorted(policy.rank(None, table_cluster().nodes)) == ["n1", "n2", "n3", "n4"]  # type: ignore[arg-type]

    @pytest.mark.parametrize("seed", [-1, "x"])
    def test_seed_is_validated(self, seed: object) -> None:
        """A negative or non-integer seed is refused."""
        with pytest.raises(ValidationError) as info:
            random_policy.build(0.9, seed=seed)  # type: ignore[arg-type]
        assert info.value.field == "policy.seed"
