"""Task specs for ``gptrmctl submit``: from a YAML/JSON file or from flags.

Both paths build the same mapping and hand it to the profiler's parser, which rejects
unknown fields by name; the coordinator validates the values again before storing.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import yaml

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.ctl.transport import EXIT_USAGE, CtlError
from coordinator.profiler.workflow_spec import ARRAY_MAX_ELEMENTS

__all__ = ["add_submit_arguments", "spec_from_args", "spec_from_file"]


def add_submit_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``gptrmctl submit``."""
    p.add_argument("-f", "--file", help="task spec file (YAML or JSON); '-' reads standard input")
    p.add_argument("--name", help="task name")
    p.add_argument("--kind", help="training | fine-tuning | inference (default: unspecified, profiled as inference)")
    p.add_argument("--model", dest="model_name", help="model name (the profiler learns per name)")
    p.add_argument("--params-b", type=float, help="model parameters, billions")
    p.add_argument("--precision", help="fp32 | bf16 | fp16 | fp8 | int8 | int4")
    p.add_argument("--gpus", metavar="N|MIN:MAX",
                   help="explicit GPUs per node (overrides the profile); MIN:MAX makes a training task elastic: it "
                        "runs at any size of the range on one node, grown into idle GPUs and shrunk for waiting "
                        "work by checkpoint-restart")
    p.add_argument("--gpu-mem-gib", type=float, help="explicit GPU memory per GPU, GiB")
    p.add_argument("--cpu", type=float, help="explicit CPU cores")
    p.add_argument("--mem-gib", type=float, help="explicit host memory, GiB")
    p.add_argument("--nodes", metavar="N|MIN:MAX",
                   help="gang size (nodes); MIN:MAX makes a multi-node training task elastic in whole nodes of "
                        "--gpus GPUs each")
    p.add_argument("--throughput-counter", metavar="METRIC",
                   help="elastic tasks: the Prometheus counter on --metrics-port that measures its progress "
                        "(samples, tokens); default: GPU utilization × GPUs")
    p.add_argument("--launcher", choices=("torchrun",),
                   help="run the command under torchrun with the task's nodes, rank, GPUs and rendezvous "
                        "(torchrun --nnodes ... --master-port ... -- ARGV; --standalone on one node; docs/pytorch.md)")
    c = p.add_argument_group("Container (docs/containers.md)")
    c.add_argument("--image", metavar="REF",
                   help="run the command inside this OCI image: REGISTRY/NAME:TAG, NAME@sha256:HEX, "
                        "oci-archive:PATH or docker-archive:PATH (a file on the node)")
    c.add_argument("--mount", action="append", default=[], metavar="SRC:DST[:ro]",
                   help="bind host path SRC at DST in the container (only below the cluster's allowed paths); "
                        "repeatable")
    c.add_argument("--workdir", metavar="DIR", help="working directory inside the container (default: the image's)")
    c.add_argument("--shm", metavar="SIZE", help="size of the container's /dev/shm (e.g. 8GiB; default: the "
                                                 "task's memory demand)")
    p.add_argument("--priority", type=int, help="higher runs first")
    p.add_argument("--queue", metavar="NAME", help="the team queue it runs in (default: your credential's default)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--restart-policy", help="never | on-failure | always")
    p.add_argument("--max-restarts", type=int, help="restarts allowed by the restart policy (default 3, at most 1000)")
    p.add_argument("--stop-grace-s", type=float, help="seconds between SIGTERM and SIGKILL on stop")
    p.add_argument("--request-id", help="idempotency key (a retried submit returns the same task)")
    p.add_argument("--queue-unplaceable", action="store_true",
                   help="queue the task even when no known node could hold it empty (it waits for such a node); "
                        "without it such a task is refused")
    p.add_argument("--wait", action="store_true",
                   help="follow the task to its final state (progress on stderr) and exit with its exit code")
    w = p.add_argument_group("Workflows (docs/workflows.md)")
    w.add_argument("--array", metavar="FIRST-LAST[:STEP][%MAX]",
                   help="submit an array: one element task per index, each with GPTRM_ARRAY_ID, GPTRM_ARRAY_INDEX, "
                        "SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID; at most MAX of them placed or running at once "
                        f"(at most {ARRAY_MAX_ELEMENTS} elements)")
    w.add_argument("--after", action="append", default=[], metavar="KIND:ID[,ID...]",
                   help="wait until every ID (a task, or an array: all its elements) ended: ok (succeeded), notok "
                        "(did not succeed) or any; repeatable. A dependency that can no longer be met cancels it")
    w.add_argument("--keep-unmet", action="store_true", default=None,
                   help="keep the task pending (with the reason) when a dependency can no longer be met")
    w.add_argument("--begin", metavar="TIME|+DURATION",
                   help="not placed before this ISO 8601 time (local without an offset) or this long from now (+2h)")
    q = p.add_argument_group("QoS")
    p.add_argument("--run-as-user", metavar="USER",
                   help="run the task as USER (only if the agent's --task-users-allowed lists it)")
    q.add_argument("--no-preemptible", dest="preemptible", action="store_false", default=None,
                   help="never preempt this task for higher-priority work")
    q.add_argument("--full-power", action="store_true", default=None,
                   help="never lower this task's GPU power limits (power capping)")
    q.add_argument("--checkpoint-signal", metavar="SIGNAL", help="sent before a preemption stop (default SIGUSR1)")
    q.add_argument("--deadline", metavar="TIME|DURATION",
                   help="finish by an ISO 8601 time (2025-06-01T18:00:00Z; local time without an offset) "
                        "or within a duration from now (2h30m)")
    q.add_argument("--max-latency-ms", type=float, help="p95 request latency target (inference)")
    q.add_argument("--min-tokens-per-s", type=float, help="generated tokens per second target (inference)")
    q.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="the task serves Prometheus metrics at http://127.0.0.1:PORT/metrics")
    q.add_argument("--metrics-url", metavar="URL", help="or at this http URL on its own host (loopback)")
    q.add_argument("--metrics-flavour", metavar="FLAVOUR", help="vllm (default) | tgi | custom")
    q.add_argument("--metrics-name", action="append", default=[], metavar="ROLE=METRIC",
                   help="read ROLE from METRIC (roles: latency_histogram, ttft_histogram, tokens_counter, "
                        "running_gauge, waiting_gauge); repeatable")
    t = p.add_argument_group("Limits and nodes")
    t.add_argument("--time", metavar="DURATION",
                   help="time limit (4h, 90s, 1:30:00, a bare number is minutes): at it the task gets its checkpoint "
                        "signal, then is stopped and ends timeout (default: its queue's; at most its queue's maximum)")
    t.add_argument("--min-runtime", metavar="DURATION",
                   help="protected run time: no preemption, reclaim or elastic shrink picks it before it has run "
                        "this long (default: its queue's)")
    t.add_argument("--nodelist", metavar="N1,N2", help="run only on these nodes")
    t.add_argument("--exclude", metavar="N1,N2", help="never run on these nodes")
    t.add_argument("--constraint", action="append", default=[], metavar="LABEL=VALUE",
                   help="run only on nodes with this label (labels set by admins); repeatable")
    v = p.add_argument_group("Service (an inference task run as MIN..MAX replicas, scaled on one signal)")
    v.add_argument("--replicas", metavar="MIN:MAX",
                   help="run as a service of MIN..MAX replica tasks (each gets GPTRM_REPLICA, GPTRM_PORT_OFFSET "
                        "and GPTRM_METRICS_PORT = --metrics-port + index); scale on --target-util, "
                        "--max-latency-ms or --min-tokens-per-s")
    v.add_argument("--target-util", type=float, metavar="X", help="mean GPU utilization target of the replicas, 0..1")
    v.add_argument("--pack-replicas", action="store_true",
                   help="let replicas share a node (default: each new replica avoids its siblings' nodes while "
                        "another node has room)")
    p.add_argument("argv", nargs="*", help="command to run, after --")


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise CtlError(f"{flag}: expected KEY=VALUE, got {item!r}", EXIT_USAGE)
        out[k] = v
    return out


