"""gptrmctl entry point: argument parsing and one function per command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from common.errors import ConfigError
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.ctl import render
from coordinator.ctl.transport import EXIT_REFUSED, EXIT_USAGE, ChannelSecurity, CtlError, Transport

__all__ = ["main"]

DEFAULT_COORDINATOR = "127.0.0.1:7770"


class _Parser(argparse.ArgumentParser):
    """argparse that exits with the usage code (2) and one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        raise CtlError(f"{self.prog}: {message}", EXIT_USAGE)


def _out(args: argparse.Namespace, doc: Any, text: str) -> None:
    print(render.dump_json(doc) if args.output == "json" else text)
    if args.output != "json" and isinstance(doc, dict) and doc.get("stale"):
        print("[stale] etcd is unreachable: this answer comes from the coordinator's memory", file=sys.stderr)


def cmd_status(t: Transport, args: argparse.Namespace) -> None:
    s = t.call("GetStatus", admin_pb2.GetStatusRequest())
    d = render.status_dict(s)
    o = s.objectives
    lines = [
        f"coordinator   {s.coordinator_id} ({'leader' if s.is_leader else 'standby'}){' [stale]' if s.stale else ''}",
        f"leader        {s.leader_id or '-'} at {s.leader_address or '-'} (epoch {s.leader_epoch})",
        f"uptime        {s.uptime_s:.0f} s",
        f"policy        {s.policy.name} (threshold {s.policy.threshold:.2f})",
        f"nodes         {_counts(d['nodes_by_state'])}",
        f"tasks         {_counts(d['tasks_by_state'])}",
        f"gpus          {s.gpus_allocated}/{s.gpus_total} allocated",
        f"utilization   mean {o.util_mean * 100:.1f} %  std-dev {o.util_std * 100:.1f} %  "
        f"gpu memory {o.gpu_mem_util * 100:.1f} %",
        f"power         {o.power_w:.0f} W  energy {o.energy_j / 3.6e6:.3f} kWh since start",
        f"security      {'INSECURE: plaintext gRPC, agents unauthenticated' if s.insecure else 'mutual TLS'}"
        f" (auth: {s.auth or 'unknown'})",
    ]
    _out(args, d, "\n".join(lines))


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def cmd_nodes(t: Transport, args: argparse.Namespace) -> None:
    if args.node:
        v = t.call("GetNode", admin_pb2.GetNodeRequest(node_id=args.node))
        d = render.node_dict(v)
        _out(args, d, _node_detail(v, d))
        return
    resp = t.call("ListNodes", admin_pb2.ListNodesRequest())
    docs = [render.node_dict(v) for v in resp.nodes]
    rows = []
    for v, d in zip(resp.nodes, docs, strict=True):
        gpus = d["gpus"]
        model = gpus[0]["model"] if gpus else "-"
        util = [g["telemetry"].get("util_gpu", 0.0) for g in gpus if "telemetry" in g]
        power = sum(g["telemetry"].get("power_w", 0.0) for g in gpus if "telemetry" in g)
        rows.append([
            d["node_id"], d["state"], f"{len(gpus)}x {model}" + (" (simulated)" if d["simulated"] else ""),
            f"{sum(util) / len(util) * 100:.0f} %" if util else "-", f"{power:.0f} W" if util else "-",
            len(d["task_ids"]), f"{v.last_seen_age_s:.1f}s",
        ])
    _out(args, {"nodes": docs, "stale": resp.stale},
         render.table(["NODE", "STATE", "GPUS", "GPU UTIL", "GPU POWER", "TASKS", "LAST SEEN"], rows))


def _node_detail(v: admin_pb2.NodeView, d: dict[str, Any]) -> str:
    head = [
        f"node          {d['node_id']} ({d['hostname']})",
        f"state         {d['state']}{' cordoned' if d['cordoned'] else ''}{' draining' if d['draining'] else ''}",
        f"gpu backend   {d['gpu_backend']}{' (SIMULATED GPUs)' if d['simulated'] else ''}",
        f"host          {d['cpu_cores']} cores, {render.fmt_bytes(d['mem_total_bytes'])} memory",
        f"tasks         {', '.join(d['task_ids']) or 'none'}",
    ]
    curve = d["power_curve"]
    if curve is not None:
        origin = f"fitted from {curve['samples']} samples" if curve["source"] == "fitted" else "datasheet"
        head.append(f"power curve   GPUs {curve['idle_w']:.0f} W idle, {curve['max_w']:.0f} W at full load ({origin})")
    rows = []
    for g in d["gpus"]:
        tm = g.get("telemetry", {})
        rows.append([
            g["index"], g["model"], f"{tm.get('util_gpu', 0) * 100:.0f} %" if "util_gpu" in tm else "-",
            f"{render.fmt_bytes(int(tm.get('mem_used_bytes', 0)))} / {render.fmt_bytes(g['mem_total_bytes'])}",
            f"{tm['power_w']:.0f} / {g['power_limit_w']:.0f} W" if "power_w" in tm else "-",
            f"{tm['temperature_c']:.0f} C" if "temperature_c" in tm else "-",
            "yes" if tm.get("healthy", True) else f"NO: {tm.get('health_reason', '')}",
        ])
    return "\n".join(head) + "\n\n" + render.table(["GPU", "MODEL", "UTIL", "MEMORY", "POWER", "TEMP", "HEALTHY"], rows)


