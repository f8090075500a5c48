"""Integration fixtures: a :class:`Cluster` of real processes on the shared real etcd."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from coordinator.etcd_embedded import EtcdCluster
from tests.integration import harness
from tests.integration.harness import Cluster

_LEFT_GRACE_S = 10.0


@pytest.fixture(autouse=True, scope="module")
def _no_task_left_behind() -> Iterator[None]:
    """After each module: no process runs as a task uid of the agents its tests started (checked once the
    processes killed when their clusters stopped had time to go). Any left is named in a failure, then killed,
    so later modules start clean."""
    first = len(harness.STARTED_AGENTS)
    yield
    agents = harness.STARTED_AGENTS[first:]
    end = time.monotonic() + _LEFT_GRACE_S
    while (left := harness.task_processes_left(agents)) and time.monotonic() < end:
        time.sleep(0.2)
    if not left:
        return
    names = [harness.describe(p) for p in left]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    pytest.fail(f"{len(left)} task process(es) still running after the module's tests: " + "; ".join(names))


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: EtcdCluster, etcd_prefix: str,
            request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Processes started by the test; stopped (and their logs printed on failure) afterwards."""
    c = Cluster(tmp_path, etcd_server.endpoints, etcd_prefix)
    yield c
    c.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(c.logs())
