"""The ports the test harness hands its servers: apart per pytest worker, outside the kernel's ephemeral range."""

from __future__ import annotations

import itertools
import socket

import pytest

from tests.helpers import ports


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_each_worker_has_its_own_share(monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    shares = []
    for worker in range(workers):
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        shares.append(ports.worker_share(20000, 29499))
        first, last = map(int, ports.worker_task_ports().split("-"))
        assert 29500 <= first <= last <= 29999
    for (a_first, a_last), (b_first, b_last) in itertools.pairwise(shares):
        assert a_first <= a_last < b_first <= b_last


def test_ports_lie_below_the_ephemeral_range_and_are_not_handed_out_twice_in_a_row() -> None:
    taken = [ports.free_port() for _ in range(50)]
    assert len(set(taken)) == len(taken)
    assert all(20000 <= p < min(29500, ports._ephemeral_low()) for p in taken)


def test_a_bound_port_is_passed_over() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports.free_port()))
        held.listen()
        port = held.getsockname()[1]
        span = ports._LAST - ports._FIRST + 1
        assert port not in {ports.free_port() for _ in range(span)}
