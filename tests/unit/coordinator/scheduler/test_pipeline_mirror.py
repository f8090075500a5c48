"""The mirror: the same scenarios through the leader's scheduling cycle (the coordinator's own object graph on a real
etcd) and through the simulator give the same decisions — which job goes to which node and GPUs, which elastic jobs
resize to what, which jobs are preemption victims, which are reclaimed — over random clusters and two waves of jobs
(``tests/helpers/mirror.py``).

Each feature (team queues with GPU pools, borrowing and reclaim; priorities and preemption, also with multi-node
jobs; elastic jobs; each placement policy) runs over a few seeded scenarios, and every case must agree. The last
tests change one rule on one side only and check that the mirror sees it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import coordinator.qos.preemption
import coordinator.queues.planning
import coordinator.scheduler.cycle
import coordinator.scheduler.pipeline
import coordinator.simulator.elastic
import coordinator.simulator.engine
import coordinator.simulator.qos
import coordinator.simulator.queues
from coordinator.domain import Request
from coordinator.etcd_embedded import EtcdCluster
from coordinator.queues import Queue, QueueConfig
from tests.helpers.mirror import Job, Node, Scenario, mirror, random_scenario

SEEDS = range(8)


def _agree(etcd: EtcdCluster, prefix: str, seed: int, **kinds: bool) -> None:
    diff = mirror(random_scenario(seed, **kinds), etcd.endpoints, prefix)
    assert diff == [], "\n".join(diff)


@pytest.mark.parametrize("seed", [*SEEDS, 11])
def test_team_queues_with_reclaim(seed: int, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Queues with quotas (in any GPU model or in one), borrowing and reclaim: the same admissions, placements and
    reclaimed borrowers."""
    _agree(etcd_server, etcd_prefix, seed, queues=True)


