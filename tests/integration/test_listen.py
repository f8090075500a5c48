"""The coordinator's gRPC port: several servers of the one process share it, each with its own listening socket,
and no other process can join it."""

from __future__ import annotations

import socket

import grpc
import psutil
import pytest

from common.errors import GptrmError
from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc
from coordinator.server import ACCEPT_LOOPS, check_port_free
from tests.helpers.ports import free_port
from tests.integration.harness import Cluster, wait_until


def _listening(pid: int, port: int) -> int:
    """Listening sockets of process ``pid`` on ``port``."""
    return sum(1 for c in psutil.Process(pid).net_connections(kind="tcp")
               if c.status == psutil.CONN_LISTEN and c.laddr.port == port)


def test_the_servers_share_the_port_and_answer_on_every_connection(cluster: Cluster) -> None:
    """The leader listens ACCEPT_LOOPS times on its one port; calls over many connections (each channel its own,
    as many users' clients) are all answered, whichever socket took the connection."""
    address = cluster.start_coordinator("c1")
    cluster.wait_leader("c1")
    port = int(address.rpartition(":")[2])
    assert ACCEPT_LOOPS > 1
    assert _listening(cluster.proc("c1").pid, port) == ACCEPT_LOOPS
    channels = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(16)]
    try:
        for channel in channels:
            status = admin_pb2_grpc.AdminStub(channel).GetStatus(admin_pb2.GetStatusRequest(), timeout=10)
            assert status.is_leader
    finally:
        for channel in channels:
            channel.close()


def test_a_second_coordinator_on_the_port_fails_at_once(cluster: Cluster) -> None:
    """A second coordinator given the same --listen does not join the port: it exits, naming --listen, and the
    first keeps serving alone."""
    address = cluster.start_coordinator("c1")
    cluster.wait_leader("c1")
    port = int(address.rpartition(":")[2])
    cluster.start_coordinator("c2", port=port)
    second = cluster.proc("c2")
    wait_until(lambda: not second.alive, timeout_s=60, what="the second coordinator to exit")
    assert second.proc is not None and second.proc.returncode != 0
    assert f"--listen {address}: cannot bind (address already in use)" in second.log()
    assert _listening(cluster.proc("c1").pid, port) == ACCEPT_LOOPS
    assert cluster.status("c1").is_leader


def test_the_port_check_refuses_a_port_in_use_and_passes_a_free_one() -> None:
    """check_port_free: a port another socket listens on (even with SO_REUSEPORT, as a coordinator's) is refused,
    naming --listen; a free port, and port 0, pass."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        busy = other.getsockname()[1]
        with pytest.raises(GptrmError, match=rf"--listen 127\.0\.0\.1:{busy}: cannot bind \(address already in use\)"):
            check_port_free(f"127.0.0.1:{busy}")
    check_port_free(f"127.0.0.1:{free_port()}")
    check_port_free("127.0.0.1:0")
