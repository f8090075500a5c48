"""The agent's configuration (flags, ``GPTRM_*`` env, TOML; see common.config)."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass

from agent.collectors.simulated_host import CORES_PER_GPU, MEM_GIB_PER_GPU, check_simulate_host
from agent.health import (
    DEFAULT_APP_XIDS,
    DEFAULT_HEALTH_READ_S,
    DEFAULT_REPLACE_XIDS,
    DEFAULT_RESET_XIDS,
    HealthOptions,
    XidPolicy,
    format_xids,
    xid_list_problem,
)
from agent.health_check import DEFAULT_INTERVAL_S, DEFAULT_TIMEOUT_S, program_problem
from agent.launch import TASK_PATH, path_problem
from agent.logpump import DEFAULT_MAX_BYTES, DEFAULT_NODE_MAX_BYTES
from agent.task_user import DEFAULT_TASK_UIDS, parse_uid_range
from common.config import host_port, load_config, non_negative, option, positive
from common.errors import ConfigError
from common.netaddr import address_problem, parse_port_range
from common.paths import default_state_dir
from common.tls import tls_files
from common.topology import SIMULATED_TOPOLOGIES

__all__ = ["AgentConfig", "load"]


def _addresses(value: list[str]) -> str | None:
    if not value:
        return "needs at least one HOST:PORT"
    for a in value:
        problem = host_port(a)
        if problem or not a:
            return problem or "empty address"
    return None


def _uid_range(value: str) -> str | None:
    try:
        parse_uid_range(value)
    except ConfigError as e:
        return str(e).removeprefix("task_uids: ")
    return None


def _advertise(value: str) -> str | None:
    return None if value == "" else address_problem(value)


def _port_range(value: str) -> str | None:
    try:
        parse_port_range(value)
    except ValueError as e:
        return str(e)
    return None


def _positive_int(value: int) -> str | None:
    return None if value > 0 else "must be a positive integer"


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Every setting of ``gptrm-agent``."""

    coordinator: list[str] = option(["127.0.0.1:7770"], "coordinator HOST:PORT[,HOST:PORT...]", check=_addresses,
                                    metavar="HOST:PORT[,...]")
    node_id: str = option("", "node name (default: hostname)")
    gpu_backend: str = option("auto", "GPU telemetry backend", choices=("auto", "nvml", "simulated"))
    simulate_gpus: str = option("8xH100-80GB", "simulated GPUs, e.g. 8xH100-80GB or 4xA100-40GB,2xL4-24GB")
    simulate_topology: str = option(
        "auto", "how the simulated GPUs are linked: hgx (all NVLinked through NVSwitch, two sockets), "
        "pcie-nvlink-pairs (two-socket PCIe server, NVLink bridges on 0-1, 2-3, ...), pcie, none; auto: hgx for "
        "several H100/H200/A100/B200 of one model, pcie for several of another model, else none",
        choices=SIMULATED_TOPOLOGIES)
    simulate_host: str = option(
        "", "simulated host beside simulated GPUs: CORES:MEM_GIB, or 'real' for this machine "
        f"(default: {CORES_PER_GPU} cores and {MEM_GIB_PER_GPU} GiB per simulated GPU)",
        check=check_simulate_host, metavar="CORES:MEM_GIB")
    # GPU health signals (agent/health, docs/gpu-health-signals.md).
    gpu_health: str = option("on", "watch the GPUs' health signals (XID events, ECC, row remaps, NVLink, throttling, "
                             "PCIe link) and classify each GPU healthy, degraded or unhealthy", choices=("on", "off"))
    app_xids: str = option(format_xids(DEFAULT_APP_XIDS), "XIDs that are the application's fault: recorded on the "
                           "task, the GPU stays healthy ('' none)", check=xid_list_problem, metavar="XID[,XID...]")
    reset_xids: str = option(format_xids(DEFAULT_RESET_XIDS), "XIDs that make a GPU unhealthy until it is reset "
                             "(any XID in no list is treated so too)", check=xid_list_problem, metavar="XID[,XID...]")
    replace_xids: str = option(format_xids(DEFAULT_REPLACE_XIDS), "XIDs that make a GPU unhealthy until an admin "
                               "resumes it after repair", check=xid_list_problem, metavar="XID[,XID...]")
    health_read_interval_s: float = option(DEFAULT_HEALTH_READ_S, "seconds between reads of the slower GPU health "
                                           "signals (row remaps, retired pages, NVLink, PCIe; 0: every sample)",
                                           flag="health_read_interval", check=non_negative)
    simulate_faults: str = option("", "simulated GPUs only: inject faults from this JSON-lines file, followed while "
                                  "the agent runs (docs/gpu-health-signals.md)", metavar="FILE", path=True)
    metrics_listen: str = option("", "serve Prometheus metrics (per-GPU under dcgm-exporter's names, collector health, "
                                 "task GPUs) at http://HOST:PORT/metrics ('' disables)", check=host_port,
                                 metavar="HOST:PORT")
    interval_s: float = option(1.0, "sampling interval, seconds", flag="interval", check=positive)
    qos_window_s: float = option(30.0, "window of a task's latency p95 and token rate from its own metrics, seconds",
                                 flag="qos_window", check=positive)
    batch_samples: int = option(1, "samples per telemetry message", check=_positive_int)
    buffer_samples: int = option(900, "telemetry samples kept while disconnected (oldest dropped beyond)",
                                 check=_positive_int)
    data_paths: list[str] = option(["/"], "filesystems whose usage and I/O are reported", path=True)
    labels: dict[str, str] = option({}, "node labels KEY=VALUE[,KEY=VALUE...]")
    state_dir: str = option(default_state_dir("agent"), "state directory (task table, task logs)", path=True)
    task_log_max_mib: int = option(DEFAULT_MAX_BYTES >> 20, "most MiB of output kept on disk per task (the "
                                   "newest; the live log and one rotated copy together)", check=_positive_int)
    task_logs_total_mib: int = option(DEFAULT_NODE_MAX_BYTES >> 20, "most MiB of task output kept on this node, all "
                                      "tasks together (ended tasks' logs go first, then rotated copies)",
                                      check=_positive_int)
    backoff_initial_s: float = option(0.2, "first reconnect delay, seconds", flag="backoff_initial", check=positive)
    backoff_max_s: float = option(5.0, "longest reconnect delay, seconds", flag="backoff_max", check=positive)
    redirect_jitter_s: float = option(1.0, "after a redirect to the leader, wait a random time up to this many "
                                      "seconds before following it (a leader change sends every agent at once)",
                                      flag="redirect_jitter", check=non_negative)
    task_uids: str = option(DEFAULT_TASK_UIDS, "uids handed to tasks one each when the agent is root (FIRST-LAST), "
                            "so no two tasks share a uid; 'off' runs every task as --task-user",
                            check=_uid_range, metavar="FIRST-LAST|off")
    task_user: str = option("gptrm-task", "with --task-uids off: run tasks as this unprivileged user when the "
                            "agent is root (falls back to 'nobody' if the default user is missing; ignored when "
                            "not root)")
    task_users_allowed: list[str] = option([], "other users a task spec may ask for (run_as_user)")
    task_path: str = option(TASK_PATH, "PATH of every task whose spec sets none (tasks get a clean environment, "
                            "never the agent's: name here where the hosts' launchers live, e.g. a shared venv's bin)",
                            check=path_problem, metavar="DIR[:DIR...]")
    task_namespaces: str = option("auto", "give each task its own PID, mount and IPC namespace and /dev/shm (capped "
                                  "by its memory demand), so it sees no other task's processes and leaves no IPC "
                                  "objects behind: auto (where the agent is root and unshare works) or off",
                                  choices=("auto", "off"))
    runtime: str = option("auto", "task runtime: each task a transient systemd service (systemd-run: own cgroup, "
                          "only its GPUs' device nodes), a process group of the agent (process), or auto "
                          "(systemd-run when the agent is root on a systemd host, else process)",
                          choices=("auto", "process", "systemd-run"))
    advertise_address: str = option("", "data-plane address other nodes reach this one at: a multi-node task's "
                                    "MASTER_ADDR and GPTRM_NODELIST (default: this host's primary address)",
                                    check=_advertise, metavar="ADDRESS")
    task_port_range: str = option("29500-29999", "ports the coordinator may reserve on this node for a task's "
                                  "rendezvous (MASTER_PORT of tasks whose rank 0 runs here)", check=_port_range,
                                  metavar="LOW-HIGH")
    image_store_max_gib: float = option(50.0, "size cap of this node's image store, GiB: least recently used images "
                                        "no task runs from are removed beyond it (0: no cap)", check=non_negative,
                                        flag="image_store_max")
    image_auth_file: str = option("", "registry credentials for image pulls (containers-auth.json format, as "
                                  "`skopeo login --authfile` writes it; root's, 0600)", metavar="FILE", path=True)
    image_insecure_registries: list[str] = option([], "registries (HOST[:PORT]) pulled from over plain HTTP or "
                                                  "unverified TLS (a registry on a trusted network only)")
    cdi_spec_dirs: list[str] = option(["/etc/cdi", "/var/run/cdi"], "directories of CDI specs (JSON, as "
                                      "`nvidia-ctk cdi generate --format=json` writes them) whose edits give a task's "
                                      "container the host's GPU driver for its own GPUs", path=True)
    image_pull_retries: int = option(3, "attempts of an image pull before the task fails (backoff doubles from 1 s)",
                                     check=_positive_int)
    health_check_program: str = option(
        "", "the site's node health check (e.g. LBNL NHC), run as root with a fixed environment once at start and "
        "then every --health-check-interval: a non-zero exit or a timeout drains the node with the program's last "
        "line of output as reason, a zero exit lifts that drain (docs/health-checks.md); an absolute path to a "
        "root-owned executable no one else can write ('' disables)", check=program_problem, metavar="PATH")
    health_check_interval_s: float = option(DEFAULT_INTERVAL_S, "seconds from one health-check run's start to the "
                                            "next", flag="health_check_interval", check=positive)
    health_check_timeout_s: float = option(DEFAULT_TIMEOUT_S, "seconds a health-check run may take before its "
                                           "process group is killed and the node drains", flag="health_check_timeout",
                                           check=positive)
    log_level: str = option("info", "log level", choices=("debug", "info", "warning", "error"))
    insecure: bool = option(False, "connect in plaintext gRPC (only to a coordinator started with --insecure)")
    tls_cert: str = option("", "this node's certificate (PEM; its CN names the node)", metavar="FILE", path=True)
    tls_key: str = option("", "this node's private key (PEM)", metavar="FILE", path=True)
    tls_ca: str = option("", "CA bundle that the coordinator's certificate must chain to", metavar="FILE", path=True)

    @property
    def node_name(self) -> str:
        return self.node_id or socket.gethostname()

    @property
    def health(self) -> HealthOptions:
        """The GPU health options (raises ConfigError when an XID is in two lists)."""
        return HealthOptions(XidPolicy.from_lists(self.app_xids, self.reset_xids, self.replace_xids),
                             self.health_read_interval_s, self.simulate_faults, enabled=self.gpu_health == "on")


def load(argv: Sequence[str] | None = None) -> AgentConfig:
    """Parse ``argv`` + env + TOML into an :class:`AgentConfig` (raises ConfigError)."""
    cfg = load_config(AgentConfig, argv, prog="gptrm-agent", description="gptrm agent: GPU host telemetry and tasks")
    tls_files(insecure=cfg.insecure, cert=cfg.tls_cert, key=cfg.tls_key, ca=cfg.tls_ca)
    _ = cfg.health   # the XID lists do not overlap
    return cfg
