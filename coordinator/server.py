"""``gptrm-coordinator``: wire the object graph once from the config and serve.

Start-up order matters: etcd first (embedded or remote, checked reachable so a bad
``--etcd`` is a one-line error), then the gRPC port (so a busy port fails before we
campaign), then the election; shutdown runs in reverse and resigns the leader key so a
standby takes over at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import gc
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from structlog.typing import FilteringBoundLogger

from common.errors import GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc
from common.process import run_service
from common.sdnotify import SystemdNotifier, watchdog_loop
from coordinator import config as config_mod
from coordinator import loop_priority
from coordinator.api import AdminService, AgentGatewayService
from coordinator.api.auth import Security
from coordinator.api.handshake_audit import HandshakeAuditTap, HandshakeRefusals
from coordinator.app import build
from coordinator.config import CoordinatorConfig
from coordinator.etcd_embedded import EmbeddedEtcd, EtcdCluster
from coordinator.monitor import serve_metrics
from coordinator.sync import EtcdClient, EtcdTls, connect
from coordinator.web import WebConsole

__all__ = ["main", "serve"]


ETCD_THREADS = 64
"""Threads of the event loop's default executor. Every etcd call runs in one (``asyncio.to_thread``); the
default pool (cores + 4 threads: 6 on 2 cores) let only that many calls be in flight, so submits and agents'
reports queued behind each other for whole etcd round trips. etcd folds the proposals that arrive together
into one raft round and one fsync: the more in flight, the more each round carries. The threads mostly wait
on the network, so on a small host they cost memory (a stack each), not CPU."""


async def serve(cfg: CoordinatorConfig, stop: asyncio.Event) -> None:
    """Run one coordinator replica until ``stop`` is set."""
    log = get_logger("coordinator").bind(leader_id=cfg.replica_id)
    got, refused = loop_priority.raise_to(cfg.loop_priority)   # before the loop starts threads: they stay normal
    (log.warning if refused else log.info)("loop_priority", asked=cfg.loop_priority, policy=got.policy,
                                           priority=got.priority, nice=got.nice, reset_on_fork=got.reset_on_fork,
                                           **({"reason": refused} if refused else {}))
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=ETCD_THREADS, thread_name_prefix="etcd"))
    etcd: EtcdCluster | None = None
    endpoints = cfg.etcd_endpoints
    if not endpoints:
        etcd = EmbeddedEtcd(Path(cfg.state_dir).expanduser() / "etcd")
        await asyncio.to_thread(etcd.start)
        endpoints = etcd.endpoints
        log.info("embedded_etcd_started", endpoints=endpoints, data_dir=str(etcd.data_dir))
    try:
        etcd_tls = EtcdTls(cfg.etcd_cacert, cfg.etcd_cert, cfg.etcd_key) if cfg.etcd_secure else None
        client = await asyncio.to_thread(connect, endpoints, cfg.etcd_timeout_s, etcd_tls)
        await _serve_with(cfg, client, stop, log)
    finally:
        if etcd is not None:
            await asyncio.to_thread(etcd.stop)
            log.info("embedded_etcd_stopped")


ACCEPT_LOOPS = 2
"""gRPC servers that share the listening port (each its own listening socket, ``SO_REUSEPORT``; the kernel spreads
new connections across them). grpc's asyncio server asks its core for the next call only once the event loop has
run the last one's hand-over, about six passes of the loop apart: with the loop busy, that one chain bounded the
calls a second the leader could take (``docs/throughput.md``). Each server has a chain of its own.
Another process cannot join the port unnoticed: :func:`check_port_free` refuses a port anything listens on."""


def check_port_free(listen: str) -> None:
    """Refuse ``HOST:PORT`` when a process already listens there: the servers bind it with ``SO_REUSEPORT``, which
    alone would let a second coordinator of the same user share the port instead of failing to start.

    A probe socket without ``SO_REUSEPORT`` binds each address the host resolves to (``SO_REUSEADDR``: connections
    of an earlier run still closing do not count). Port 0 (any free port) is never in use.

    :raises GptrmError: naming ``--listen``, when an address is in use or cannot be resolved.
    """
    host, _sep, port = listen.rpartition(":")
    if int(port) == 0:
        return
    try:
        addresses = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise GptrmError(f"--listen {listen}: cannot resolve {host!r} ({e.strerror})") from None
    for family, kind, proto, _name, address in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise GptrmError(f"--listen {listen}: cannot bind (address already in use)") from None
            if e.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):   # a family this host lacks (IPv6 off):
                raise GptrmError(f"--listen {listen}: cannot bind ({e.strerror})") from None   # gRPC skips it too


# After a leader change the whole fleet connects to the new leader within a second or two. grpc queues
# the calls its server has not yet handed to the event loop and, past 1,000 of them by default, starts
# refusing new ones (clients see CANCELLED or INTERNAL, then back off and retry, which only adds load):
# the queue is sized for a fleet of tens of thousands instead, and a queued call waits up to a minute.
SERVER_OPTIONS = [
    ("grpc.so_reuseport", 1),   # shared by the ACCEPT_LOOPS servers only (check_port_free)
    ("grpc.max_receive_message_length", 16 << 20),
    ("grpc.server.max_pending_requests", 40_000),
    ("grpc.server.max_pending_requests_hard_limit", 50_000),
    ("grpc.server_max_unrequested_time_in_server", 60),
]


async def _serve_with(cfg: CoordinatorConfig, client: EtcdClient, stop: asyncio.Event,
                      log: FilteringBoundLogger) -> None:
    app = build(cfg, client)
    security = Security.from_config(cfg, app.events)
    admin = AdminService(app, auth_mode=security.authn.mode)
    gateway = AgentGatewayService(app, security)
    health = HealthServicer()
    services = (admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
                agent_pb2.DESCRIPTOR.services_by_name["AgentGateway"].full_name,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    check_port_free(cfg.listen)
    servers: list[grpc.aio.Server] = []
    listen = cfg.listen
    for _ in range(ACCEPT_LOOPS):
        server = grpc.aio.server(interceptors=[security.interceptor], options=SERVER_OPTIONS)
        admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
        agent_pb2_grpc.add_AgentGatewayServicer_to_server(gateway, server)
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        reflection.enable_server_reflection(services, server)
        try:
            port = security.add_port(server, listen)
        except RuntimeError as e:
            raise GptrmError(f"--listen {cfg.listen}: cannot bind ({e})") from None
        listen = f"{listen.rpartition(':')[0]}:{port}"   # port 0: the others join the port the first was given
        servers.append(server)
    try:
        metrics_server = serve_metrics(app.metrics, cfg.metrics_listen) if cfg.metrics_listen else None
    except OSError as e:
        raise GptrmError(f"--metrics-listen {cfg.metrics_listen}: cannot bind ({e.strerror})") from None
    web = None
    if cfg.web_listen:   # bound before serving gRPC, as the other ports: a busy port fails before we campaign
        web = WebConsole(admin, security, cfg.web_listen, lambda: app.queue_admin.config, app.monitor.history,
                         app.services.load_history)
        await web.start()
    for server in servers:
        await server.start()
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, security.reload)
    for name in ("", *services[:2]):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    background = app.start(asyncio.get_running_loop())
    notifier = SystemdNotifier()
    notifier.notify("READY=1")
    background.append(asyncio.create_task(watchdog_loop(   # on the leader, fed only while every duty progresses
        notifier, lambda: "leader" if app.leadership.leading else "standby",
        stuck=lambda: app.supervisor.stuck() if app.leadership.leading else "")))
    log.info("coordinator_started", listen=cfg.listen, metrics_listen=cfg.metrics_listen, web_listen=cfg.web_listen,
             etcd=cfg.etcd, tls=not security.insecure, auth=security.authn.mode, etcd_tls=cfg.etcd_secure)
    # Handshakes gRPC refuses (expired, wrong CA, plaintext) are audited from its own log line.
    tap = None if security.insecure else HandshakeAuditTap(HandshakeRefusals(security.audit))
    if tap is not None:
        tap.start()
    try:
        await stop.wait()
    finally:
        log.info("coordinator_stopping")
        notifier.notify("STOPPING=1")
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        for w in background:
            w.cancel()
        await app.leadership.resign()
        await asyncio.sleep(0)
        await health.enter_graceful_shutdown()
        await asyncio.gather(*(server.stop(grace=1.0) for server in servers))
        if web is not None:
            await web.stop()
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        with contextlib.suppress(Exception):
            client.close()
        if tap is not None:
            tap.stop()
        security.audit.close()
        log.info("coordinator_stopped")


YOUNG_COLLECTION = 50_000
"""Container objects allocated between two collections of Python's youngest generation (its default: 700)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``gptrm-coordinator``; bad config or etcd trouble is one line on stderr.

    The cyclic garbage collector runs after :data:`YOUNG_COLLECTION` allocations instead of 700: every task
    submitted, placed and reported allocates thousands of short-lived objects that reference counting frees,
    and at the default a loaded leader collected its young generation a hundred times a second and walked every
    object it holds (a full collection, tens of milliseconds with the task table) every second or two, which
    took about a tenth of its time (``docs/throughput.md``). Reference cycles are still collected, less often."""
    gc.set_threshold(YOUNG_COLLECTION, 10, 10)
    return run_service("gptrm-coordinator", config_mod.load, serve, argv)


if __name__ == "__main__":
    sys.exit(main())
