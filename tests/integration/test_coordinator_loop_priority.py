"""A coordinator started with ``--loop-priority realtime``: its event-loop thread, and only it, runs SCHED_RR."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from coordinator.loop_priority import LoopPriority, current
from tests.integration.harness import Cluster


def _policies(pid: int) -> dict[int, int]:
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = os.sched_getscheduler(int(task.name)) & ~os.SCHED_RESET_ON_FORK
        except ProcessLookupError:   # a thread that ended meanwhile
            continue
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_RR needs root or CAP_SYS_NICE")
def test_the_loop_thread_alone_is_realtime_and_serves(cluster: Cluster) -> None:
    cluster.start_coordinator("c1", "--loop-priority", "realtime")
    cluster.wait_leader("c1")
    pid = cluster.proc("c1").pid
    policies = _policies(pid)
    assert policies.pop(pid) == os.SCHED_RR   # the main thread runs the event loop
    assert current(pid) == LoopPriority("realtime", 1, 0, True)
    assert len(policies) >= 3 and set(policies.values()) == {os.SCHED_OTHER}   # gRPC's and etcd calls' threads
    logged = [json.loads(line) for line in cluster.proc("c1").log().splitlines()
              if line.startswith("{") and '"loop_priority"' in line]
    assert [(e["asked"], e["policy"], e["priority"], e["reset_on_fork"]) for e in logged] == \
        [("realtime", "realtime", 1, True)]


def test_by_default_the_loop_thread_runs_normal(cluster: Cluster) -> None:
    cluster.start_coordinator("c1")
    cluster.wait_leader("c1")
    pid = cluster.proc("c1").pid
    assert set(_policies(pid).values()) == {os.SCHED_OTHER}
