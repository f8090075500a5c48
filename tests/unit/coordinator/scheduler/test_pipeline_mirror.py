"""The mirror: the same scenarios through the leader's scheduling cycle (real etcd) and through the simulator give
the same decisions (``tests/helpers/mirror.py``)."""

from __future__ import annotations

import asyncio

import pytest

from common.etcd_embedded import EtcdCluster
from tests.helpers.mirror import differences, leader_decisions, random_scenario, simulator_decisions


@pytest.mark.parametrize("seed", range(6))
def test_queues_and_preemption(seed: int, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    scenario = random_scenario(seed, queues=True, preemption=True)
    run = asyncio.run(leader_decisions(scenario, etcd_server.endpoints, etcd_prefix))
    sim = simulator_decisions(scenario, run)
    print(run.decisions, sim)
    assert differences(run.decisions, sim) == []