def cmd_tasks(t: Transport, args: argparse.Namespace) -> None:
    if args.task:
        task = t.call("GetTask", admin_pb2.GetTaskRequest(task_id=args.task))
        d = render.task_dict(task)
        _out(args, d, _task_detail(d))
        return
    resp = t.call("ListTasks", admin_pb2.ListTasksRequest())
    docs = [render.task_dict(x) for x in resp.tasks]
    rows = [[d["task_id"], d["name"], d["state"], d["priority"],
             ",".join(f"{a['node_id']}:{'+'.join(map(str, a['gpu_indices']))}" for a in d["allocation"]) or "-",
             render.age(d["submit_unix_s"]), d["reason"][:60]] for d in docs]
    _out(args, {"tasks": docs, "stale": resp.stale},
         render.table(["TASK", "NAME", "STATE", "PRIO", "PLACEMENT", "AGE", "REASON"], rows))


def _task_detail(d: dict[str, Any]) -> str:
    lines = [
        f"task          {d['task_id']} ({d['name']})",
        f"state         {d['state']}" + (f": {d['reason']}" if d["reason"] else ""),
        f"kind          {d['kind'] or '-'}  priority {d['priority']}",
        f"demand        {d['demand']}",
        "placement     " + (", ".join(f"{a['node_id']} gpus {a['gpu_indices']}" for a in d["allocation"]) or "-"),
        f"exit code     {d['exit_code'] if d['exit_code'] is not None else '-'}",
        "history       " + " → ".join(h["state"] for h in d["history"]),
    ]
    if d["log_tail"]:
        lines += ["log tail:", d["log_tail"].rstrip()]
    return "\n".join(lines)


def cmd_submit(t: Transport, args: argparse.Namespace) -> None:
    from coordinator.ctl.spec import spec_from_args, spec_from_file

    spec = spec_from_file(args.file) if args.file else spec_from_args(args)
    request_id = args.request_id or os.urandom(8).hex()
    task = t.call("SubmitTask", admin_pb2.SubmitTaskRequest(spec=spec, request_id=request_id), write=True)
    d = render.task_dict(task)
    _out(args, d, f"task {task.id} submitted ({d['state']})")


def _task_action(rpc: str, verb: str) -> Callable[[Transport, argparse.Namespace], None]:
    def run(t: Transport, args: argparse.Namespace) -> None:
        task = t.call(rpc, admin_pb2.TaskRef(task_id=args.task), write=True)
        d = render.task_dict(task)
        _out(args, d, f"task {task.id} {verb} ({d['state']})")
    return run


def _node_action(rpc: str, verb: str) -> Callable[[Transport, argparse.Namespace], None]:
    def run(t: Transport, args: argparse.Namespace) -> None:
        v = t.call(rpc, admin_pb2.NodeRef(node_id=args.node), write=True)
        d = render.node_dict(v)
        _out(args, d, f"node {args.node} {verb} ({d['state']})")
    return run


def cmd_policy(t: Transport, args: argparse.Namespace) -> None:
    if args.policy_cmd == "get":
        p = t.call("GetPolicy", admin_pb2.GetPolicyRequest())
    else:
        p = t.call("SetPolicy", types_pb2.Policy(name=args.name, threshold=args.threshold or 0.0), write=True)
    _out(args, {"name": p.name, "threshold": p.threshold}, f"policy {p.name} threshold {p.threshold:.2f}")


