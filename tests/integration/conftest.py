"""Integration fixtures: a :class:`Cluster` of real processes on the shared real etcd."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from common.etcd_embedded import EtcdCluster
from tests.integration.harness import Cluster


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
