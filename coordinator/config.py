"""The coordinator's configuration (flags, ``GPTRM_*`` env, TOML; see common.config)."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from common.config import host_port, load_config, non_negative, option, positive, unit_interval
from common.paths import default_state_dir

__all__ = ["CoordinatorConfig", "load"]

_POLICY_NAMES = ("max-utilization", "load-balancing", "power-efficient", "round-robin", "random", "first-fit")


def _etcd_urls(value: str) -> str | None:
    if value == "embedded":
        return None
    for url in value.split(","):
        hostport = url.strip().removeprefix("http://").removeprefix("https://").rstrip("/")
        if host_port(hostport) is not None or not hostport:
            return f"expected 'embedded' or URL[,URL...] like http://127.0.0.1:2379, got {url!r}"
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
    state_dir: str = option(default_state_dir("coordinator"), "state directory (embedded etcd data)")
    coordinator_id: str = option("", "unique id of this replica (default HOSTNAME-PID)")
    lease_ttl_s: float = option(2.0, "leader lease TTL, seconds", flag="lease_ttl", check=positive)
    sampling_interval_s: float = option(1.0, "telemetry interval asked of agents, seconds", flag="sampling_interval",
                                        check=positive)
    heartbeat_interval_s: float = option(1.0, "agent heartbeat interval, seconds", flag="heartbeat_interval",
                                         check=positive)
    lost_grace_s: float = option(30.0, "seconds without a stream before a node is LOST", flag="lost_grace",
                                 check=positive)
    history_s: float = option(900.0, "telemetry history kept per node, seconds", flag="history", check=positive)
    task_grace_s: float = option(30.0, "seconds a recovered RUNNING task may go unreported before it fails",
                                 flag="task_grace", check=non_negative)
    lock_timeout_s: float = option(5.0, "how long drain and policy changes wait for their etcd lock, seconds",
                                   flag="lock_timeout", check=positive)
    policy: str = option("max-utilization", "placement policy at first start", choices=_POLICY_NAMES)
    threshold: float = option(0.9, "per-dimension utilization cap after placement", check=unit_interval)
    preemption_protection_s: float = option(120.0, "a task is not preempted again within this many seconds of "
                                            "its last preemption", flag="preemption_protection", check=non_negative)
    log_level: str = option("info", "log level", choices=("debug", "info", "warning", "error"))

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


def load(argv: Sequence[str] | None = None) -> CoordinatorConfig:
    """Parse ``argv`` + env + TOML into a :class:`CoordinatorConfig` (raises ConfigError)."""
    return load_config(CoordinatorConfig, argv, prog="gptrm-coordinator",
                       description="gptrm coordinator: scheduler, monitor, admin API")