def cmd_events(t: Transport, args: argparse.Namespace) -> None:
    stream = t.stream("StreamEvents", admin_pb2.StreamEventsRequest(follow=args.follow, backlog=args.backlog))
    try:
        for e in stream:
            d = render.event_dict(e)
            if args.output == "json":
                # One JSON object per line so a follower can parse as events arrive.
                print(render.json.dumps(d, sort_keys=True), flush=True)
            else:
                subject = d["node_id"] or d["task_id"]
                print(f"{d['seq']:>6}  {render.age(d['time_unix_s']):>4}  {d['kind']:<11} {subject:<16} {d['message']}",
                      flush=True)
    except KeyboardInterrupt:
        stream.cancel()


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gptrmctl", description="Administer a gptrm cluster.")
    p.add_argument("--coordinator", default=os.environ.get("GPTRM_COORDINATOR", DEFAULT_COORDINATOR),
                   help="HOST:PORT[,HOST:PORT...] of coordinators (env GPTRM_COORDINATOR)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    env = os.environ
    p.add_argument("--tls-cert", default=env.get("GPTRM_TLS_CERT", ""), metavar="FILE",
                   help="client certificate for mutual TLS (env GPTRM_TLS_CERT)")
    p.add_argument("--tls-key", default=env.get("GPTRM_TLS_KEY", ""), metavar="FILE",
                   help="client private key (env GPTRM_TLS_KEY)")
    p.add_argument("--tls-ca", default=env.get("GPTRM_TLS_CA", ""), metavar="FILE",
                   help="CA bundle that the coordinator's certificate must chain to (env GPTRM_TLS_CA)")
    p.add_argument("--insecure", action="store_true",
                   default=env.get("GPTRM_INSECURE", "").lower() in ("1", "true", "yes", "on"),
                   help="plaintext gRPC, for a coordinator started with --insecure (env GPTRM_INSECURE)")
    p.add_argument("--token", default=env.get("GPTRM_TOKEN", ""),
                   help="bearer token (env GPTRM_TOKEN; prefer the env var: flags show in ps)")
    p.add_argument("--timeout", type=float, default=10.0, help="per-request deadline, seconds")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("status", help="cluster status").set_defaults(fn=cmd_status)
    sp = sub.add_parser("nodes", help="list nodes or show one")
    sp.add_argument("node", nargs="?")
    sp.set_defaults(fn=cmd_nodes)
    sp = sub.add_parser("tasks", help="list tasks or show one")
    sp.add_argument("task", nargs="?")
    sp.set_defaults(fn=cmd_tasks)
    from coordinator.ctl.spec import add_submit_arguments

    sp = sub.add_parser("submit", help="submit a task: -f FILE or flags -- ARGV")
    add_submit_arguments(sp)
    sp.set_defaults(fn=cmd_submit)
    for name, rpc, verb in (("cancel", "CancelTask", "cancelled"), ("pause", "PauseTask", "paused"),
                            ("resume", "ResumeTask", "resumed")):
        sp = sub.add_parser(name, help=f"{name} a task")
        sp.add_argument("task")
        sp.set_defaults(fn=_task_action(rpc, verb))
    for name, rpc, verb in (("drain", "DrainNode", "draining"), ("cordon", "CordonNode", "cordoned"),
                            ("uncordon", "UncordonNode", "uncordoned")):
        sp = sub.add_parser(name, help=f"{name} a node")
        sp.add_argument("node")
        sp.set_defaults(fn=_node_action(rpc, verb))
    sp = sub.add_parser("policy", help="placement policy")
    psub = sp.add_subparsers(dest="policy_cmd", required=True, parser_class=_Parser)
    psub.add_parser("get")
    ps = psub.add_parser("set")
    ps.add_argument("name")
    ps.add_argument("--threshold", type=float)
    sp.set_defaults(fn=cmd_policy)
    sp = sub.add_parser("events", help="cluster events")
    sp.add_argument("--follow", "-f", action="store_true")
    sp.add_argument("--backlog", type=int, default=100)
    sp.set_defaults(fn=cmd_events)
    from coordinator.ctl.certs import add_certs_parser
    from coordinator.simulator.cli import add_simulate_parser

    add_certs_parser(sub, _Parser)

    add_simulate_parser(sub)
    return p


def _security(args: argparse.Namespace) -> Callable[[], ChannelSecurity]:
    """Checked lazily, at the first call, so ``certs`` and ``simulate`` need no TLS settings."""
    def build() -> ChannelSecurity:
        try:
            return ChannelSecurity.from_settings(insecure=args.insecure, cert=args.tls_cert, key=args.tls_key,
                                                 ca=args.tls_ca, token=args.token)
        except ConfigError as e:
            raise CtlError(str(e).replace("_", "-", 1) if str(e).startswith("tls_") else str(e), EXIT_USAGE) from None
    return build


def main(argv: Sequence[str] | None = None) -> int:
    """Run one gptrmctl command; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        transport = Transport(args.coordinator.split(","), timeout_s=args.timeout, security=_security(args))
        try:
            args.fn(transport, args)
        finally:
            transport.close()
        return 0
    except CtlError as e:
        print(f"gptrmctl: {e}", file=sys.stderr)
        return e.code
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except Exception as e:  # the CLI boundary: one line unless --debug
        if debug:
            raise
        print(f"gptrmctl: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
