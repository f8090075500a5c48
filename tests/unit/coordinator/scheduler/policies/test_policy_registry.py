"""Tests for the policy registry and the shared filter (coordinator/policies/__init__.py, _base.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from common.errors import ValidationError
from coordinator.domain import Resources
from coordinator.scheduler.policies import POLICIES, build, feasible
from coordinator.scheduler.policies.base import node_arrays
from tests.helpers.builders import GIB, make_node, make_request


class TestRegistry:
    """One dict maps names to factories with the same signature."""

    def test_names(self) -> None:
        """The seven policies are registered under their NAME."""
        assert sorted(POLICIES) == [
            "first-fit", "load-balancing", "max-utilization", "power-efficient", "random", "round-robin", "time-aware",
        ]  # fmt: skip
        for name in POLICIES:
            assert build(name, 0.5, seed=1).name == name

    def test_unknown_name(self) -> None:
        """An unknown name is a validation error listing the known ones."""
        with pytest.raises(ValidationError, match="unknown policy 'best'"):
            build("best")


class TestFeasible:
    """The shared filter gives the first reason a node refuses a request."""

    @pytest.mark.parametrize(
        ("node_kwargs", "request_kwargs", "reason"),
        [
            ({}, {"gpus": 1}, None),
            ({"schedulable": False}, {"gpus": 1}, "not schedulable"),
            ({}, {"gpus": 1, "gpu_model": "A100"}, "gpu model 'NVIDIA H100 80GB HBM3' does not match 'A100'"),
            ({"labels": {"zone": "b"}}, {"node_selector": {"zone": "a"}}, "label zone=a missing"),
            # 7 used + 1 = 8 > 0.9 · 8 = 7.2
            ({"used_gpus": 7}, {"gpus": 1}, "gpus over threshold 0.9"),
            # 60 + 8 = 68 > 0.9 · 64 = 57.6 cores
            ({"used_cpu": 50.0}, {"gpus": 1, "cpu": 8.0}, "cpu_cores over threshold 0.9"),
            # 1 free GPU after 6 of 8 are taken… with 80 GiB GPUs an 81 GiB per-GPU need fails.
            ({}, {"gpus": 1, "per_gpu_gib": 81}, "0 free GPUs with ≥ 81 GiB, needs 1"),
        ],
    )  # fmt: skip
    def test_reasons(self, node_kwargs: dict, request_kwargs: dict, reason: str | None) -> None:
        """Constraints, then dimensions, then GPU fit, each with a short reason (paper mode: every dimension capped)."""
        assert feasible(make_request("t", **request_kwargs), make_node("n", **node_kwargs), 0.9, "paper") == reason

    @pytest.mark.parametrize(
        ("node_kwargs", "request_kwargs", "reason"),
        [
            # 7 used + 1 = 8 ≤ 8: whole GPUs are not capped by the threshold
            ({"used_gpus": 7}, {"gpus": 1}, None),
            ({"used_gpus": 8}, {"gpus": 1}, "gpus over capacity"),
            ({"used_cpu": 50.0}, {"gpus": 1, "cpu": 8.0}, "cpu_cores over threshold 0.9"),
            # a shared request is: 7 + 0.5 > 7.2
            ({"used_gpus": 7}, {"gpus": 0.5, "allow_sharing": True}, "gpus over threshold 0.9"),
            ({"used_gpus": 6}, {"gpus": 0.5, "allow_sharing": True}, None),
        ],
    )  # fmt: skip
    def test_reasons_whole_gpus(self, node_kwargs: dict, request_kwargs: dict, reason: str | None) -> None:
        """The default mode caps host dimensions and shared GPUs, not whole GPUs."""
        assert feasible(make_request("t", **request_kwargs), make_node("n", **node_kwargs), 0.9) == reason

    def test_unknown_mode(self) -> None:
        """An unknown threshold mode is a validation error naming the field."""
        with pytest.raises(ValidationError, match="threshold_mode"):
            build("first-fit", 0.9, mode="strict")

    def test_fragmented_shares(self) -> None:
        """Two half-shared GPUs cannot hold a 0.75 share although the node has 1.0 GPU left in total."""
        node = make_node("n", gpus=2)
        half = tuple(replace(g, share_free=0.5, mem_free_bytes=40 * GIB) for g in node.gpus)
        node = replace(node, gpus=half, used=Resources(gpus=1.0, gpu_mem_total_bytes=80 * GIB))
        # gpus 1 + 0.75 = 1.75 ≤ 0.9 · 2 = 1.8 and memory fits, but no single GPU has 0.75 free.
        req = make_request("t", gpus=0.75, per_gpu_gib=10, allow_sharing=True)
        assert feasible(req, node, 0.9) == "no GPU with share 0.75 and 10 GiB free"


class TestKeyForms:
    """A keyed policy's one ``key`` gives the same value per node in every derived form."""

    @pytest.mark.parametrize("name", [n for n in sorted(POLICIES) if build(n).ranked_by_key])
    def test_one_node_form_equals_the_vectorised_form(self, name: str) -> None:
        """key_at(i) equals key_array()[i] exactly, and rank sorts by it (ties in snapshot order)."""
        nodes = [make_node("a", used_gpus=2), make_node("b", powered_on=False, used_gpus=1), make_node("c"),
                 make_node("d", used_gpus=5), make_node("e", used_gpus=2)]
        view = node_arrays(nodes)
        policy = build(name)
        for gpus in (0.25, 1, 3):
            req = make_request("t", gpus=gpus)
            keys = policy.key_array(view, req)
            assert [policy.key_at(view, req, i) for i in range(len(nodes))] == keys.tolist()
            expected = [nodes[i].node_id for i in sorted(range(len(nodes)), key=lambda i: keys[i])]
            assert policy.rank(req, nodes) == expected
