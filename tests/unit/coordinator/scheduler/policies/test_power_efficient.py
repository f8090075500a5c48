"""Tests for Alg. 3, power-efficient (coordinator/policies/power_efficient.py)."""

from __future__ import annotations

import pytest

from coordinator.domain import ClusterSnapshot
from coordinator.scheduler.policies import power_efficient
from coordinator.scheduler.policies.base import NodeRow, node_arrays
from tests.helpers.builders import make_node, make_request, place_one, sequence, table_cluster


class TestPowerEfficient:
    """Smallest estimated power increase first; asleep nodes pay their idle power."""

    @pytest.mark.parametrize(
        ("gpus", "expected"),
        [
            # Δ = power(after) - power(before): n1, n2 (awake): 5040·1/8 = 630 W; n4: 2800·1/8 = 350 W;
            # n3 asleep (nothing allocated): 64 + 224·1/4 = 120 W → n3.
            (1, "n3"),
            # n1 infeasible (8 > 7.2); n2 1260, n4 700, n3 64 + 224·2/4 = 176 → n3.
            (2, "n3"),
            # n2 1890, n4 1050, n3 64 + 168 = 232 → n3.
            (3, "n3"),
            # n3: 4 > 3.6, n4: 8 > 7.2 infeasible; n2 is the only one left: 2520 W.
            (4, "n2"),
            (6, None),
        ],
    )
    def test_single_requests(self, gpus: float, expected: str | None) -> None:
        """One request on the table cluster lands where power grows least."""
        assert place_one(power_efficient.NAME, gpus) == expected

    def test_woken_node_becomes_cheap(self) -> None:
        """Once n3 is awake each further GPU there costs only 56 W; when it is full n4 (350 W) is next."""
        # 1st: n3 120 W (wakes it); 2nd, 3rd: n3 224/4 = 56 W; 4th: n3 4 > 3.6 → n4 350 < n1, n2 630.
        assert sequence(power_efficient.NAME, [1] * 4) == ["n3", "n3", "n3", "n4"]

    def test_prefers_consolidation_over_waking_a_node(self) -> None:
        """An awake H100 node (630 W more) beats waking an identical idle one (560 + 630 W)."""
        cluster = ClusterSnapshot(nodes=(make_node("idle"), make_node("busy", used_gpus=2)))
        assert place_one(power_efficient.NAME, 1, cluster=cluster) == "busy"

    def test_powered_off_node_pays_idle(self) -> None:
        """A powered-off node with reservations still pays its idle power to wake."""
        off = make_node("off", used_gpus=2, powered_on=False)
        view = node_arrays([off, make_node("on", used_gpus=2)])
        assert power_efficient.power_increase(NodeRow(view, 0), 1.0) == pytest.approx(560 + 5040 * 3 / 8)
        assert power_efficient.power_increase(NodeRow(view, 1), 1.0) == pytest.approx(630.0)
        assert power_efficient.power_increase(view, 1.0).tolist() == pytest.approx([560 + 5040 * 3 / 8, 630.0])

    def test_rank(self) -> None:
        """rank orders by ascending increase for the request's GPUs: n3 120, n4 350, n1 = n2 630."""
        assert power_efficient.rank(make_request("t", gpus=1), table_cluster().nodes) == ["n3", "n4", "n1", "n2"]

    def test_waits_without_scale_out(self) -> None:
        """Alg. 3 sorts the batch by demand and never asks for a new node."""
        policy = power_efficient.build(0.7)
        assert policy.sorts_requests and not policy.scale_out
