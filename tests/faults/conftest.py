"""Fault-scenario fixtures: a fresh 3-member etcd and a :class:`FaultCluster` per test.

Scenarios marked ``faults`` are slow (tens of seconds to minutes each): ``make test`` skips
them and ``make test-faults`` (``GPTRM_FAULTS=1``) runs them all (the hook is in ``tests/conftest.py``,
so the marker also works on slow fault variants of integration tests).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.etcd_embedded import EtcdCluster
from tests.faults.cluster import FaultCluster


@pytest.fixture
def etcd3m(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A fresh 3-member etcd on loopback."""
    cluster = EtcdCluster(tmp_path / "etcd", size=3).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def fc(tmp_path: Path, etcd3m: EtcdCluster, request: pytest.FixtureRequest) -> Iterator[FaultCluster]:
    """Coordinators and agents of the scenario; their logs are printed when it fails."""
    c = FaultCluster(tmp_path, etcd3m)
    yield c
    c.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(c.logs())