def _gib(value: float | None, flag: str) -> str | None:
    """A GiB flag as a size the spec parser reads (``"1.5GiB"``), written without an exponent."""
    if value is None:
        return None
    if not math.isfinite(value) or value < 0:
        raise CtlError(f"submit: {flag}: must be a finite number ≥ 0, got {value}", EXIT_USAGE)
    return f"{value:f}GiB"


def spec_from_args(args: argparse.Namespace) -> types_pb2.TaskSpec:
    """Build a spec from ``submit`` flags."""
    if not args.argv:
        raise CtlError("submit: give -f FILE or a command after --", EXIT_USAGE)
    d: dict[str, Any] = {"name": args.name or Path(args.argv[0]).name, "argv": list(args.argv)}
    if args.kind is not None:
        d["kind"] = args.kind
    model = {k: v for k, v in (("name", args.model_name), ("params_billions", args.params_b),
                               ("precision", args.precision)) if v is not None}
    if model:
        d["model"] = model
    gpus, nodes = _range(args.gpus, "--gpus", float), _range(args.nodes, "--nodes", int)
    elastic = _elastic_from_args(gpus, nodes, args.throughput_counter)
    if elastic:
        d["elastic"] = elastic
        if "min_nodes" in elastic and gpus is not None:
            d["gpus_per_node"] = int(gpus[0])
        gpus = (elastic.get("min_gpus", gpus[0] if gpus else None), None)
        nodes = None
    demand = {k: v for k, v in (("gpus", gpus[0] if gpus else None),
                                ("gpu_mem_bytes", _gib(args.gpu_mem_gib, "--gpu-mem-gib")),
                                ("cpu_cores", args.cpu),
                                ("mem_bytes", _gib(args.mem_gib, "--mem-gib"))) if v is not None}
    if demand:
        d["demand"] = demand
        if gpus and gpus[0] is not None and 0 < gpus[0] < 1:
            d["allow_gpu_sharing"] = True
    for key, value in (("nodes", nodes[0] if nodes else None), ("priority", args.priority),
                       ("restart_policy", args.restart_policy), ("max_restarts", args.max_restarts),
                       ("stop_grace_s", args.stop_grace_s)):
        if value is not None:
            d[key] = value
    _qos_from_args(args, d)
    if args.env:
        d["env"] = _pairs(args.env, "--env")
    if args.label:
        d["labels"] = _pairs(args.label, "--label")
    if args.run_as_user is not None:
        d["run_as_user"] = args.run_as_user
    if args.launcher is not None:
        d["launcher"] = args.launcher
    if args.queue is not None:
        d["queue"] = args.queue
    for key, value in (("image", args.image), ("mounts", args.mount or None), ("workdir", args.workdir),
                       ("shm_bytes", args.shm)):
        if value is not None:
            d[key] = value
    for key, value in (("array", args.array), ("begin", args.begin), ("keep_unmet", args.keep_unmet)):
        if value is not None:
            d[key] = value
    if args.after:
        d["after"] = list(args.after)
    _limits_from_args(args, d)
    return _parse(d, "flags")


