"""gptrmctl entry point: argument parsing and one function per command."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import signal
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn

import grpc

from common.errors import ConfigError, UsageError
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from common.pbenum import pb_enum
from common.types import MIN_POLICY_THRESHOLD, THRESHOLD_MODES
from coordinator.ctl import human, render
from coordinator.ctl.argtypes import gpu_ref, int_between
from coordinator.ctl.certs import add_certs_parser
from coordinator.ctl.pages import all_nodes, all_tasks, task_pages
from coordinator.ctl.queues import add_queues_parser, queue_dict, queue_update, queues_dict, queues_table
from coordinator.ctl.reservations import (
    add_reservations_parser,
    reservation_dict,
    reservation_from_args,
    reservations_dict,
    reservations_table,
)
from coordinator.ctl.transport import EXIT_INTERNAL, EXIT_REFUSED, EXIT_USAGE, ChannelSecurity, CtlError, Transport
from coordinator.ctl.usage import add_usage_parser, usage_csv, usage_dict, usage_request, usage_table
from coordinator.profiler.workflow_spec import array_indices, array_ref, is_array_id
from coordinator.simulator.cli import add_simulate_parser

__all__ = ["main"]

DEFAULT_COORDINATOR = "127.0.0.1:7770"
SERVICE_PREFIX = "s-"
"""Service ids start with it (task ids with ``t-``)."""


class _Parser(argparse.ArgumentParser):
    """argparse that exits with the usage code (2) and one line."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        # main() prefixes "gptrmctl: " to every error; name only the subcommand here ("submit: ...").
        where = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        raise CtlError(f"{where}: {message}" if where else message, EXIT_USAGE)


_UINT32 = 2**32 - 1
_PATH_ARGUMENTS = frozenset({"file", "dir", "out", "tls_cert", "tls_key", "tls_ca", "cert"})
"""Arguments that name files: any bytes the file system allows, passed on as they are."""


_uint32 = int_between(0, _UINT32)
"""An argparse type: a whole number in [0, 2^32 - 1] (what the request field holds)."""


def _labels(parser: argparse.ArgumentParser, out: dict[str, str] | None = None) -> dict[str, str]:
    """Each argument's name as the command line spells it (``--name``, ``TASK``), by its dest."""
    out = {} if out is None else out
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _labels(sub, out)
        elif action.dest not in out:
            metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
            out[action.dest] = action.option_strings[-1] if action.option_strings else metavar
    return out