def test_a_reclaim_for_a_task_that_still_does_not_fit(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Queue alpha borrows for two 3-GPU tasks on two 4-GPU nodes; queue beta's 2-GPU task, within its quota, fits on
    neither under max-utilization's threshold (3 GPUs a node): a borrower is reclaimed for it, and the cycle after
    puts the borrower, the larger request, first again."""
    queues = QueueConfig(queues=(Queue("alpha", gpus={"*": 2}, members=("*",), default_for=("*",)),
                                 Queue("beta", gpus={"*": 2}, members=("*",))))
    scenario = Scenario((Node("n0", 4), Node("n1", 4)), (Job("w0-00", 3, queue="alpha"), Job("w0-01", 2, queue="beta"),
                                                         Job("w0-02", 3, queue="alpha")), "max-utilization", queues)
    diff = mirror(scenario, etcd_server.endpoints, etcd_prefix)
    assert diff == [], "\n".join(diff)


@pytest.mark.parametrize("seed", [*SEEDS, 40, 53])
def test_priorities_with_preemption(seed: int, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Priorities 0, 10 and 20 with preemption: the same placements and victims."""
    _agree(etcd_server, etcd_prefix, seed, preemption=True)


@pytest.mark.parametrize("seed", SEEDS)
def test_multi_node_jobs_with_preemption(seed: int, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Jobs spanning two nodes among one-node jobs, with priorities and preemption: the same placements (rank 0
    first) and victims."""
    _agree(etcd_server, etcd_prefix, seed, preemption=True, gangs=True)


@pytest.mark.parametrize("seed", [*SEEDS, 25, 34])
def test_elastic_jobs(seed: int, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Elastic and rigid jobs: the same sizes at placement, the same shrinks for what waits and grows into GPUs that
    ending jobs freed."""
    _agree(etcd_server, etcd_prefix, seed, elastic=True)


@pytest.mark.parametrize(("policy", "seed"), [
    (p, s) for p in ("power-efficient", "time-aware", "round-robin") for s in (*SEEDS[:4], 5)])
def test_other_policies(policy: str, seed: int, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """The scenarios with priorities and preemption under the policies the other tests do not draw."""
    scenario = replace(random_scenario(seed, preemption=True), policy=policy)
    diff = mirror(scenario, etcd_server.endpoints, etcd_prefix)
    assert diff == [], "\n".join(diff)


def test_deadlines(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Two tasks, room for one: the one due first (in an hour, 10 minutes' work: 50 minutes of slack) and the one
    with the least slack (due in two hours, 90 minutes' work: 30 minutes) — the same one is placed on both sides."""
    scenario = Scenario((Node("n0", 4),), (Job("w0-00", 4, deadline_in_s=3600.0, time_limit_s=600.0),
                                           Job("w0-01", 4, deadline_in_s=7200.0, time_limit_s=5400.0)), "first-fit")
    diff = mirror(scenario, etcd_server.endpoints, etcd_prefix)
    assert diff == [], "\n".join(diff)


def test_team_queues_with_preemption(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Team queues and priorities with preemption, together."""
    _agree(etcd_server, etcd_prefix, 0, queues=True, preemption=True)


def test_elastic_jobs_queues_and_preemption(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Elastic jobs, team queues and preemption, all on."""
    _agree(etcd_server, etcd_prefix, 0, queues=True, preemption=True, elastic=True)


# ---- the mirror sees a rule changed on one side -------------------------------------------------------------------


def _no_victims(*args: Any, **kwargs: Any) -> list[Any]:
    return []


def _rigid_plan(inputs: Any) -> Any:
    """A placement plan with every elastic job placed rigid, at the size it asks for (neither placed smaller nor
    sized: elastic placement is one rule, the pipeline's, on both sides; each side's call of it is changed)."""
    pending = [replace(p, elastic=None) for p in inputs.pending]
    return coordinator.scheduler.pipeline.plan_placements(replace(inputs, pending=pending))


def _no_preemption(*args: Any, **kwargs: Any) -> None:
    return None


def _lowest_first(req: Request) -> tuple[int, float, float, str]:
    """A queue order with the lowest priority first."""
    return (req.priority, req.deadline_s or float("inf"), req.submit_s, req.task_id)


CHANGED: list[Any] = [
    pytest.param([(coordinator.simulator.engine, "queue_key")], _lowest_first, {"preemption": True}, 4,
                 id="simulator-queue-order"),
    pytest.param([(coordinator.scheduler.pipeline, "queue_key")], _lowest_first, {"preemption": True}, 4,
                 id="leader-queue-order"),
    pytest.param([(coordinator.simulator.elastic, "plan_placements")], _rigid_plan, {"elastic": True}, 1,
                 id="simulator-elastic-sizing"),
    pytest.param([(coordinator.scheduler.cycle, "plan_placements")], _rigid_plan, {"elastic": True}, 1,
                 id="leader-elastic-sizing"),
    pytest.param([(coordinator.simulator.queues, "reclaim_for")], _no_victims, {"queues": True}, 0,
                 id="simulator-reclaim"),
    pytest.param([(coordinator.queues.planning, "reclaim_for")], _no_victims, {"queues": True}, 0,
                 id="leader-reclaim"),
    pytest.param([(coordinator.simulator.qos, "choose_preemption")], _no_preemption, {"preemption": True}, 2,
                 id="simulator-victim-choice"),
    pytest.param([(coordinator.qos.preemption, "choose_preemption")], _no_preemption, {"preemption": True}, 2,
                 id="leader-victim-choice"),
]


@pytest.mark.parametrize(("where", "rule", "kinds", "seed"), CHANGED)
def test_a_rule_changed_on_one_side_is_a_difference(where: list[tuple[Any, str]], rule: Any, kinds: dict[str, bool],
                                                    seed: int, etcd_server: EtcdCluster, etcd_prefix: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule changed as one side sees it (its queue order: lowest priority first; elastic jobs placed rigid at the
    size they ask for; no borrower ever reclaimed; no victims ever found): the mirror reports a difference, on
    a scenario of ``SEEDS`` where both sides agree with the rule unchanged and the rule matters."""
    assert seed in SEEDS
    for module, name in where:
        monkeypatch.setattr(module, name, rule)
    assert mirror(random_scenario(seed, **kinds), etcd_server.endpoints, etcd_prefix) != []
