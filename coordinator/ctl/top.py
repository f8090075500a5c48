"""``gptrmctl top``: a full-screen live view of the cluster, built on rich's Live display.

One screen, refreshed every ``--interval`` seconds:

* the cluster line: leader and epoch, policy and threshold, the paper's objectives (Eq. 1 mean
  utilization, Eq. 2 its standard deviation across nodes, Eq. 3 total power), GPUs allocated;
* every node with one row per GPU: utilization, memory and power (against its limit) as bars
  with the numbers beside them;
* the queue: unfinished tasks, pending ones first, with their reasons (cause first).

``q`` or Ctrl-C quits (exit 0). When stdout is not a terminal it prints one snapshot and exits,
so ``gptrmctl top > snapshot.txt`` and pipes work.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from common.pb.gptrm.v1 import admin_pb2
from coordinator.ctl import human, render
from coordinator.ctl.pages import all_nodes, all_tasks
from coordinator.ctl.transport import CtlError, Transport

__all__ = ["Snapshot", "fetch", "run_top", "view"]

_BAR = 16
_QUEUE_ROWS = 15
_FINAL = frozenset({"succeeded", "failed", "cancelled", "timeout"})
_ORDER = {"pending": 0, "preempted": 1, "scheduled": 2, "starting": 3, "paused": 4, "running": 5}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one refresh shows: the documents ``status``, ``nodes`` and ``tasks -o json`` print, or an error."""

    status: Mapping[str, Any] | None
    nodes: Sequence[Mapping[str, Any]]
    tasks: Sequence[Mapping[str, Any]]
    error: str = ""
    error_code: int = 0


def fetch(t: Transport) -> Snapshot:
    """Read status, nodes and tasks; a failure becomes the snapshot's error (the view keeps refreshing)."""
    try:
        status = render.status_dict(t.call("GetStatus", admin_pb2.GetStatusRequest()))
        nodes = [render.node_dict(v) for v in all_nodes(t)[0]]
        tasks = [render.task_dict(x) for x in all_tasks(t)[0]]
    except CtlError as e:
        return Snapshot(None, [], [], str(e), e.code)
    return Snapshot(status, nodes, tasks)


def _bar(fraction: float | None) -> RenderableType:
    if fraction is None:
        return Text("-".center(_BAR))
    f = min(1.0, max(0.0, fraction))
    return ProgressBar(total=1.0, completed=f, width=_BAR,
                       complete_style="red" if f > 0.9 else "yellow" if f > 0.6 else "green")


def _cluster_line(s: Mapping[str, Any]) -> Text:
    o, p = s["objectives"], s["policy"]
    tasks = ", ".join(f"{k} {v}" for k, v in sorted(s["tasks_by_state"].items())) or "no tasks"
    line = Text()
    line.append("gptrm ", style="bold")
    line.append(f"leader {human.escape(s['leader_id'] or '-')} (epoch {s['leader_epoch']})"
                f"{' [stale]' if s['stale'] else ''}   ")
    line.append(f"policy {human.escape(p['name'])} @ {p['threshold']:.2f}   ")
    line.append(f"Eq.1 mean util {o['util_mean'] * 100:.1f} %   Eq.2 std-dev {o['util_std'] * 100:.1f} %   "
                f"Eq.3 power {o['power_w']:.0f} W   ", style="cyan")
    line.append(f"GPUs {s['gpus_allocated']}/{s['gpus_total']}   energy {o['energy_j'] / 3.6e6:.3f} kWh   "
                f"tasks: {human.escape(tasks)}")
    return line


