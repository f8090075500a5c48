"""Decisions of the leader's scheduling cycle (``coordinator/scheduler/cycle.py``) over a few cycles, on the
coordinator's own object graph and a real etcd (the mirror's leader side, ``tests/helpers/mirror.py``): what an
elastic task holds is what its nodes count, a reclaim holds for the task it was made for, round-robin's cursor
goes on from cycle to cycle, a queue's usage counts its tasks up to their end, and GPUs of a placement its queue
cannot take go back to the rest of the batch."""

from __future__ import annotations

import asyncio

from coordinator.etcd_embedded import EtcdCluster
from coordinator.queues import Queue, QueueConfig
from tests.helpers.mirror import GPU_MODELS, Job, LeaderRun, Node, Scenario, leader_decisions

H100, A100 = GPU_MODELS


def _leader(scenario: Scenario, etcd: EtcdCluster, prefix: str) -> LeaderRun:
    return asyncio.run(leader_decisions(scenario, etcd.endpoints, prefix))


def test_an_elastic_task_counts_on_its_node_as_the_gpus_it_holds(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """An elastic task placed at 3 GPUs (its minimum 1) on one node and a rigid 2-GPU task on the other: the next
    cycle's load-balancing sees the elastic task's node with 3 GPUs used, not 1, and puts a 1-GPU task on the
    other, the less loaded."""
    scenario = Scenario((Node("n0", 4), Node("n1", 4)),
                        (Job("w0-00", 3, elastic=True), Job("w0-01", 2), Job("w1-02", 1, wave=1)),
                        "load-balancing", elastic=True)
    run = _leader(scenario, etcd_server, etcd_prefix)
    first, second = run.decisions
    (elastic_node, gpus), = first.placed["w0-00"]
    (rigid_node, _), = first.placed["w0-01"]
    assert len(gpus) == 3 and rigid_node != elastic_node
    assert second.placed["w1-02"][0][0] == rigid_node, run.decisions


def test_round_robin_goes_on_from_cycle_to_cycle(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Under round-robin, a 1-GPU task placed in one cycle and another in the next go to two nodes in turn: the
    second cycle's walk starts past the node the first one chose, not at the first node again."""
    scenario = Scenario((Node("n0", 4), Node("n1", 4), Node("n2", 4)),
                        (Job("w0-00", 1), Job("w1-01", 1, wave=1)), "round-robin")
    first, second = _leader(scenario, etcd_server, etcd_prefix).decisions
    assert first.placed["w0-00"][0][0] == "n0"
    assert second.placed["w1-01"][0][0] == "n1"


def test_a_reclaim_holds_for_the_task_it_was_made_for(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Queue alpha borrows for two 3-GPU tasks on two 4-GPU nodes; beta's 2-GPU task, within its quota, fits on
    neither under max-utilization's threshold: a borrower is reclaimed for it. The cycles after (the borrower
    stopped and back in the queue) place beta's task first, on the GPUs given back, and the borrower waits: it is
    not placed there again and reclaimed again, cycle after cycle."""
    queues = QueueConfig(queues=(Queue("alpha", gpus={"*": 2}, members=("*",), default_for=("*",)),
                                 Queue("beta", gpus={"*": 2}, members=("*",))))
    scenario = Scenario((Node("n0", 4), Node("n1", 4)), (Job("w0-00", 3, queue="alpha"), Job("w0-01", 2, queue="beta"),
                                                         Job("w0-02", 3, queue="alpha")), "max-utilization", queues)
    run = _leader(scenario, etcd_server, etcd_prefix)
    assert run.notes == []   # the leader's cycles settled: nothing stopped again and again
    first, second = run.decisions
    assert set(first.placed) == {"w0-00", "w0-02"} and len(first.reclaimed) == 1
    assert second.reclaimed == frozenset()


def test_a_queue_usage_counts_a_task_up_to_its_end(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Queue a ran a 3-GPU task, queue b a 1-GPU one, both ending just before the next cycle, which has room for
    one of two 4-GPU tasks, one of each queue. Counted up to their ends, a used more than b: b's task goes first in
    fair order (counted only up to the last cycle, neither used anything and a's goes first, by name)."""
    queues = QueueConfig(queues=(Queue("a", gpus={"*": 4}, members=("*",), default_for=("*",)),
                                 Queue("b", gpus={"*": 4}, members=("*",))))
    scenario = Scenario((Node("n0", 4),), (Job("w0-00", 3, queue="a", ends=True), Job("w0-01", 1, queue="b", ends=True),
                                           Job("w1-02", 4, queue="a", wave=1), Job("w1-03", 4, queue="b", wave=1)),
                        "first-fit", queues)
    first, second = _leader(scenario, etcd_server, etcd_prefix).decisions
    assert set(first.placed) == {"w0-00", "w0-01"}
    assert set(second.placed) == {"w1-03"}


def test_gpus_of_a_placement_in_another_pool_go_to_the_rest_of_the_batch(etcd_server: EtcdCluster,
                                                                          etcd_prefix: str) -> None:
    """Queue b's quota is in A100s (a pool of its own), queue a's in any model. a's any-model task, first in fair
    order, lands on the A100 node under first-fit and is not started there; b's A100 task, later in the same
    cycle's batch, gets those GPUs (they were given back at once, not kept taken until the next cycle)."""
    queues = QueueConfig(queues=(Queue("a", gpus={"*": 4}, members=("*",), default_for=("*",)),
                                 Queue("b", gpus={A100: 4}, members=("*",))))
    scenario = Scenario((Node("n0", 4, A100), Node("n1", 4, H100)),
                        (Job("w0-00", 4, queue="a"), Job("w0-01", 4, queue="b", gpu_model=A100)), "first-fit", queues)
    first, _ = _leader(scenario, etcd_server, etcd_prefix).decisions
    assert first.placed == {"w0-01": (("n0", (0, 1, 2, 3)),)}
