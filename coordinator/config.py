"""The coordinator's configuration (flags, ``GPTRM_*`` env, TOML; see common.config)."""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from common.config import host_port, load_config, non_negative, option, positive, unit_interval
from common.errors import ConfigError
from common.paths import default_state_dir
from common.tls import tls_files
from common.types import DEFAULT_THRESHOLD, DEFAULT_THRESHOLD_MODE, THRESHOLD_MODES
from coordinator.elastic.rules import DEFAULT_INTERVAL_S
from coordinator.loop_priority import LOOP_PRIORITIES

__all__ = ["CoordinatorConfig", "check_security", "load"]

_POLICY_NAMES = ("max-utilization", "load-balancing", "power-efficient", "round-robin", "random", "first-fit")


def _etcd_urls(value: str) -> str | None:
    if value == "embedded":
        return None
    for url in value.split(","):
        hostport = url.strip().removeprefix("http://").removeprefix("https://").rstrip("/")
        if host_port(hostport) is not None or not hostport:
            return f"expected 'embedded' or URL[,URL...] like http://127.0.0.1:2379, got {url!r}"
    return None


def _prices(value: dict[str, str]) -> str | None:
    for model, price in value.items():
        try:
            number = float(price)
        except ValueError:
            return f"price of {model!r} is not a number: {price!r}"
        if not (math.isfinite(number) and number >= 0):
            return f"price of {model!r} must be zero or positive, got {price!r}"
    return None


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Every setting of ``gptrm-coordinator``."""

    listen: str = option("127.0.0.1:7770", "gRPC address for agents and gptrmctl", check=host_port, metavar="HOST:PORT")
    advertise: str = option("", "address other processes use to reach this one (default: --listen)", check=host_port)
    etcd: str = option("embedded", "'embedded' or etcd endpoints URL[,URL...]", check=_etcd_urls)
    etcd_prefix: str = option("/gptrm/v1/", "key prefix in etcd")
    etcd_timeout_s: float = option(5.0, "etcd request timeout, seconds", flag="etcd_timeout", check=positive)
    metrics_listen: str = option("127.0.0.1:9470", "Prometheus metrics HOST:PORT ('' disables)", check=host_port)
    web_listen: str = option("", "read-only web console HOST:PORT ('' disables; docs/web.md)", check=host_port,
                             metavar="HOST:PORT")
    state_dir: str = option(default_state_dir("coordinator"), "state directory (embedded etcd data)", path=True)
    coordinator_id: str = option("", "unique id of this replica (default HOSTNAME-PID)")
    lease_ttl_s: float = option(2.0, "leader lease TTL, seconds", flag="lease_ttl", check=positive)
    sampling_interval_s: float = option(1.0, "telemetry interval asked of agents, seconds", flag="sampling_interval",
                                        check=positive)
    heartbeat_interval_s: float = option(1.0, "agent heartbeat interval, seconds", flag="heartbeat_interval",
                                         check=positive)
    # 3,000: tests/bench/bench_ingest.py holds 3,500 agents × 8 GPUs at 1 Hz on one core of the 2-core
    # development machine (81 % of a core); 3,000 leaves room for the leader's other duties.
    ingest_budget_per_s: float = option(3000.0, "telemetry samples a second the leader ingests at most: beyond "
                                        "budget × sampling interval nodes, agents send summaries at a longer "
                                        "report interval (1, 2, 5, 10 or 15 s)", flag="ingest_budget",
                                        check=positive)
    lost_grace_s: float = option(30.0, "seconds without a stream before a node is LOST", flag="lost_grace",
                                 check=positive)
    lost_task_grace_s: float = option(60.0, "seconds a node stays lost before its tasks are failed (and requeued "
                                      "where their restart policy allows)", flag="lost_task_grace",
                                      check=non_negative)
    lost_node_gc_s: float = option(7 * 86400.0, "seconds a node stays lost before it is removed (0: only "
                                   "`gptrmctl nodes rm` removes it)", flag="lost_node_gc", check=non_negative)
    history_s: float = option(900.0, "telemetry history kept per node, seconds", flag="history", check=positive)
    history_fine_s: float = option(60.0, "of that history, the newest seconds kept per sample; the rest is kept "
                                   "per minute (each field's mean and maximum)", flag="history_fine", check=positive)
    task_grace_s: float = option(30.0, "seconds a recovered RUNNING task may go unreported before it fails",
                                 flag="task_grace", check=non_negative)
    finished_retention_s: float = option(7 * 86400.0, "seconds a finished task stays listed before it is removed "
                                         "from etcd", flag="finished_retention", check=positive)
    finished_retention_count: int = option(10_000, "finished tasks kept at most (the oldest are removed first)",
                                           flag="finished_retention_count", check=non_negative)
    lock_timeout_s: float = option(5.0, "how long drain and policy changes wait for their etcd lock, seconds",
                                   flag="lock_timeout", check=positive)
    policy: str = option("max-utilization", "placement policy at first start", choices=_POLICY_NAMES)
    threshold: float = option(DEFAULT_THRESHOLD, "utilization cap after placement on the dimensions the "
                              "threshold mode caps", check=unit_interval)
    threshold_mode: str = option(DEFAULT_THRESHOLD_MODE, "dimensions the threshold caps at first start: "
                                 "whole-gpus (host CPU, memory, disk and shared GPUs; whole GPUs may fill a node) "
                                 "or paper (every dimension, GPU count included)", choices=THRESHOLD_MODES)
    gang_topology_label: str = option("rack", "node label whose shared value multi-node tasks prefer (a gang that "
                                      "fits on nodes of one value is kept there; '' turns it off)", metavar="LABEL")
    preemption_protection_s: float = option(120.0, "a task is not preempted again within this many seconds of "
                                            "its last preemption", flag="preemption_protection", check=non_negative)
    elastic_interval_s: float = option(DEFAULT_INTERVAL_S, "an elastic task is resized at most once per this many "
                                       "seconds (its grows into idle GPUs and its shrinks for waiting tasks alike)",
                                       flag="elastic_interval", check=non_negative)
    elastic_restart_cost_s: float = option(30.0, "what a resize's restart is assumed to cost an elastic task until "
                                           "its own restarts were measured", flag="elastic_restart_cost",
                                           check=non_negative)
    loop_priority: str = option("normal", "CPU class of the event-loop thread: normal, or realtime (SCHED_RR 1, that "
                                "thread only; the installed systemd unit sets it itself; coordinator/loop_priority.py)",
                                choices=LOOP_PRIORITIES)
    log_level: str = option("info", "log level", choices=("debug", "info", "warning", "error"))
    insecure: bool = option(False, "serve plaintext gRPC; agents are not authenticated (trusted networks only)")
    tls_cert: str = option("", "server certificate (PEM) for mutual TLS", metavar="FILE", path=True)
    tls_key: str = option("", "server private key (PEM)", metavar="FILE", path=True)
    tls_ca: str = option("", "CA bundle that client certificates must chain to", metavar="FILE", path=True)
    tls_crl: str = option("", "CA-signed CRL of revoked client certificates (re-read on SIGHUP)", metavar="FILE",
                          path=True)
    admin_tokens: str = option("", "file of 'NAME ROLE sha256:HEX [queues=A,B]' bearer-token lines, ROLE one of "
                               "admin, queue-admin, submitter, viewer (re-read on change; docs/tenants.md)",
                               metavar="FILE", path=True)
    audit_log: str = option("", "append-only JSON-lines audit log of admin writes and refused calls",
                            metavar="FILE", path=True)
    etcd_cacert: str = option("", "CA bundle verifying etcd's server certificates (https:// endpoints)",
                              metavar="FILE", path=True)
    etcd_cert: str = option("", "client certificate presented to etcd", metavar="FILE", path=True)
    etcd_key: str = option("", "client private key for etcd", metavar="FILE", path=True)

    @property
    def etcd_secure(self) -> bool:
        """Whether etcd is reached over TLS (https:// endpoints or --etcd-cacert)."""
        return self.etcd != "embedded" and (self.etcd.strip().startswith("https://") or bool(self.etcd_cacert))
    node_provider: str = option("static", "how nodes are powered off/on or added: static (recommendations only) "
                                "or command (an operator executable)", choices=("static", "command"))
    node_provider_command: str = option("", "executable run with one JSON request on stdin "
                                        "(--node-provider command)", metavar="PATH")
    node_provider_timeout_s: float = option(60.0, "seconds one provider command may run", flag="node_provider_timeout",
                                            check=positive)
    power_down_after_s: float = option(0.0, "seconds a node must be idle before it is powered down (0: never)",
                                       flag="power_down_after", check=non_negative)
    spare_nodes: int = option(1, "idle nodes kept powered on", check=non_negative)
    wake_timeout_s: float = option(300.0, "seconds a woken node may take to register before the wake is retried",
                                   flag="wake_timeout", check=positive)
    power_off_grace_s: float = option(300.0, "seconds a node's agent may go on streaming after the provider accepted "
                                      "its power-off (its shutdown time) before the power-off counts as ignored",
                                      flag="power_off_grace", check=positive)
    power_off_retry_s: float = option(600.0, "seconds before a node whose power-off was ignored is powered off "
                                      "again; doubles with each further ignored power-off", flag="power_off_retry",
                                      check=positive)
    power_off_retry_max_s: float = option(14400.0, "longest wait before powering off again a node that ignored "
                                          "its power-offs, seconds", flag="power_off_retry_max", check=positive)
    health_drain_gpus: int = option(2, "unhealthy (fenced) GPUs at which a node is drained as a whole (0: never for "
                                    "that; a failed health check always drains)", check=non_negative)
    power_capping: str = option("off", "lower GPU power limits where the work gains little from power and its QoS "
                                "allows", choices=("off", "on"))
    power_cap_interval_s: float = option(30.0, "least seconds between a GPU's power-limit change and its next "
                                         "lowering", flag="power_cap_interval", check=positive)
    service_interval_s: float = option(5.0, "seconds between two passes of the services' replica controller",
                                       flag="service_interval", check=positive)
    service_stabilization_s: float = option(300.0, "a service scales down only to the highest count recommended "
                                            "over this many seconds", flag="service_stabilization",
                                            check=non_negative)
    service_cooldown_s: float = option(60.0, "seconds after a service's scale action before it scales down "
                                       "(up: half of it)", flag="service_cooldown", check=non_negative)
    service_max_actions: int = option(6, "scale actions a service may take per 10 minutes", check=positive)
    usage_interval_s: float = option(60.0, "seconds between two writes of the usage ledger to etcd (also at every "
                                     "hour boundary); the queues' budgets are read after each write",
                                     flag="usage_interval", check=positive)
    price_gpu_hour: dict[str, str] = option({}, "price of one GPU-hour by GPU model, MODEL=PRICE[,...] (a model "
                                            "name found in the GPU's model prices it, e.g. H100=2.5; TOML: a table)",
                                            check=_prices, metavar="MODEL=PRICE,...")
    price_kwh: float = option(0.0, "price of one kWh of the energy tasks draw", check=non_negative)
    queues_file: str = option("", "team queues (TOML) stored in etcd when none are stored yet; afterwards "
                              "`gptrmctl queues set/rm` change them ('' none: one default queue)",
                              flag="queues", metavar="FILE", path=True)
    mount_allowed: list[str] = option([], "host directories under which a task with an image may mount paths "
                                      "(--mount SRC:DST) and name image archives (oci-archive:PATH); anything "
                                      "else is refused at submit (none: no host path at all)", path=True,
                                      metavar="DIR[,DIR...]")

    @property
    def gpu_hour_prices(self) -> dict[str, float]:
        """``price_gpu_hour`` as numbers (checked when loaded)."""
        return {model: float(price) for model, price in self.price_gpu_hour.items()}

    @property
    def advertise_address(self) -> str:
        return self.advertise or self.listen

    @property
    def replica_id(self) -> str:
        return self.coordinator_id or f"{socket.gethostname()}-{os.getpid()}"

    @property
    def etcd_endpoints(self) -> list[str]:
        """``host:port`` endpoints from ``--etcd`` (empty for embedded)."""
        if self.etcd == "embedded":
            return []
        return [u.strip().removeprefix("http://").removeprefix("https://").rstrip("/") for u in self.etcd.split(",")]


def check_security(cfg: CoordinatorConfig) -> None:
    """Cross-field checks: TLS complete or explicitly insecure; etcd TLS settings consistent.

    :raises ConfigError: naming the settings that conflict or are missing.
    """
    tls_files(insecure=cfg.insecure, cert=cfg.tls_cert, key=cfg.tls_key, ca=cfg.tls_ca)
    if cfg.tls_crl and cfg.insecure:
        raise ConfigError("tls_crl: needs TLS, but --insecure is set")
    if cfg.etcd != "embedded":
        schemes = {u.strip().split("://", 1)[0] if "://" in u else "" for u in cfg.etcd.split(",")}
        if "https" in schemes and len(schemes) > 1:
            raise ConfigError(f"etcd: mixes https:// with plaintext endpoints: {cfg.etcd!r}")
        if "https" in schemes and not cfg.etcd_cacert:
            raise ConfigError("etcd_cacert: required for https:// etcd endpoints")
        if cfg.etcd_cacert and "http" in schemes:
            raise ConfigError(f"etcd: --etcd-cacert is set but the endpoints are http:// ({cfg.etcd!r})")
    if bool(cfg.etcd_cert) != bool(cfg.etcd_key):
        raise ConfigError("etcd_cert, etcd_key: give both or neither")
    if (cfg.etcd_cert or cfg.etcd_cacert) and not cfg.etcd_secure:
        raise ConfigError("etcd_cert: etcd TLS settings need https:// endpoints (not embedded)")


def load(argv: Sequence[str] | None = None) -> CoordinatorConfig:
    """Parse ``argv`` + env + TOML into a :class:`CoordinatorConfig` (raises ConfigError)."""
    cfg = load_config(CoordinatorConfig, argv, prog="gptrm-coordinator",
                      description="gptrm coordinator: scheduler, monitor, admin API")
    check_security(cfg)
    return cfg
