"""The mirror: the same scenarios through the leader's scheduling cycle (the coordinator's own object graph on a real
etcd) and through the simulator give the same decisions — which job goes to which node and GPUs, which elastic jobs
resize to what, which jobs are preemption victims, which are reclaimed — over random clusters and two waves of jobs
(``tests/helpers/mirror.py``).

Each feature (team queues with GPU pools, borrowing and reclaim; priorities and preemption, also with multi-node
jobs; elastic jobs; each placement policy) runs over a few seeded scenarios. Where the two sides still decide
differently, the case is marked ``xfail(strict=True)`` with the disagreement as its reason: it must keep failing until
the two agree, then the mark goes. The last tests change one rule on one side only and check that the mirror sees
it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

import coordinator.qos.preemption
import coordinator.queues.planning
import coordinator.scheduler.cycle
import coordinator.simulator.elastic
import coordinator.simulator.engine
import coordinator.simulator.qos
import coordinator.simulator.queues
from coordinator.domain import Request
from coordinator.etcd_embedded import EtcdCluster
from coordinator.queues import Queue, QueueConfig
from tests.helpers.mirror import Job, Node, Scenario, mirror, random_scenario

SEEDS = range(8)

SAME_TIME_VICTIMS = ("the simulator chooses victims among jobs it started at the same time (in the pass just run); "
                     "the leader only among RUNNING tasks, never one it placed in the same cycle")
ELASTIC_NODE_DEMAND = ("the leader commits an elastic task sized above its minimum with its spec's GPUs (its minimum) "
                       "as its nodes' demand, so its snapshot counts fewer GPUs used on those nodes than they hold "
                       "and load-balancing and max-utilization rank them by that; the simulator counts what the "
                       "placement holds")
POOL_MISMATCH = ("a task admitted in the any-model pool and placed on GPUs of a model that a queue names is not "
                 "started; the simulator gives those GPUs back at once and places the rest of its pass on them, the "
                 "leader keeps them taken for the rest of its cycle's batch")
ROUND_ROBIN_CURSOR = ("the leader builds its policy afresh every cycle, so round-robin's cursor starts at the first "
                      "node in every cycle; the simulator keeps one policy for the whole replay and its cursor goes on "
                      "from where the last pass left it")
USAGE_OF_ENDED = ("the leader's decayed queue usage adds what tasks hold at each cycle only, so what a task held "
                  "between the last cycle and its end is not counted; the simulator counts every job up to its end "
                  "(here: a different fair order of the queues)")


def _disagree(reason: str, raises: type[BaseException] = AssertionError) -> pytest.MarkDecorator:
    """A known disagreement: the case must fail, with ``raises`` (the mirror's assertion, or the simulator's error)."""
    return pytest.mark.xfail(strict=True, raises=raises, reason=reason)


def _seeds(known: dict[int, str]) -> list[Any]:
    """``SEEDS`` and the ``known`` ones, each known one marked with its disagreement."""
    return [pytest.param(s, marks=_disagree(known[s])) if s in known else s for s in sorted({*SEEDS, *known})]


def _agree(etcd: EtcdCluster, prefix: str, seed: int, **kinds: bool) -> None:
    diff = mirror(random_scenario(seed, **kinds), etcd.endpoints, prefix)
    assert diff == [], "\n".join(diff)


@pytest.mark.parametrize("seed", _seeds({4: USAGE_OF_ENDED, 11: POOL_MISMATCH}))
def test_team_queues_with_reclaim(seed: int, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Queues with quotas (in any GPU model or in one), borrowing and reclaim: the same admissions, placements and
    reclaimed borrowers."""
    _agree(etcd_server, etcd_prefix, seed, queues=True)


@_disagree("the leader reclaims a borrower and, in its next cycle, places it again ahead of the owed queue's task the "
           "reclaim was for (its batch is sorted by demand), then reclaims it again, cycle after cycle; the simulator "
           "reclaims once per time and keeps the borrower running")
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