def _check_text(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse an argument that is not valid UTF-8 (a non-UTF-8 command line decodes to lone
    surrogates, which no request can carry), naming it; file names are exempt.

    :raises UsageError: naming the argument.
    """
    labels: dict[str, str] | None = None
    for dest, value in vars(args).items():
        if dest in _PATH_ARGUMENTS:
            continue
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if not isinstance(item, str):
                continue
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as e:
                labels = labels or _labels(parser)
                if dest == "argv" and args.command == "submit":
                    label = f"spec.argv[{i}]"
                else:
                    label = labels.get(dest, dest) + (f" #{i + 1}" if isinstance(value, list) else "")
                shown = item.encode("utf-8", "surrogateescape" if _escapable(item) else "replace")
                raise UsageError(f"{label}: not valid UTF-8 at character {e.start}: {shown[:64]!r}") from None


def _escapable(text: str) -> bool:
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def _out(args: argparse.Namespace, doc: Any, text: str) -> None:
    print(render.dump_json(doc) if args.output == "json" else text)
    if args.output != "json" and isinstance(doc, dict) and doc.get("stale"):
        print("[stale] etcd is unreachable: this answer comes from the coordinator's memory", file=sys.stderr)


def cmd_status(t: Transport, args: argparse.Namespace) -> None:
    d = render.status_dict(t.call("GetStatus", admin_pb2.GetStatusRequest()))
    _out(args, d, human.status_text(d))


def cmd_nodes(t: Transport, args: argparse.Namespace) -> None:
    if args.node == "rm":   # nodes rm NODE: remove a LOST node (its tasks are failed first)
        if not args.rm_node:
            raise CtlError("nodes rm: give the NODE to remove", EXIT_USAGE)
        d = render.node_dict(t.call("RemoveNode", admin_pb2.NodeRef(node_id=args.rm_node), write=True))
        _out(args, d, f"node {human.escape(args.rm_node)} removed")
        return
    if args.node:
        d = render.node_dict(t.call("GetNode", admin_pb2.GetNodeRequest(node_id=args.node)))
        _out(args, d, human.node_detail(d))
        return
    nodes, stale = all_nodes(t, _states(types_pb2.NodeState, "NODE_STATE_", args.state), args.page_size)
    docs = [render.node_dict(v) for v in nodes]
    _out(args, {"nodes": docs, "stale": stale}, human.nodes_table(docs, wide=args.output == "wide"))


def images_doc(views: list[admin_pb2.NodeView], stale: bool) -> dict[str, Any]:
    """The ``images`` document (schema ``images.json``): per node, whether it runs containers and what it holds."""
    return {"nodes": [{"node_id": v.record.inventory.node_id, "containers": v.record.inventory.containers,
                       "images": sorted(v.record.inventory.images)} for v in views], "stale": stale}


def cmd_images(t: Transport, args: argparse.Namespace) -> None:
    if args.node == "pull":   # images pull REF [--nodes A,B]: pre-pull on nodes
        if not args.ref:
            raise CtlError("images pull: give the image REF to pull", EXIT_USAGE)
        nodes = [n for n in (s.strip() for s in (args.nodes or "").split(",")) if n]
        resp = t.call("PullImage", admin_pb2.PullImageRequest(image=args.ref, nodes=nodes), write=True)
        d = {"image": args.ref, "nodes": list(resp.nodes)}
        _out(args, d, f"pulling {human.escape(args.ref)} on " + (", ".join(map(human.escape, resp.nodes)) or
                                                                  "no node (none runs containers)"))
        return
    if args.ref or args.nodes:
        raise CtlError("images: REF and --nodes go with 'images pull'", EXIT_USAGE)
    if args.node:
        views, stale = [t.call("GetNode", admin_pb2.GetNodeRequest(node_id=args.node))], False
    else:
        views, stale = all_nodes(t, [], args.page_size)
    d = images_doc(list(views), stale)
    lines = [f"{'NODE':<24} {'CONTAINERS':<10} IMAGES"]
    for n in d["nodes"]:
        lines.append(f"{human.escape(n['node_id'])[:24]:<24} {'yes' if n['containers'] else 'no':<10} "
                     + (", ".join(human.escape(i) for i in n["images"]) or "-"))
    _out(args, d, "\n".join(lines))


def cmd_tasks(t: Transport, args: argparse.Namespace) -> None:
    if args.task and args.task.startswith(SERVICE_PREFIX):
        d = render.service_dict(t.call("GetService", admin_pb2.ServiceRef(service_id=args.task)))
        _out(args, d, human.service_detail(d))
        return
    if args.task and not is_array_id(args.task):
        d = render.task_dict(t.call("GetTask", admin_pb2.GetTaskRequest(task_id=array_ref(args.task))))
        _out(args, d, human.task_detail(d))
        return
    task_filter = _task_filter(args)
    if args.task:   # one array's elements, every one (or an error naming the array)
        tasks, stale = all_tasks(t, page_size=args.page_size, task_filter=task_filter)
        docs = [render.task_dict(x) for x in tasks if x.array_id == args.task]
        if not docs:
            raise CtlError(f"tasks: array {args.task!r} not found" + (" in those states" if args.state else ""),
                           EXIT_REFUSED)
        _out(args, {"tasks": docs, "arrays": render.array_summaries(docs), "stale": stale},
             human.tasks_table(docs, wide=args.output == "wide"))
        return
    arrays: dict[str, dict[str, Any]] = {}   # the arrays' summaries by id, summed up page by page
    pages = _counted((([render.task_dict(x) for x in tasks], s)
                      for tasks, s in task_pages(t, page_size=args.page_size, task_filter=task_filter)), arrays)
    stale = _stream_pages(args, "tasks", pages if args.output == "json" else _collapsed(pages, arrays),
                          lambda docs: human.tasks_table(docs, wide=args.output == "wide"),
                          tail=lambda: {"arrays": list(arrays.values())})
    if stale and args.output != "json":
        print("[stale] etcd is unreachable: this answer comes from the coordinator's memory", file=sys.stderr)


def _counted(pages: Iterable[tuple[list[dict[str, Any]], bool]],
             arrays: dict[str, dict[str, Any]]) -> Iterator[tuple[list[dict[str, Any]], bool]]:
    """The pages as they come, their array elements summed up in ``arrays`` (:func:`render.count_arrays`)."""
    for docs, stale in pages:
        render.count_arrays(docs, arrays)
        yield docs, stale


def _collapsed(pages: Iterable[tuple[list[dict[str, Any]], bool]],
               arrays: dict[str, dict[str, Any]]) -> Iterator[tuple[list[dict[str, Any]], bool]]:
    """A table's pages with each array as one row (:func:`human.collapse_arrays`): pages pass as they arrive
    until one holds an array element; from there on the rows wait for the last page, since an array's row
    shows the counts of all its elements (``arrays``, which ``pages`` fill as they are read)."""
    held: list[dict[str, Any]] = []
    for docs, stale in pages:
        if held or any(d.get("array_id") for d in docs):
            held.extend(docs)
            yield [], stale
        else:
            yield docs, stale
    if held:
        yield human.collapse_arrays(held, list(arrays.values())), False


def _stream_pages(args: argparse.Namespace, field: str, pages: Iterable[tuple[Iterable[dict[str, Any]], bool]],
                  text: Callable[[list[dict[str, Any]]], str],
                  tail: Callable[[], dict[str, Any]] = dict) -> bool:
    """Print a listing page by page as the pages arrive (a long list shows at once, in bounded memory); returns
    whether any page was stale.

    ``-o json`` writes the document ``{field: [...], **tail(), "stale": ...}`` as :func:`render.dump_json` would
    (the same indentation; ``tail()``, called after the last page, and ``stale``, known only at the end, come
    last). A table prints each page's rows aligned on their own, the header once."""
    stale = False
    first = True
    out = sys.stdout
    if args.output == "json":
        out.write("{\n  " + json.dumps(field) + ": [")
    for docs, page_stale in pages:
        stale = stale or page_stale
        docs = list(docs)
        if args.output == "json":
            for d in docs:
                out.write(("\n" if first else ",\n") + textwrap.indent(render.dump_json(d), "    "))
                first = False
        elif docs or first:
            lines = text(docs).split("\n")
            out.write("\n".join(lines if first else lines[1:]) + "\n")
            first = False
        out.flush()
    if args.output == "json":
        out.write("]" if first else "\n  ]")
        for key, value in sorted(tail().items()):
            out.write(",\n  " + json.dumps(key) + ": " + textwrap.indent(render.dump_json(value), "  ").lstrip())
        out.write(',\n  "stale": ' + json.dumps(stale) + "\n}\n")
    return stale


def _task_filter(args: argparse.Namespace) -> admin_pb2.TaskFilter:
    """``--user``, ``--queue``, ``--name`` and ``--state`` (each may repeat or list values with commas) as the
    server-side filter of ``tasks`` and bulk ``cancel``."""
    def listed(values: list[str] | None) -> list[str]:
        return [v.strip() for v in ",".join(values or []).split(",") if v.strip()]
    return admin_pb2.TaskFilter(users=listed(args.user), queues=listed(args.queue), name=args.name or "",
                                states=[pb_enum(types_pb2.TaskState, s)
                                        for s in _states(types_pb2.TaskState, "TASK_STATE_", args.state)])


def _add_task_filter(sp: argparse.ArgumentParser, what: str) -> None:
    sp.add_argument("--user", "-u", action="append", metavar="USER",
                    help=f"only {what} submitted by these identities (repeat, or USER,USER)")
    sp.add_argument("--queue", "-q", action="append", metavar="QUEUE", help=f"only {what} in these queues")
    sp.add_argument("--name", metavar="PATTERN", help=f"only {what} whose name matches this shell pattern (train-*)")
    sp.add_argument("--state", action="append", help=f"only {what} in these states (pending,running,...)")


def _states(enum: Any, prefix: str, names: list[str] | None) -> list[int]:
    """``--state running,pending`` as enum numbers.

    :raises UsageError: an unknown state name.
    """
    out = []
    for name in ",".join(names or []).split(","):
        if not name.strip():
            continue
        try:
            out.append(enum.Value(prefix + name.strip().upper().replace("-", "_")))
        except ValueError:
            known = ", ".join(v.name[len(prefix):].lower() for v in enum.DESCRIPTOR.values if v.number)
            raise UsageError(f"--state: unknown state {name.strip()!r} (one of {known})") from None
    return out


def cmd_submit(t: Transport, args: argparse.Namespace) -> int:
    from coordinator.ctl.spec import service_from_args, spec_from_args, spec_from_file

    spec = spec_from_file(args.file) if args.file else spec_from_args(args)
    request_id = args.request_id or os.urandom(8).hex()   # the same on every retry: one task or service
    if service_from_args(args, spec):
        if args.wait:
            raise CtlError("submit: --wait follows one task, not a service", EXIT_USAGE)
        svc = t.call("CreateService", admin_pb2.SubmitTaskRequest(spec=spec, request_id=request_id), write=True)
        d = render.service_dict(admin_pb2.ServiceView(service=svc))
        _out(args, d, f"service {svc.id} submitted ({svc.desired} replica(s), {svc.spec.service.min_replicas}.."
                      f"{svc.spec.service.max_replicas}); see gptrmctl tasks {svc.id}")
        return 0
    if spec.HasField("array") and args.wait:
        raise CtlError("submit: --wait follows one task, not an array", EXIT_USAGE)
    task = t.call("SubmitTask", admin_pb2.SubmitTaskRequest(spec=spec, request_id=request_id,
                                                            queue_unplaceable=args.queue_unplaceable), write=True)
    d = render.task_dict(task)
    if task.array_id:
        count = len(array_indices(spec.array))
        _out(args, d, f"array {task.array_id} submitted ({count} element(s), {task.array_id}_{task.array_index} "
                      f"first); see gptrmctl tasks {task.array_id}")
        return 0
    if not args.wait:
        _out(args, d, f"task {task.id} submitted ({d['state']})")
        return 0
    from coordinator.ctl.wait import EXIT_INTERRUPTED, OutputFollower, exit_code_of, progress_lines, wait_for_task

    # The task's output is streamed to stdout as it comes (each line after its rank), except with -o json,
    # whose stdout holds the final task document alone; the progress line then stays on stderr.
    follower = OutputFollower(t, task.id, sys.stdout.buffer) if args.output != "json" else None
    if follower is not None:
        print(f"task {task.id} submitted; its output follows (Ctrl-C stops following, the task keeps going)",
              file=sys.stderr)
    try:
        d = wait_for_task(t, task.id, err=progress_lines() if follower is not None else None,
                          on_state=follower.start if follower is not None else None)
        if follower is not None:
            follower.start(d)   # a task that ended between two polls still shows its output
            follower.finish()
    except KeyboardInterrupt:
        print(f"stopped following task {task.id}; see gptrmctl tasks {task.id}", file=sys.stderr)
        return EXIT_INTERRUPTED
    code = exit_code_of(d)
    _out(args, d, f"task {task.id} {d['state']}" + (f" with exit code {d['exit_code']}"
                                                     if d["exit_code"] is not None else ""))
    return code


def cmd_run(t: Transport, args: argparse.Namespace) -> int:
    """``run [--pty] [submit flags] -- CMD``: a task followed to its end; with ``--pty`` on a terminal held by its
    agent, this terminal attached to it until it ends (docs/interactive.md)."""
    if not args.pty:
        args.wait = True
        return cmd_submit(t, args)
    from coordinator.ctl.session import run_session
    from coordinator.ctl.spec import service_from_args, spec_from_args, spec_from_file
    from coordinator.ctl.wait import EXIT_INTERRUPTED, exit_code_of, wait_for_task

    spec = spec_from_file(args.file) if args.file else spec_from_args(args)
    if service_from_args(args, spec):
        raise CtlError("run: --pty runs one task, not a service", EXIT_USAGE)
    spec.pty = True
    if "TERM" not in spec.env and os.environ.get("TERM"):
        spec.env["TERM"] = os.environ["TERM"]
    request_id = args.request_id or os.urandom(8).hex()
    task = t.call("SubmitTask", admin_pb2.SubmitTaskRequest(spec=spec, request_id=request_id,
                                                            queue_unplaceable=args.queue_unplaceable), write=True)
    print(f"task {task.id} submitted; waiting for it to run (Ctrl-C stops waiting, then cancel it)", file=sys.stderr)
    try:
        d = wait_for_task(t, task.id, until=("running",))
    except KeyboardInterrupt:
        print(f"stopped waiting for task {task.id}; gptrmctl cancel {task.id} ends it", file=sys.stderr)
        return EXIT_INTERRUPTED
    if d["state"] == "running":
        run_session(t, admin_pb2.TaskSessionOpen(task_id=task.id, hangup_on_close=True))
        d = wait_for_task(t, task.id, err=io.StringIO())   # its end is all that is left: no progress lines
    return exit_code_of(d)


def cmd_exec(t: Transport, args: argparse.Namespace) -> int:
    """``exec TASK [--rank R] [--pty] -- CMD``: CMD in a running task's context; exits with CMD's exit code."""
    from coordinator.ctl.session import run_session

    if not args.argv:
        raise CtlError("exec: give the command to run after --", EXIT_USAGE)
    if not 0 <= args.rank <= _UINT32:
        raise CtlError(f"exec: --rank must be 0 or more, got {args.rank}", EXIT_USAGE)
    pty = args.pty if args.pty is not None else sys.stdin.isatty() and sys.stdout.isatty()
    done = run_session(t, admin_pb2.TaskSessionOpen(task_id=args.task, rank=args.rank, argv=list(args.argv), pty=pty))
    if not done.exited:
        raise CtlError(f"exec: the session with task {args.task} ended without the command's exit code", EXIT_REFUSED)
    code = done.exit_code or 0
    return min(255, 128 - code) if code < 0 else code & 0xFF


def cmd_attach(t: Transport, args: argparse.Namespace) -> int:
    """``attach TASK``: a --pty task's terminal (standard input forwarded); any other task's output, followed."""
    from coordinator.ctl.session import run_session

    task = t.call("GetTask", admin_pb2.GetTaskRequest(task_id=args.task))
    if not task.spec.pty:
        args.follow, args.tail = True, None
        return cmd_logs(t, args)
    print(f"attached to task {args.task}'s terminal (detach: end gptrmctl, e.g. close the terminal; the task goes on)",
          file=sys.stderr)
    run_session(t, admin_pb2.TaskSessionOpen(task_id=args.task, rank=args.rank))
    return 0


def cmd_scale(t: Transport, args: argparse.Namespace) -> None:
    if args.replicas == "auto":
        req = admin_pb2.ScaleServiceRequest(service_id=args.service, auto=True)
    else:
        try:
            n = int(args.replicas)
        except ValueError:
            raise CtlError(f"scale: REPLICAS: expected a whole number or auto, got {args.replicas[:64]!r}",
                           EXIT_USAGE) from None
        if not 1 <= n <= _UINT32:
            raise CtlError(f"scale: REPLICAS: must be at least 1 and below 2^32, got {args.replicas[:64]}",
                           EXIT_USAGE)
        req = admin_pb2.ScaleServiceRequest(service_id=args.service, replicas=n)
    svc = t.call("ScaleService", req, write=True)
    d = render.service_dict(admin_pb2.ServiceView(service=svc))
    _out(args, d, f"service {svc.id} " + (f"pinned at {svc.desired} replica(s)" if svc.pinned
                                          else f"autoscaling ({svc.desired} replica(s) now)"))


def _task_action(rpc: str, verb: str) -> Callable[[Transport, argparse.Namespace], None]:
    def run(t: Transport, args: argparse.Namespace) -> None:
        if rpc == "CancelTask" and args.task.startswith(SERVICE_PREFIX):
            svc = t.call("CancelService", admin_pb2.ServiceRef(service_id=args.task), write=True)
            _out(args, render.service_dict(admin_pb2.ServiceView(service=svc)),
                 f"service {svc.id} cancelled (its replicas are being stopped)")
            return
        if rpc == "CancelTask" and is_array_id(args.task):
            done = t.call("CancelArray", admin_pb2.ArrayRef(array_id=args.task), write=True)
            _out(args, {"array_id": done.array_id, "cancelled": done.cancelled, "already_ended": done.already_ended},
                 f"array {done.array_id}: {done.cancelled} element(s) cancelled, {done.already_ended} had already "
                 "ended")
            return
        task = t.call(rpc, admin_pb2.TaskRef(task_id=array_ref(args.task)), write=True)
        d = render.task_dict(task)
        _out(args, d, human.task_action_text(verb, d))
    return run


def cmd_cancel(t: Transport, args: argparse.Namespace) -> int:
    """``cancel TASK``, or ``cancel --user/--queue/--name/--state`` in bulk: the coordinator counts what the
    filter names that the caller may cancel (a dry run), gptrmctl asks, then cancels exactly those tasks."""
    task_filter = _task_filter(args)
    bulk = bool(task_filter.users or task_filter.queues or task_filter.name or task_filter.states)
    if args.task and bulk:
        raise CtlError("cancel: give a TASK or filters (--user/--queue/--name/--state), not both", EXIT_USAGE)
    if args.task:
        _task_action("CancelTask", "cancelled")(t, args)
        return 0
    if not bulk:
        raise CtlError("cancel: give a TASK, or filters (--user/--queue/--name/--state) to cancel in bulk",
                       EXIT_USAGE)
    counted = t.call("CancelTasks", admin_pb2.CancelTasksRequest(filter=task_filter, dry_run=True), write=True)
    ids = list(counted.task_ids)
    refused = f" ({counted.refused} more it names are in queues you may not act on: left alone)" \
        if counted.refused else ""
    if not ids:
        _out(args, {"task_ids": [], "refused": counted.refused, "failed": 0}, f"no task to cancel{refused}")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise CtlError(f"cancel: {len(ids)} task(s) would be cancelled; stdin is not a terminal to confirm on: "
                           "pass --yes", EXIT_USAGE)
        print(f"{len(ids)} task(s) will be cancelled{refused}: {human.escape(' '.join(ids[:10]))}"
              + (" ..." if len(ids) > 10 else ""), file=sys.stderr)
        print("cancel them? [y/N] ", end="", file=sys.stderr, flush=True)
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            print("nothing cancelled", file=sys.stderr)
            return EXIT_REFUSED
    done = t.call("CancelTasks", admin_pb2.CancelTasksRequest(filter=task_filter, task_ids=ids), write=True)
    d = {"task_ids": list(done.task_ids), "refused": done.refused, "failed": done.failed}
    _out(args, d, f"{len(done.task_ids)} task(s) cancelled" + (f", {done.failed} had ended meanwhile"
                                                                if done.failed else "") + refused)
    return 0


def _node_action(rpc: str, verb: str) -> Callable[[Transport, argparse.Namespace], None]:
    def run(t: Transport, args: argparse.Namespace) -> None:
        v = t.call(rpc, admin_pb2.NodeRef(node_id=args.node), write=True)
        d = render.node_dict(v)
        _out(args, d, f"node {args.node} {verb} ({d['state']})")
    return run


def cmd_gpus(t: Transport, args: argparse.Namespace) -> None:
    node, indices = args.gpus
    v = t.call("ResumeGpus", admin_pb2.ResumeGpusRequest(node_id=node, gpu_indices=indices), write=True)
    left = sorted(f.gpu_index for f in v.record.gpu_fences)
    which = f"GPU {','.join(map(str, indices))}" if indices else "every fenced GPU"
    _out(args, render.node_dict(v), f"node {human.escape(node)}: {which} back in service"
         + (f"; still fenced: {','.join(map(str, left))}" if left else ""))


def cmd_policy(t: Transport, args: argparse.Namespace) -> None:
    if args.policy_cmd == "get":
        p = t.call("GetPolicy", admin_pb2.GetPolicyRequest())
    else:
        # 0 on the wire means "keep the current threshold", so 0 (and what is not a positive number)
        # is refused here; the coordinator refuses the rest of what is outside [MIN, 1].
        if args.threshold is not None and not (math.isfinite(args.threshold) and args.threshold > 0):
            raise UsageError(f"--threshold: must be in [{MIN_POLICY_THRESHOLD}, 1], got {args.threshold}")
        p = t.call("SetPolicy", types_pb2.Policy(name=args.name, threshold=args.threshold or 0.0,
                                                 threshold_mode=args.threshold_mode or ""), write=True)
    d = render.policy_dict(p)
    _out(args, d, f"policy {p.name} threshold {p.threshold:.2f} threshold-mode {d['threshold_mode']} "
                  f"({human.threshold_rule(d)})")


def cmd_events(t: Transport, args: argparse.Namespace) -> None:
    stream = t.stream("StreamEvents", admin_pb2.StreamEventsRequest(follow=args.follow, backlog=args.backlog,
                                                                    task_id=args.task or ""))
    try:
        for e in stream:
            d = render.event_dict(e)
            if args.output == "json":
                # One JSON object per line so a follower can parse as events arrive.
                print(render.dump_json(d, indent=None), flush=True)
            else:
                print(human.event_line(d), flush=True)
    except KeyboardInterrupt:
        stream.cancel()


def cmd_logs(t: Transport, args: argparse.Namespace) -> int:
    import grpc

    if args.tail is not None and not 0 <= args.tail <= 100_000:
        raise CtlError(f"logs: --tail must be between 0 and 100000, got {args.tail}", EXIT_USAGE)
    if args.rank < 0:
        raise CtlError(f"logs: --rank must be 0 or more, got {args.rank}", EXIT_USAGE)
    if args.rank > _UINT32:   # the request's field cannot carry it; no task has that many parts
        raise CtlError(f"logs: --rank {args.rank} is out of range: a task's ranks run from 0 to its part count "
                       f"less one (see gptrmctl tasks TASK)", EXIT_USAGE)
    request = admin_pb2.TaskLogsRequest(task_id=array_ref(args.task), tail_lines=args.tail or 0, follow=args.follow,
                                        rank=args.rank)
    stream = None
    try:
        stream = t.stream("TaskLogs", request, leader_only=True)
        for chunk in stream:
            if args.output == "json":
                # One JSON object per line so a follower can parse chunks as they arrive.
                print(render.json.dumps(render.log_chunk_dict(chunk), sort_keys=True), flush=True)
            else:
                sys.stdout.buffer.write(chunk.data)   # the task's own bytes, as `cat` would show them
                sys.stdout.flush()
    except grpc.RpcError as err:   # after the first chunk: the node went away, the reader fell behind
        raise CtlError(err.details() or err.code().name, EXIT_REFUSED) from None
    except KeyboardInterrupt:
        if stream is not None:
            stream.cancel()
    return 0


def cmd_usage(t: Transport, args: argparse.Namespace) -> None:
    d = usage_dict(t.call("GetUsage", usage_request(args)))
    if args.output == "csv":
        print(usage_csv(d))
    else:
        _out(args, d, usage_table(d))


def cmd_queues(t: Transport, args: argparse.Namespace) -> None:
    words = list(args.words)
    if words[:1] in (["set"], ["rm"]):
        if len(words) != 2:
            raise CtlError(f"queues {words[0]}: give exactly one NAME", EXIT_USAGE)
        verb, name = words
        if verb == "rm":
            view = t.call("RemoveQueue", admin_pb2.QueueRef(name=name), write=True)
            _out(args, queue_dict(view), f"queue {name} removed")
            return
        current = t.call("ListQueues", admin_pb2.ListQueuesRequest())
        known = next((v.queue for v in current.queues if v.queue.name == name and current.managed), None)
        view = t.call("SetQueue", admin_pb2.SetQueueRequest(queue=queue_update(known, name, args)), write=True)
        _out(args, queue_dict(view), f"queue {name} set" + (f"\n{human.escape(view.existing_work)}"
                                                             if view.existing_work else ""))
        return
    if len(words) > 1:
        raise CtlError("queues: give one NAME, or set NAME / rm NAME", EXIT_USAGE)
    d = queues_dict(t.call("ListQueues", admin_pb2.ListQueuesRequest(name=words[0] if words else "")))
    _out(args, d, queues_table(d))


def cmd_reservations(t: Transport, args: argparse.Namespace) -> None:
    words = list(args.words)
    if words[:1] in (["create"], ["rm"]):
        if len(words) != 2:
            raise CtlError(f"reservations {words[0]}: give exactly one NAME", EXIT_USAGE)
        verb, name = words
        if verb == "rm":
            view = t.call("RemoveReservation", admin_pb2.ReservationRef(name=name), write=True)
            _out(args, reservation_dict(view), f"reservation {name} removed")
            return
        view = t.call("CreateReservation", reservation_from_args(name, args), write=True)
        d = reservation_dict(view)
        _out(args, d, f"reservation {name} created ({d['state']})")
        return
    if words:
        raise CtlError("reservations: give no NAME, or create NAME / rm NAME", EXIT_USAGE)
    d = reservations_dict(t.call("ListReservations", admin_pb2.ListReservationsRequest()))
    _out(args, d, reservations_table(d))


def cmd_top(t: Transport, args: argparse.Namespace) -> int:
    from coordinator.ctl.top import run_top

    if not (math.isfinite(args.interval) and args.interval > 0):
        raise CtlError(f"top: --interval must be positive, got {args.interval}", EXIT_USAGE)
    return run_top(t, args.interval)


def cmd_completion(t: Transport, args: argparse.Namespace) -> None:
    from coordinator.ctl.completion import completion_script, list_ids

    if args.shell == "ids":
        if args.what not in ("tasks", "nodes"):
            raise CtlError("completion ids: expected tasks or nodes", EXIT_USAGE)
        print("\n".join(list_ids(t, args.what)))
        return
    print(completion_script(build_parser(), args.shell), end="")


_GLOBALS_NOTE = ("Global options may come before the command or after it (gptrmctl tasks -o wide); given in "
                 "both places, the one after the command wins.")


def _global_options() -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """The options every command takes (connection, credentials, output format), as (flags, add_argument
    keywords) with their defaults; read once per parser build, so the environment is read then."""
    env = os.environ
    return [
        (("--coordinator",), dict(default=env.get("GPTRM_COORDINATOR", DEFAULT_COORDINATOR),
                                  help="HOST:PORT[,HOST:PORT...] of coordinators (env GPTRM_COORDINATOR)")),
        (("-o", "--output"), dict(choices=("table", "wide", "json", "csv"), default="table",
                                  help="table, wide (more columns on list commands), json (see README: the JSON "
                                       "contract) or csv (usage only)")),
        (("--tls-cert",), dict(default=env.get("GPTRM_TLS_CERT", ""), metavar="FILE",
                               help="client certificate for mutual TLS (env GPTRM_TLS_CERT)")),
        (("--tls-key",), dict(default=env.get("GPTRM_TLS_KEY", ""), metavar="FILE",
                              help="client private key (env GPTRM_TLS_KEY)")),
        (("--tls-ca",), dict(default=env.get("GPTRM_TLS_CA", ""), metavar="FILE",
                             help="CA bundle that the coordinator's certificate must chain to (env GPTRM_TLS_CA)")),
        (("--insecure",), dict(action="store_true",
                               default=env.get("GPTRM_INSECURE", "").lower() in ("1", "true", "yes", "on"),
                               help="plaintext gRPC, for a coordinator started with --insecure (env GPTRM_INSECURE)")),
        (("--token",), dict(default=env.get("GPTRM_TOKEN", ""),
                            help="bearer token (env GPTRM_TOKEN; prefer the env var: flags show in ps)")),
        (("--timeout",), dict(type=float, default=10.0, help="per-request deadline, seconds")),
        (("--debug",), dict(action="store_true", help="show tracebacks")),
    ]


def _add_global_options(target: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                        after_command: bool = False) -> None:
    """Add the global options to the top-level parser (with their defaults) or, ``after_command``, to a
    command's parser with no default (``SUPPRESS``): there a value is set only when given, and then it
    replaces the one given before the command, since a command's parser writes into the same namespace."""
    for flags, kwargs in _global_options():
        if after_command:
            kwargs = {**kwargs, "default": argparse.SUPPRESS}
        target.add_argument(*flags, **kwargs)


def _command_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every command's and sub-command's parser below ``parser`` (``tasks``, ``policy``, ``policy set``, ...)."""
    out: list[argparse.ArgumentParser] = []
    for action in parser._actions:  # argparse has no public accessor for its subparsers
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):   # an alias names the same parser twice
                out += [sub, *_command_parsers(sub)]
    return out


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gptrmctl", description="Administer a gptrm cluster.", epilog=_GLOBALS_NOTE)
    _add_global_options(p)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("status", help="cluster status").set_defaults(fn=cmd_status)
    sp = sub.add_parser("nodes", help="list nodes, show one, or remove a lost one (nodes rm NODE)")
    sp.add_argument("node", nargs="?", help="a node to show, or rm")
    sp.add_argument("rm_node", nargs="?", metavar="NODE", help="with rm: the lost node to remove")
    sp.add_argument("--state", action="append", help="only nodes in these states (ready,lost,...)")
    sp.add_argument("--page-size", type=_uint32, default=0, help="items per request (0: the server's default)")
    sp.set_defaults(fn=cmd_nodes)
    sp = sub.add_parser("images", help="the images each node's store holds, or pre-pull one (images pull REF "
                                       "[--nodes A,B]; docs/containers.md)")
    sp.add_argument("node", nargs="?", help="only this node, or pull")
    sp.add_argument("ref", nargs="?", metavar="REF", help="with pull: the image to pull")
    sp.add_argument("--nodes", metavar="A,B", help="with pull: these nodes (default: every node that runs containers)")
    sp.add_argument("--page-size", type=_uint32, default=0, help="items per request (0: the server's default)")
    sp.set_defaults(fn=cmd_images)
    sp = sub.add_parser("tasks", help="list tasks or show one (or a service: its replicas, forecast, decisions)")
    sp.add_argument("task", nargs="?", help="a task id, a service id (s-...), an array id (a-...: its elements) or "
                                           "an array element (ARRAY:INDEX)")
    _add_task_filter(sp, "tasks")
    sp.add_argument("--page-size", type=_uint32, default=0, help="items per request (0: the server's default)")
    sp.set_defaults(fn=cmd_tasks)
    from coordinator.ctl.spec import add_submit_arguments

    sp = sub.add_parser("submit", help="submit a task: -f FILE or flags -- ARGV")
    add_submit_arguments(sp)
    sp.set_defaults(fn=cmd_submit)
    sp = sub.add_parser("run", help="run a task and follow it; --pty: a terminal on a node the scheduler chose "
                                    "(run --gpus 1 --pty -- bash), ended when the terminal closes")
    add_submit_arguments(sp)
    sp.add_argument("--pty", action="store_true", help="give the task a terminal and attach this one to it")
    sp.set_defaults(fn=cmd_run)
    sp = sub.add_parser("exec", help="run a command in a running task's context (its uid, cgroup, namespaces): "
                                     "exec TASK [--rank R] -- CMD")
    sp.add_argument("task")
    sp.add_argument("--rank", type=int, default=0, metavar="R", help="which part of a multi-node task (default 0)")
    sp.add_argument("--pty", action=argparse.BooleanOptionalAction, default=None,
                    help="on a terminal of its own (default: when stdin and stdout are terminals)")
    sp.add_argument("argv", nargs="*", help="the command, after --")
    sp.set_defaults(fn=cmd_exec)
    sp = sub.add_parser("attach", help="a --pty task's terminal (stdin forwarded), or a task's output live")
    sp.add_argument("task")
    sp.add_argument("--rank", type=int, default=0, metavar="R", help="which part of a multi-node task (default 0)")
    sp.set_defaults(fn=cmd_attach)
    sp = sub.add_parser("scale", help="pin a service's replica count (N) or give it back to autoscaling (auto)")
    sp.add_argument("service")
    sp.add_argument("replicas", metavar="N|auto")
    sp.set_defaults(fn=cmd_scale)
    sp = sub.add_parser("cancel", help="cancel a task (or an array element, ARRAY:INDEX), a service (s-...) or every "
                                       "element of an array (a-...); or in bulk every task a filter names "
                                       "(--user/--queue/--name/--state; asks first unless --yes)")
    sp.add_argument("task", nargs="?")
    _add_task_filter(sp, "tasks")
    sp.add_argument("--yes", "-y", action="store_true", help="bulk cancel without asking")
    sp.set_defaults(fn=cmd_cancel)
    for name, rpc, verb in (("pause", "PauseTask", "paused"), ("resume", "ResumeTask", "resumed")):
        sp = sub.add_parser(name, help=f"{name} a task (or an array element, ARRAY:INDEX)")
        sp.add_argument("task")
        sp.set_defaults(fn=_task_action(rpc, verb))
    for name, rpc, verb in (("drain", "DrainNode", "draining"), ("cordon", "CordonNode", "cordoned"),
                            ("uncordon", "UncordonNode", "uncordoned")):
        sp = sub.add_parser(name, help=f"{name} a node")
        sp.add_argument("node")
        sp.set_defaults(fn=_node_action(rpc, verb))
    sp = sub.add_parser("gpus", help="GPUs held out of service: gpus resume NODE[:INDEX[,INDEX]]")
    gsub = sp.add_subparsers(dest="gpus_cmd", required=True, parser_class=_Parser)
    gs = gsub.add_parser("resume", help="put fenced GPUs back in service after repair (all of the node's without "
                                        "INDEX)")
    gs.add_argument("gpus", type=gpu_ref, metavar="NODE[:INDEX[,INDEX]]")
    sp.set_defaults(fn=cmd_gpus)
    sp = sub.add_parser("policy", help="placement policy")
    psub = sp.add_subparsers(dest="policy_cmd", required=True, parser_class=_Parser)
    psub.add_parser("get")
    ps = psub.add_parser("set")
    ps.add_argument("name")
    ps.add_argument("--threshold", type=float)
    ps.add_argument("--threshold-mode", choices=THRESHOLD_MODES,
                    help="whole-gpus: the threshold caps host CPU, memory, disk and shared GPUs, whole GPUs may fill "
                         "a node; paper: it caps every dimension, GPU count included (default: keep the current)")
    sp.set_defaults(fn=cmd_policy)
    sp = sub.add_parser("events", help="cluster events")
    sp.add_argument("--follow", "-f", action="store_true")
    sp.add_argument("--backlog", type=_uint32, default=100)
    sp.add_argument("--task", metavar="TASK", help="only this task's events")
    sp.set_defaults(fn=cmd_events)
    sp = sub.add_parser("logs", help="a task's output (stdout and stderr) from its node: logs TASK [-f] [--tail N] "
                        "[--rank R]")
    sp.add_argument("task")
    sp.add_argument("--follow", "-f", action="store_true",
                    help="keep printing what the task writes until it ends (Ctrl-C stops)")
    sp.add_argument("--tail", type=int, metavar="N", help="start with the last N lines (default: all retained)")
    sp.add_argument("--rank", type=int, default=0, metavar="R",
                    help="which part of a multi-node task: the one of rank R (default 0)")
    sp.set_defaults(fn=cmd_logs)
    sp = sub.add_parser("completion", help="shell completion script: completion bash|zsh")
    sp.add_argument("shell", choices=("bash", "zsh", "ids"), help="bash or zsh ('ids' lists ids for the script)")
    sp.add_argument("what", nargs="?", help=argparse.SUPPRESS)
    sp.set_defaults(fn=cmd_completion)
    add_usage_parser(sub, cmd_usage)
    add_queues_parser(sub, cmd_queues)
    add_reservations_parser(sub, cmd_reservations)
    sp = sub.add_parser("top", help="full-screen live view of nodes, GPUs and the queue (q quits)")
    sp.add_argument("--interval", "-n", type=float, default=2.0, help="seconds between refreshes")
    sp.set_defaults(fn=cmd_top)
    add_certs_parser(sub, _Parser)
    add_simulate_parser(sub)
    for command in _command_parsers(p):
        _add_global_options(command.add_argument_group("global options", _GLOBALS_NOTE), after_command=True)
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


EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
"""The exit code when the output's reader went away, as a shell reports a process SIGPIPE ended (141)."""


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that flushing what is left in its buffer at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):   # no real stdout (an in-process caller's replacement): nothing to flush
        pass


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The command line, where what follows the first ``--`` is the command of a command that runs one
    (``submit``, ``run``, ``exec``): argparse alone cannot place it after a positional and options
    (``exec TASK --rank 1 -- CMD``)."""
    if "--" not in argv:
        return parser.parse_args(argv)
    cut = argv.index("--")
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = parser.parse_args(argv[:cut])
    except (CtlError, SystemExit):
        return parser.parse_args(argv)
    if not hasattr(args, "argv") or args.argv:
        return parser.parse_args(argv)
    args.argv = argv[cut + 1:]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run one gptrmctl command; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        args = _parse(parser, argv)
        _check_text(parser, args)
        if args.output == "csv" and args.command != "usage":
            raise UsageError(f"-o csv: only usage writes CSV, not {args.command}")
        if not (math.isfinite(args.timeout) and args.timeout > 0):
            raise UsageError(f"--timeout: must be a positive number of seconds, got {args.timeout}")
        transport = Transport(args.coordinator.split(","), timeout_s=args.timeout, security=_security(args))
        try:
            rc = args.fn(transport, args)
        finally:
            transport.close()
        sys.stdout.flush()   # here, where a reader gone away is caught below, not at interpreter exit
        return int(rc or 0)
    except BrokenPipeError:
        # The reader of the output went away (gptrmctl tasks | head): stop quietly, as a tool that
        # SIGPIPE ended would, with its exit code.
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except CtlError as e:
        print(f"gptrmctl: {e}", file=sys.stderr)
        return e.code
    except UsageError as e:
        print(f"gptrmctl: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except grpc.RpcError as e:   # a stream the coordinator ended after its first message
        print(f"gptrmctl: {e.details() or e.code().name}", file=sys.stderr)
        return EXIT_REFUSED
    except Exception as e:  # the CLI boundary: a bug in gptrmctl, one line unless --debug
        if debug:
            raise
        try:
            detail = str(e).splitlines()[0][:200] if str(e) else ""
        except Exception:   # an exception whose text cannot be built
            detail = ""
        print(f"gptrmctl: internal error: {type(e).__name__}" + (f": {detail}" if detail else "")
              + " (run with --debug for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