def _limits_from_args(args: argparse.Namespace, d: dict[str, Any]) -> None:
    """``--time``, ``--min-runtime``, ``--nodelist``, ``--exclude`` and ``--constraint`` into the spec mapping."""
    for key, value in (("time_limit", getattr(args, "time", None)),
                       ("min_runtime", getattr(args, "min_runtime", None))):
        if value is not None:
            d[key] = value
    constraints: dict[str, Any] = {}
    for key, flag in (("only_nodes", "nodelist"), ("avoid_nodes", "exclude")):
        text = getattr(args, flag, None)
        if text is not None:
            nodes = [n for n in (s.strip() for s in text.split(",")) if n]
            if not nodes:
                raise CtlError(f"submit: --{flag}: give one or more node ids, comma-separated", EXIT_USAGE)
            constraints[key] = nodes
    if getattr(args, "constraint", None):
        constraints["node_selector"] = _pairs(args.constraint, "--constraint")
    if constraints:
        d["constraints"] = constraints


def _range(text: str | None, flag: str, kind: type) -> tuple[Any, Any] | None:
    """``N`` → ``(N, None)``, ``MIN:MAX`` → ``(MIN, MAX)``; None when the flag was not given."""
    if text is None:
        return None
    lo, sep, hi = text.partition(":")
    try:
        low = kind(lo)
        high = kind(hi) if sep else None
    except ValueError:
        raise CtlError(f"submit: {flag}: expected N or MIN:MAX, got {text[:64]!r}", EXIT_USAGE) from None
    if not math.isfinite(low) or low < 0 or (high is not None and (high < 0 or not math.isfinite(high))):
        raise CtlError(f"submit: {flag}: must be finite and not negative, got {text[:64]!r}", EXIT_USAGE)
    return low, high


def _elastic_from_args(gpus: tuple[Any, Any] | None, nodes: tuple[Any, Any] | None,
                       counter: str | None) -> dict[str, Any]:
    """``elastic`` of the spec from ``--gpus MIN:MAX`` or ``--nodes MIN:MAX`` (the coordinator checks the values)."""
    if gpus is not None and gpus[1] is not None:
        if nodes is not None and nodes[1] is not None:
            raise CtlError("submit: give --gpus MIN:MAX (one node) or --nodes MIN:MAX, not both", EXIT_USAGE)
        if gpus[0] != int(gpus[0]) or gpus[1] != int(gpus[1]):
            raise CtlError("submit: --gpus MIN:MAX: whole GPUs only", EXIT_USAGE)
        out: dict[str, Any] = {"min_gpus": int(gpus[0]), "max_gpus": int(gpus[1])}
    elif nodes is not None and nodes[1] is not None:
        if gpus is None or gpus[0] < 1 or gpus[0] != int(gpus[0]):
            raise CtlError("submit: --nodes MIN:MAX needs --gpus N (whole GPUs on each node)", EXIT_USAGE)
        out = {"min_nodes": nodes[0], "max_nodes": nodes[1]}
    else:
        if counter is not None:
            raise CtlError("submit: --throughput-counter is for elastic tasks (--gpus MIN:MAX or --nodes MIN:MAX)",
                           EXIT_USAGE)
        return {}
    if counter is not None:
        out["throughput_counter"] = counter
    return out