@pytest.mark.parametrize("seed", _seeds({40: SAME_TIME_VICTIMS, 53: SAME_TIME_VICTIMS}))
def test_priorities_with_preemption(seed: int, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Priorities 0, 10 and 20 with preemption: the same placements and victims."""
    _agree(etcd_server, etcd_prefix, seed, preemption=True)


@pytest.mark.parametrize("seed", _seeds({4: SAME_TIME_VICTIMS}))
def test_multi_node_jobs_with_preemption(seed: int, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Jobs spanning two nodes among one-node jobs, with priorities and preemption: the same placements (rank 0
    first) and victims."""
    _agree(etcd_server, etcd_prefix, seed, preemption=True, gangs=True)


@pytest.mark.parametrize("seed", _seeds({25: ELASTIC_NODE_DEMAND, 34: ELASTIC_NODE_DEMAND}))
def test_elastic_jobs(seed: int, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Elastic and rigid jobs: the same sizes at placement, the same shrinks for what waits and grows into GPUs that
    ending jobs freed."""
    _agree(etcd_server, etcd_prefix, seed, elastic=True)


@pytest.mark.parametrize(("policy", "seed"), [
    pytest.param(p, s, marks=_disagree(ROUND_ROBIN_CURSOR)) if (p, s) == ("round-robin", 5) else (p, s)
    for p in ("power-efficient", "time-aware", "round-robin") for s in (*SEEDS[:4], 5)])
def test_other_policies(policy: str, seed: int, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """The scenarios with priorities and preemption under the policies the other tests do not draw."""
    scenario = replace(random_scenario(seed, preemption=True), policy=policy)
    diff = mirror(scenario, etcd_server.endpoints, etcd_prefix)
    assert diff == [], "\n".join(diff)


@_disagree("the leader orders a priority's tasks by slack (deadline − now − expected run time), the simulator by "
           "raw deadline")
def test_deadlines(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Two tasks, room for one: the one due first (in an hour, 10 minutes' work: 50 minutes of slack) and the one
    with the least slack (due in two hours, 90 minutes' work: 30 minutes) — the same one is placed on both sides."""
    scenario = Scenario((Node("n0", 4),), (Job("w0-00", 4, deadline_in_s=3600.0, time_limit_s=600.0),
                                           Job("w0-01", 4, deadline_in_s=7200.0, time_limit_s=5400.0)), "first-fit")
    diff = mirror(scenario, etcd_server.endpoints, etcd_prefix)
    assert diff == [], "\n".join(diff)


@_disagree("the simulator fails with team queues and preemption together: a preemptor it places "
           "(SimPreemption._place) is not booked with its queue, and SimQueues.holdings raises KeyError", KeyError)
def test_team_queues_with_preemption(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Team queues and priorities with preemption, together."""
    _agree(etcd_server, etcd_prefix, 0, queues=True, preemption=True)


@_disagree("the simulator refuses elastic jobs with preemption or team queues (SimConfig: elastic replays run "
           "without preemption, team queues and exact batches); the leader runs them together", ValueError)
def test_elastic_jobs_queues_and_preemption(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Elastic jobs, team queues and preemption, all on."""
    _agree(etcd_server, etcd_prefix, 0, queues=True, preemption=True, elastic=True)


# ---- the mirror sees a rule changed on one side -------------------------------------------------------------------


def _no_victims(*args: Any, **kwargs: Any) -> list[Any]:
    return []


def _no_sizing(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {}


def _sim_order(req: Request) -> tuple[int, float, float, str]:
    """The simulator's queue order, lowest priority first."""
    return (req.priority, req.deadline_s or float("inf"), req.submit_s, req.task_id)


def _leader_order(now: float, expected: Any) -> Callable[[Request], tuple[int, float, str]]:
    """The leader's queue order, lowest priority first."""
    return lambda req: (req.priority, req.submit_s, req.task_id)


CHANGED: list[Any] = [
    pytest.param([(coordinator.simulator.engine, "queue_key"), (coordinator.simulator.qos, "queue_key")], _sim_order,
                 {"preemption": True}, 4, id="simulator-queue-order"),
    pytest.param([(coordinator.scheduler.cycle, "slack_key")], _leader_order, {"preemption": True}, 4,
                 id="leader-queue-order"),
    pytest.param([(coordinator.simulator.elastic, "size_placements")], _no_sizing, {"elastic": True}, 1,
                 id="simulator-elastic-sizing"),
    pytest.param([(coordinator.scheduler.cycle, "size_placements")], _no_sizing, {"elastic": True}, 1,
                 id="leader-elastic-sizing"),
    pytest.param([(coordinator.simulator.queues, "reclaim_for")], _no_victims, {"queues": True}, 0,
                 id="simulator-reclaim"),
    pytest.param([(coordinator.queues.planning, "reclaim_for")], _no_victims, {"queues": True}, 0,
                 id="leader-reclaim"),
    pytest.param([(coordinator.simulator.qos, "choose_candidates")], _no_victims, {"preemption": True}, 2,
                 id="simulator-victim-choice"),
    pytest.param([(coordinator.qos.preemption, "choose_victims")], _no_victims, {"preemption": True}, 2,
                 id="leader-victim-choice"),
]


@pytest.mark.parametrize(("where", "rule", "kinds", "seed"), CHANGED)
def test_a_rule_changed_on_one_side_is_a_difference(where: list[tuple[Any, str]], rule: Any, kinds: dict[str, bool],
                                                    seed: int, etcd_server: EtcdCluster, etcd_prefix: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule changed as one side sees it (its queue order: lowest priority first; elastic jobs left at their
    first size at placement; no borrower ever reclaimed; no victims ever found): the mirror reports a difference, on
    a scenario of ``SEEDS`` where both sides agree with the rule unchanged and the rule matters."""
    assert seed in SEEDS
    for module, name in where:
        monkeypatch.setattr(module, name, rule)
    assert mirror(random_scenario(seed, **kinds), etcd_server.endpoints, etcd_prefix) != []
