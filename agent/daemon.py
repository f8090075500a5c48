"""``gptrm-agent``: sample telemetry, stream it, carry out decisions.

Object graph (built once in :func:`run`): config → GPU backend + collectors (sampler) →
outbox → task runtime → coordinator stream. The sampler runs on its own thread at
``--interval`` so a slow NVML call never stalls the stream; the stream and the runtime
share the asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import psutil
from structlog.typing import FilteringBoundLogger

from agent import config as config_mod
from agent.config import AgentConfig
from agent.health_check import HealthCheck
from agent.images import Containers
from agent.logpump import LogPump
from agent.logstore import LogService
from agent.metrics import AgentMetrics, serve_metrics
from agent.outbox import Outbox
from agent.room import Room
from agent.runtime import TaskRuntime
from agent.sampler import Sampler, open_gpu_backend, sampler_for
from agent.stream import AgentStream, Backoff
from agent.systemd_task import choose_runtime
from agent.task_user import TaskUserPolicy, parse_uid_range
from common.errors import ConfigError, GptrmError
from common.logging import get_logger
from common.netaddr import parse_port_range, primary_address
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.process import run_service
from common.sdnotify import SystemdNotifier, watchdog_loop
from common.tls import ClientTls, tls_files

__all__ = ["AGENT_VERSION", "main", "run"]

AGENT_VERSION = "0.1.0"


def _inventory(cfg: AgentConfig, sampler: Sampler, containers: Containers | None = None) -> types_pb2.NodeInventory:
    disk_total = 0
    for path in cfg.data_paths:
        with contextlib.suppress(OSError):
            disk_total += psutil.disk_usage(path).total
    shape = sampler.host_shape
    cores = shape.cores if shape is not None else psutil.cpu_count() or 0
    mem = shape.mem_bytes if shape is not None else psutil.virtual_memory().total
    ports = parse_port_range(cfg.task_port_range)
    return types_pb2.NodeInventory(
        node_id=cfg.node_name, hostname=socket.gethostname(), gpus=sampler.inventory(),
        cpu_cores=cores, mem_total_bytes=mem,
        disk_total_bytes=disk_total, labels=cfg.labels, agent_version=AGENT_VERSION,
        simulated=sampler.simulated, gpu_backend=sampler.backend, host_simulated=shape is not None,
        advertise_address=cfg.advertise_address or primary_address(), task_port_min=ports[0], task_port_max=ports[1],
        health_check=bool(cfg.health_check_program),
        containers=containers is not None and containers.available,
        images=containers.store.refs() if containers is not None and containers.store else [],
    )


async def run(cfg: AgentConfig, stop: asyncio.Event) -> None:
    """Run the agent until ``stop`` is set."""
    log = get_logger("agent").bind(node_id=cfg.node_name)
    loop = asyncio.get_running_loop()
    state_dir = Path(cfg.state_dir).expanduser()
    state_dir.mkdir(parents=True, exist_ok=True)
    outbox = Outbox(cfg.buffer_samples, cfg.interval_s)   # the stream sends as soon as something is added
    gpus = open_gpu_backend(cfg.gpu_backend, cfg.simulate_gpus, log, node_id=cfg.node_name,
                            simulate_topology=cfg.simulate_topology, health=cfg.health)
    try:
        task_users = TaskUserPolicy.from_config(cfg.task_user, cfg.task_users_allowed,
                                                uids=parse_uid_range(cfg.task_uids))
        uids = task_users.uids
        log.info("task_user_selected", user="" if uids else task_users.default.name,
                 uid=-1 if uids else task_users.default.uid, switch=task_users.default.switch,
                 own_uids=f"{uids.start}-{uids.stop - 1}" if uids else "off", allowed=list(task_users.allowed))
        runtime_kind = choose_runtime(cfg.runtime, euid=os.geteuid())
        log.info("task_runtime_selected", runtime=runtime_kind, configured=cfg.runtime)
        pump = LogPump(state_dir / "tasks", max_bytes=cfg.task_log_max_mib * 1024 * 1024,
                       node_max_bytes=cfg.task_logs_total_mib * 1024 * 1024)
        pump.start()
        containers = Containers.find(state_dir / "images", max_bytes=int(cfg.image_store_max_gib * (1 << 30)),
                                     auth_file=cfg.image_auth_file, insecure=tuple(cfg.image_insecure_registries),
                                     retries=cfg.image_pull_retries, cdi_dirs=tuple(cfg.cdi_spec_dirs))
        log.info("containers", available=containers.available, crun=containers.crun)
        runtime = TaskRuntime(state_dir, outbox.add_event, gpus, task_users=task_users, runtime=runtime_kind,
                              pump=pump, task_path=cfg.task_path, namespaces=cfg.task_namespaces,
                              containers=containers if runtime_kind == "process" else None)
        sampler = sampler_for(gpus, interval_s=cfg.interval_s, log=log, data_paths=cfg.data_paths,
                              task_pids=runtime.task_pids, simulate_host=cfg.simulate_host,
                              task_metrics=runtime.metrics_targets, qos_window_s=cfg.qos_window_s)
        runtime.adopt()
        logs = LogService(state_dir, lambda task_id: task_id in runtime.table.tasks)
        inventory = _inventory(cfg, sampler, runtime.containers)
        metrics_server = None
        if cfg.metrics_listen:
            metrics = AgentMetrics(latest=lambda: sampler.latest, devices=gpus.devices(),
                                   tasks=lambda: runtime.table.tasks, node=cfg.node_name,
                                   gpu_backend=sampler.backend, simulated=sampler.simulated,
                                   host_simulated=inventory.host_simulated, version=AGENT_VERSION)
            try:
                metrics_server = serve_metrics(metrics, cfg.metrics_listen, refuse=task_users.runs_tasks_as)
            except OSError as e:
                await asyncio.to_thread(pump.stop)
                raise GptrmError(f"--metrics-listen {cfg.metrics_listen}: cannot bind ({e.strerror})") from None
        boot_id = int.from_bytes(os.urandom(8), "big") >> 1
        files = tls_files(insecure=cfg.insecure, cert=cfg.tls_cert, key=cfg.tls_key, ca=cfg.tls_ca)
        client_tls = ClientTls(files) if files is not None else None
        if client_tls is None:
            log.warning("plaintext_grpc_enabled", reason="--insecure: the stream to the coordinator is not encrypted")
        stream = AgentStream(
            cfg.coordinator,
            lambda: agent_pb2.Register(inventory=inventory, tasks=runtime.statuses(), boot_id=boot_id),
            outbox, runtime.handle, Backoff(cfg.backoff_initial_s, cfg.backoff_max_s), cfg.batch_samples,
            credentials=client_tls.credentials if client_tls is not None else None, logs=logs,
            images=store.refs if (store := runtime.containers and runtime.containers.store) else None,
            redirect_jitter_s=cfg.redirect_jitter_s, sessions=runtime.sessions)
        if store:
            store.on_change = stream.kick   # a pull or an eviction is reported at once
        if client_tls is not None:
            loop.add_signal_handler(signal.SIGHUP, _reload_tls, client_tls, log)
        log.info("agent_started", gpu_backend=sampler.backend, simulated=sampler.simulated,
                 host_simulated=inventory.host_simulated,
                 gpus=len(inventory.gpus), coordinator=cfg.coordinator, interval_s=cfg.interval_s,
                 advertise_address=inventory.advertise_address, task_port_range=cfg.task_port_range,
                 metrics_listen=cfg.metrics_listen, health_check_program=cfg.health_check_program)

        room = Room(task_users, runtime.own_uids, parse_port_range(cfg.task_port_range))
        health_check = (HealthCheck(cfg.health_check_program, interval_s=cfg.health_check_interval_s,
                                    timeout_s=cfg.health_check_timeout_s, log=log)
                        if cfg.health_check_program else None)

        def emit_sample(sample: types_pb2.TelemetrySample) -> None:
            room.fill(sample)   # in the sampler's thread: a scan of /proc at most every few seconds
            if health_check is not None:
                health_check.fill(sample)   # PENDING until the first run ends: nothing is placed here before it
            loop.call_soon_threadsafe(outbox.add_sample, sample)

        if health_check is not None:
            health_check.start()

        sampler_stop = threading.Event()
        sampler_thread = threading.Thread(target=sampler.run, args=(emit_sample, sampler_stop),
                                          name="sampler", daemon=True)
        sampler_thread.start()
        notifier = SystemdNotifier()
        notifier.notify("READY=1")
        watchdog = asyncio.create_task(watchdog_loop(
            notifier, lambda: "connected" if stream.connected.is_set() else "connecting"))
        try:
            await stream.run(stop)
        finally:
            notifier.notify("STOPPING=1")
            watchdog.cancel()
            sampler_stop.set()
            await asyncio.to_thread(sampler_thread.join, 5)
            if health_check is not None:
                await asyncio.to_thread(health_check.stop)
            await runtime.shutdown()
            await asyncio.to_thread(pump.stop)
            if metrics_server is not None:
                await asyncio.to_thread(metrics_server.shutdown)
            log.info("agent_stopped", pending_events=outbox.pending_events, dropped_samples=outbox.dropped_total)
    finally:
        gpus.close()


def _reload_tls(client_tls: ClientTls, log: FilteringBoundLogger) -> None:
    """SIGHUP: new certificates for the next connection; the open stream stays up."""
    try:
        client_tls.reload()
    except ConfigError as e:
        log.error("reload_failed", key="tls", reason=str(e))
    else:
        log.info("reloaded", key="tls")



def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``gptrm-agent``; configuration problems are one line on stderr."""
    return run_service("gptrm-agent", config_mod.load, run, argv)


if __name__ == "__main__":
    sys.exit(main())