def _qos_from_args(args: argparse.Namespace, d: dict[str, Any]) -> None:
    """The QoS flags into the spec mapping (the parser and the coordinator check the values)."""
    for key, value in (("preemptible", args.preemptible), ("checkpoint_signal", args.checkpoint_signal),
                       ("metrics_port", args.metrics_port), ("metrics_url", args.metrics_url),
                       ("full_power", args.full_power)):
        if value is not None:
            d[key] = value
    qos = {k: v for k, v in (("deadline", args.deadline), ("max_latency_ms", args.max_latency_ms),
                             ("min_tokens_per_s", args.min_tokens_per_s)) if v is not None}
    if qos:
        d["qos"] = qos
    mapping: dict[str, Any] = _pairs(args.metrics_name, "--metrics-name")
    if args.metrics_flavour is not None:
        mapping["flavour"] = args.metrics_flavour
    if mapping:
        d["metrics_mapping"] = mapping


def service_from_args(args: argparse.Namespace, spec: types_pb2.TaskSpec) -> bool:
    """Set ``spec.service`` from ``--replicas MIN:MAX`` and ``--target-util``; False when not a service.

    The coordinator checks the values (MIN ≤ MAX, the cap, the target's range, one signal).
    """
    if args.replicas is None:
        if args.target_util is not None or getattr(args, "pack_replicas", False):
            flag = "--target-util" if args.target_util is not None else "--pack-replicas"
            raise CtlError(f"submit: {flag} needs --replicas MIN:MAX", EXIT_USAGE)
        return False
    lo, sep, hi = args.replicas.partition(":")
    try:
        low, high = int(lo), int(hi if sep else lo)
    except ValueError:
        raise CtlError(f"submit: --replicas: expected MIN:MAX (two whole numbers), got {args.replicas[:64]!r}",
                       EXIT_USAGE) from None
    if low < 0 or high < 0:
        raise CtlError(f"submit: --replicas: MIN and MAX must not be negative, got {args.replicas!r}", EXIT_USAGE)
    if max(low, high) >= 2**32:
        raise CtlError(f"submit: --replicas: MIN and MAX must be below 2^32, got {args.replicas[:64]!r}", EXIT_USAGE)
    spec.service.min_replicas, spec.service.max_replicas = low, high
    if args.target_util is not None:
        spec.service.target_util = args.target_util
    spec.service.pack_replicas = bool(getattr(args, "pack_replicas", False))
    return True


def spec_from_file(path: str) -> types_pb2.TaskSpec:
    """Read a YAML or JSON spec file ('-' for stdin)."""
    import sys

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise CtlError(f"cannot read spec file {path!r}: {e.strerror}", EXIT_USAGE) from None
    except UnicodeDecodeError as e:
        raise CtlError(f"spec file {path!r} is not UTF-8 text (byte {e.start})", EXIT_USAGE) from None
    try:
        doc = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise CtlError(f"spec file {path!r} is not valid YAML/JSON: {e}", EXIT_USAGE) from None
    except RecursionError:
        raise CtlError(f"spec file {path!r}: nested too deeply", EXIT_USAGE) from None
    except ValueError as e:   # an integer with more digits than Python converts
        what = "a number has too many digits" if "digits" in str(e) else str(e)
        raise CtlError(f"spec file {path!r}: {what}", EXIT_USAGE) from None
    if not isinstance(doc, dict):
        raise CtlError(f"spec file {path!r}: expected a mapping at the top level", EXIT_USAGE)
    return _parse(doc, f"spec file {path!r}")


def _parse(doc: dict[str, Any], source: str) -> types_pb2.TaskSpec:
    """The spec a mapping describes, with the checks that need no coordinator (types, ranges, what
    ``execve`` cannot pass); any problem is a usage error naming the field."""
    from common.oci import validate_container
    from coordinator.profiler.profiler import spec_from_mapping
    from coordinator.profiler.validation import validate_argv_env

    try:
        spec = spec_from_mapping(doc)
        validate_argv_env(spec.argv, spec.env)
        validate_container(spec.image, spec.mounts, spec.workdir, spec.shm_bytes)
    except ValidationError as e:
        raise CtlError(f"{source}: {e}", EXIT_USAGE) from None
    except RecursionError:
        raise CtlError(f"{source}: nested too deeply", EXIT_USAGE) from None
    return spec