def _node_table(n: Mapping[str, Any]) -> Table:
    host = n["host"]
    sim = " simulated" if n["simulated"] else ""
    cpu = f"CPU {host['cpu_util'] * 100:.0f} % of {n['cpu_cores']} cores" if host else "CPU -"
    title = (f"{human.escape(n['node_id'])}  {n['state']}{' cordoned' if n['cordoned'] else ''}  "
             f"{len(n['gpus'])} GPUs{sim}  {cpu}  {len(n['task_ids'])} tasks  "
             f"seen {human.fmt_duration(n['last_seen_age_s'])} ago")
    t = Table(title=title, title_justify="left", expand=False, box=None, padding=(0, 1), show_edge=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("GPU", "right"), ("UTIL", "left"), ("", "right"), ("MEMORY", "left"), ("", "right"),
        ("POWER", "left"), ("", "right"), ("TEMP", "right"))
    for col, justify in columns:
        t.add_column(col, justify=justify)
    for g in n["gpus"]:
        tm = g["telemetry"] or {}
        util, used, power = tm.get("util_gpu"), tm.get("mem_used_bytes"), tm.get("power_w")
        limit = g["power_limit_w"] or None
        temp = tm.get("temperature_c")
        t.add_row(
            str(g["index"]), _bar(util), "-" if util is None else f"{util * 100:5.1f} %",
            _bar(None if used is None else used / g["mem_total_bytes"] if g["mem_total_bytes"] else 0.0),
            "-" if used is None else f"{used / human.GIB:5.1f}/{g['mem_total_bytes'] / human.GIB:.0f} GiB",
            _bar(None if power is None or not limit else power / limit),
            "-" if power is None else f"{power:4.0f}/{g['power_limit_w']:.0f} W",
            "-" if temp is None else f"{temp:.0f} C",
        )
    return t


def _queue(tasks: Sequence[Mapping[str, Any]], width: int) -> Table:
    live = sorted((x for x in tasks if x["state"] not in _FINAL),
                  key=lambda x: (_ORDER.get(x["state"], 9), -x["priority"], x["submit_unix_s"] or 0))
    t = Table(title=f"queue: {len(live)} unfinished tasks", title_justify="left", box=None, padding=(0, 1))
    for col in ("TASK", "NAME", "STATE", "PRIO", "PLACEMENT / REASON"):
        t.add_column(col, no_wrap=True, overflow="ellipsis")
    reason_width = max(20, width - 60)
    for x in live[:_QUEUE_ROWS]:
        where = ",".join(f"{a['node_id']}:{'+'.join(map(str, a['gpu_indices']))}" for a in x["allocation"])
        detail = where or human.truncate_words(human.lead_with_cause(x["reason"]), reason_width)
        t.add_row(x["task_id"], human.escape(human.truncate(x["name"], 20)), x["state"], str(x["priority"]),
                  human.escape(detail))
    if len(live) > _QUEUE_ROWS:
        t.add_row("…", f"{len(live) - _QUEUE_ROWS} more", "", "", "")
    return t


def view(snap: Snapshot, width: int = 120, now: Callable[[], float] = time.time) -> RenderableType:
    """The whole screen for one snapshot."""
    clock = Text(time.strftime("%H:%M:%S", time.localtime(now())) + "   q quits", style="dim")
    if snap.status is None:
        return Group(Text(f"gptrm: {snap.error}", style="bold red"), clock)
    parts: list[RenderableType] = [_cluster_line(snap.status), clock, Text("")]
    for n in snap.nodes:
        parts += [_node_table(n), Text("")]
    if not snap.nodes:
        parts.append(Text("no nodes registered"))
    parts.append(_queue(snap.tasks, width))
    return Group(*parts)


@contextlib.contextmanager
def _keys(stream: TextIO) -> Iterator[int | None]:
    """cbreak mode on a terminal stdin (keys arrive unbuffered, Ctrl-C still interrupts); yields its fd."""
    if not stream.isatty():
        yield None
        return
    fd = stream.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _wait_for_quit(fd: int | None, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for a key; True when it was ``q``."""
    end = time.monotonic() + timeout_s
    while (left := end - time.monotonic()) > 0:
        if fd is None:
            time.sleep(left)
            return False
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            data = os.read(fd, 32)
            if not data or b"q" in data.lower():
                return True
    return False


def run_top(t: Transport, interval_s: float, console: Console | None = None, stdin: TextIO | None = None) -> int:
    """Show the live view until ``q`` or Ctrl-C (or once when stdout is not a terminal); returns the exit code.

    :param t: the coordinator connection.
    :param interval_s: seconds between refreshes.
    :param console: where to draw (a terminal console on stdout by default).
    :param stdin: where keys come from (``sys.stdin`` by default).
    """
    console = console or Console()
    if not console.is_terminal:
        snap = fetch(t)
        console.print(view(snap, console.width))
        return snap.error_code
    with _keys(stdin or sys.stdin) as fd, Live(console=console, screen=True, auto_refresh=False) as live:
        try:
            while True:
                live.update(view(fetch(t), console.width), refresh=True)
                if _wait_for_quit(fd, interval_s):
                    return 0
        except KeyboardInterrupt:
            return 0
