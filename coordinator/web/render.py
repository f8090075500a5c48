"""The console's pages as server-rendered HTML, and the row models their live streams send.

Each list has one model per item (:func:`task_row`, :func:`fleet_node`, :func:`queue_row`,
:func:`service_row`, :func:`event_row`): a flat dict of display strings. The first render builds the rows
from it, and the live stream (:mod:`coordinator.web.live`) sends the same dicts when they change, which
``static/app.js`` writes into the cells with ``textContent`` (never as markup). Every value reaches the
page through :mod:`coordinator.web.html`'s escaping.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from common.types import TaskState
from coordinator.web.html import Html, esc, join, tag, url

__all__ = ["COLORS", "EVENT_COLUMNS", "QUEUE_COLUMNS", "SERVICE_COLUMNS", "TASK_COLUMNS", "FleetSummary", "Viewer",
           "array_row", "event_row", "fleet_cells", "fleet_node", "page", "queue_row", "service_row", "signin_page",
           "task_row", "task_rows"]

COLORS = ("util", "mem", "power", "health")
"""What the fleet grid colours each GPU by."""
ZOOM_NODES = 200
"""Fleets of at most this many nodes are drawn with large cells (larger ones: click a group to zoom into it)."""
MAX_ROWS = 500
"""The most rows a list page renders (the newest first); the page says how many it left out."""
_TASK_STATES = {v: k.removeprefix("TASK_STATE_").lower() for k, v in types_pb2.TaskState.items()}
_NODE_STATES = {v: k.removeprefix("NODE_STATE_").lower() for k, v in types_pb2.NodeState.items()}
_POWER_OFF = {types_pb2.NODE_POWER_STATE_OFF, types_pb2.NODE_POWER_STATE_POWERING_OFF}
NAV = (("fleet", "/", "Fleet"), ("queues", "/queues", "Queues"), ("tasks", "/tasks", "Tasks"),
       ("services", "/services", "Services"), ("events", "/events", "Events"))


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who looks, and what the page shows about the replica that answers."""

    name: str
    role: str
    signed_in: bool
    """Whether a sign-out button makes sense (a token session; not the open mode or a certificate)."""
    banner: str = ""
    """A line about the data's provenance: a standby's view, or stale memory."""


def task_state(value: int) -> str:
    return _TASK_STATES.get(value, "unknown")


def node_state(value: int) -> str:
    return _NODE_STATES.get(value, "unknown")


def when(unix_s: float) -> str:
    """A time as ``2026-11-29 10:15:02`` UTC ("" for 0)."""
    if not unix_s or not math.isfinite(unix_s):
        return ""
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _num(value: float, digits: int = 1) -> str:
    return "" if not math.isfinite(value) else f"{value:.{digits}f}"


# ---- layout -------------------------------------------------------------------------------------------

def page(title: str, active: str, viewer: Viewer, body: Html, *, live: str = "", assets: dict[str, str]) -> Html:
    """A whole page: navigation, who is signed in, the body; ``live`` is the page's event-stream URL (its
    script opens it; without script the page is complete as rendered). ``assets`` maps a static file
    to its versioned URL."""
    nav = join(tag("a", label, href=href, cls="on" if key == active else None) for key, href, label in NAV)
    who = join([tag("span", f"{viewer.name} ({viewer.role})", cls="who"),
                Html('<form method="post" action="/signout"><button type="submit">Sign out</button></form>')
                if viewer.signed_in else ""])
    banner = tag("p", viewer.banner, cls="banner") if viewer.banner else ""
    return Html(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{esc(title)} · gptrm</title>"
        f"<link rel=\"stylesheet\" href=\"{esc(assets['app.css'])}\">"
        + (f"<link rel=\"stylesheet\" href=\"{esc(assets['uPlot.min.css'])}\">" if active in ("services", "task")
           else "")
        + f"</head><body data-live=\"{esc(live)}\"><header><b class=\"brand\">gptrm</b><nav>{nav}</nav>{who}"
        f"</header>{banner}<main><h1>{esc(title)}</h1>{body}</main>"
        + (f"<script src=\"{esc(assets['uPlot.iife.min.js'])}\" defer></script>" if active in ("services", "task")
           else "")
        + f"<script src=\"{esc(assets['app.js'])}\" defer></script></body></html>")


def signin_page(message: str, assets: dict[str, str]) -> Html:
    """The sign-in form: a token, posted once; the session is a cookie from then on."""
    return Html(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign in · gptrm</title>"
        f"<link rel=\"stylesheet\" href=\"{esc(assets['app.css'])}\"></head><body class=\"signin\"><main>"
        "<h1>gptrm</h1>" + (str(tag("p", message, cls="error")) if message else "")
        + "<form method=\"post\" action=\"/signin\"><label>Token <input type=\"password\" name=\"token\" "
        "autocomplete=\"off\" required autofocus></label><button type=\"submit\">Sign in</button></form>"
        "<p class=\"hint\">An Admin API token (gptrmctl tokens), or a client certificate where the coordinator "
        "uses mutual TLS.</p></main></body></html>")


def table(columns: Sequence[tuple[str, str]], rows: Iterable[dict[str, str]], *, table_id: str,
          key: str = "id", link: tuple[str, str] | None = None) -> Html:
    """A list: one ``<tr id="{table_id}:{row[key]}">`` per row, one ``<td data-k>`` per column (what the live
    script updates); ``link`` (column, path) makes that column's cell a link to ``path/value``."""
    head = join(tag("th", label, data_k=k) for k, label in columns)
    body = []
    for row in rows:
        cells = []
        for k, _ in columns:
            value = row.get(k, "")
            content = tag("a", value, href=url(link[1], value)) if link and k == link[0] else value
            cells.append(tag("td", content, data_k=k, cls=f"st-{value}" if k == "state" else None))
        body.append(tag("tr", join(cells), id=f"{table_id}:{row.get(key, '')}"))
    return Html(f"<table id=\"{esc(table_id)}\" data-key=\"{esc(key)}\""
                + (f" data-link=\"{esc(link[0])}\" data-href=\"{esc(link[1])}\"" if link else "")
                + f"><thead><tr>{head}</tr></thead><tbody>{join(body)}</tbody></table>")


def facts(items: Iterable[tuple[str, object]], *, dl_id: str = "") -> Html:
    """A ``<dl>`` of label, value pairs (each ``<dd data-k>`` updatable by the live script)."""
    return Html(f"<dl class=\"facts\" id=\"{esc(dl_id)}\">"
                + join(Html(f"{tag('dt', label)}{tag('dd', value, data_k=label)}") for label, value in items)
                + "</dl>")


# ---- fleet --------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class FleetSummary:
    nodes: int
    nodes_by_state: dict[str, int]
    gpus: int
    gpus_idle: int
    power_w: float
    energy_today_kwh: float
    powered_down: int

    def items(self) -> list[tuple[str, str]]:
        states = ", ".join(f"{k.lower()} {v}" for k, v in sorted(self.nodes_by_state.items()))
        return [("Nodes", f"{self.nodes}" + (f" ({states})" if states else "")),
                ("GPUs", str(self.gpus)), ("GPUs idle", str(self.gpus_idle)),
                ("Cluster power now", f"{self.power_w / 1000:.1f} kW"),
                ("Task energy today", f"{self.energy_today_kwh:.1f} kWh"),
                ("Nodes powered down", str(self.powered_down))]


def _bucket(fraction: float | None) -> str:
    if fraction is None or not math.isfinite(fraction):
        return "x"
    return str(min(9, max(0, int(fraction * 10))))


def fleet_cells(view: admin_pb2.NodeView, color: str) -> str:
    """One character per GPU of the node: its colour class (``0``–``9`` the chosen measure in tenths, ``x``
    unknown, ``u`` unhealthy, ``d`` degraded (health colouring), ``o`` the node powered down or lost)."""
    inv = view.record.inventory
    if view.state == types_pb2.NODE_STATE_LOST or view.record.power_state in _POWER_OFF:
        return "o" * len(inv.gpus)
    samples = {g.index: g for g in view.latest.gpus} if view.has_latest else {}
    out = []
    for gpu in inv.gpus:
        s = samples.get(gpu.index)
        if s is None:
            out.append("x")
            continue
        health = s.health.state
        if health == types_pb2.GPU_HEALTH_STATE_UNHEALTHY or (not health and not s.healthy):
            out.append("u")
        elif color == "health":
            out.append("d" if health == types_pb2.GPU_HEALTH_STATE_DEGRADED else "0")
        elif color == "mem":
            total = s.mem_total_bytes if s.HasField("mem_total_bytes") else gpu.mem_total_bytes
            out.append(_bucket(s.mem_used_bytes / total if s.HasField("mem_used_bytes") and total else None))
        elif color == "power":
            limit = s.power_limit_w if s.HasField("power_limit_w") else gpu.power_limit_w
            out.append(_bucket(s.power_w / limit if s.HasField("power_w") and limit else None))
        else:
            out.append(_bucket(s.util_gpu if s.HasField("util_gpu") else None))
    return "".join(out)


def fleet_node(view: admin_pb2.NodeView, color: str, group: str) -> dict[str, str]:
    """A node of the grid: its id, its group (the value of label ``group``), state and cells."""
    inv = view.record.inventory
    return {"id": inv.node_id, "group": inv.labels.get(group, "") if group else "",
            "state": node_state(view.state), "cells": fleet_cells(view, color)}


def fleet_body(nodes: Sequence[dict[str, str]], summary: FleetSummary, *, color: str, group: str,
               only: str | None) -> Html:
    """The fleet page: the figures, the colour and grouping choices (plain links and a form), the legend
    and one grid per group (``only``: that group alone, zoomed)."""
    colors = join(tag("a", c, href=url("/", color=c, group=group, only=only), cls="on" if c == color else None)
                  for c in COLORS)
    form = Html(f"<form method=\"get\" action=\"/\" class=\"inline\"><input type=\"hidden\" name=\"color\" "
                f"value=\"{esc(color)}\"><label>Group by label <input name=\"group\" value=\"{esc(group)}\" "
                f"size=\"10\"></label><button type=\"submit\">Group</button></form>")
    legend = join(tag("i", label, cls=f"c{code}") for code, label in (
        [("0", "healthy"), ("d", "degraded"), ("u", "unhealthy"), ("o", "off/lost"), ("x", "no data")]
        if color == "health" else
        [(str(i), f"{i * 10}%") for i in (0, 2, 4, 6, 8)] + [("9", "90%+"), ("u", "unhealthy"), ("o", "off/lost"),
                                                             ("x", "no data")]))
    groups: dict[str, list[dict[str, str]]] = {}
    for n in nodes:
        groups.setdefault(n["group"], []).append(n)
    sections = []
    zoom = only is not None or len(nodes) <= ZOOM_NODES
    for name in sorted(groups):
        if only is not None and name != only:
            continue
        members = groups[name]
        cells = "".join(
            f"<a class=\"n s-{esc(n['state'])}\" id=\"n:{esc(n['id'])}\" title=\"{esc(n['id'])}\" "
            f"href=\"{esc(url('/tasks', node=n['id']))}\">"
            + "".join(f"<i class=\"c{c}\"></i>" for c in n["cells"]) + "</a>" for n in members)
        label = name or ("all nodes" if not group else f"no {group} label")
        head = tag("a", label, href=url("/", color=color, group=group, only=name)) if only is None else esc(label)
        count = f"{len(members)} node" + ("" if len(members) == 1 else "s")
        sections.append(Html(f"<section class=\"grp\"><h2>{head} <small>{count}</small></h2>"
                             f"<div class=\"grid{' zoom' if zoom else ''}\">{cells}</div></section>"))
    return Html(facts(summary.items(), dl_id="summary") + f"<p class=\"controls\">Colour by {colors} {form}</p>"
                + f"<p class=\"legend\">{legend}</p>" + join(sections)
                + "<p id=\"added\" class=\"note\" hidden>New nodes joined: reload to place them.</p>")


# ---- tasks --------------------------------------------------------------------------------------------

TASK_COLUMNS = (("id", "Task"), ("name", "Name"), ("state", "State"), ("queue", "Queue"), ("user", "User"),
                ("nodes", "Nodes"), ("gpus", "GPUs"), ("submitted", "Submitted (UTC)"), ("reason", "Reason"))


def task_row(t: types_pb2.Task) -> dict[str, str]:
    gpus = sum(len(a.gpu_indices) for a in t.allocation.nodes)
    return {"id": t.id, "name": t.spec.name, "state": task_state(t.state), "queue": t.queue or "default",
            "user": t.submitted_by, "nodes": ", ".join(a.node_id for a in t.allocation.nodes), "gpus": str(gpus),
            "submitted": when(t.submit_unix_s), "reason": t.reason}


# An array's row shows the state of its least advanced elements: running before anything not started, anything
# unfinished before what has ended, a failure before a success.
_ARRAY_HEADLINE = (TaskState.RUNNING, TaskState.STARTING, TaskState.SCHEDULED, TaskState.PREEMPTED, TaskState.PAUSED,
                   TaskState.PENDING, TaskState.FAILED, TaskState.TIMEOUT, TaskState.CANCELLED, TaskState.SUCCEEDED)


def array_row(array_id: str, elements: Sequence[types_pb2.Task]) -> dict[str, str]:
    """One row for the elements of an array shown (the Tasks page lists an array as one line, linked to the
    list of its elements): the state of its least advanced elements, and its counts by state as the reason."""
    counts = Counter(int(t.state) for t in elements)
    headline = next((s for s in _ARRAY_HEADLINE if counts[s]), TaskState.PENDING)
    first = min(elements, key=lambda t: t.array_index)
    nodes = sorted({a.node_id for t in elements for a in t.allocation.nodes})
    cap = first.spec.array.max_running
    by_state = ", ".join(f"{n} {task_state(s)}" for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return {"id": array_id, "name": first.spec.name, "state": task_state(headline), "queue": first.queue or "default",
            "user": first.submitted_by,
            "nodes": ", ".join(nodes[:8]) + (f" (+{len(nodes) - 8})" if len(nodes) > 8 else ""),
            "gpus": str(sum(len(a.gpu_indices) for t in elements for a in t.allocation.nodes)),
            "submitted": when(first.submit_unix_s),
            "reason": f"array of {len(elements)}" + (f" (%{cap})" if cap else "") + f": {by_state}"}


def task_rows(tasks: Sequence[types_pb2.Task], *, arrays: bool = True) -> list[dict[str, str]]:
    """The rows of ``tasks`` (oldest first), newest first and at most :data:`MAX_ROWS`; with ``arrays`` the
    elements of an array make one row, placed as its newest element."""
    if not arrays:
        return [task_row(t) for t in tasks[-MAX_ROWS:][::-1]]
    grouped: dict[str, list[types_pb2.Task]] = {}
    for t in tasks:
        if t.array_id:
            grouped.setdefault(t.array_id, []).append(t)
    rows: list[dict[str, str]] = []
    for t in reversed(tasks):
        if len(rows) == MAX_ROWS:
            break
        if not t.array_id:
            rows.append(task_row(t))
        elif (elements := grouped.pop(t.array_id, None)) is not None:   # its newest element: the array's place
            rows.append(array_row(t.array_id, elements))
    return rows


def task_matches(t: types_pb2.Task, *, state: str, queue: str, user: str, node: str, array: str = "") -> bool:
    """Whether task ``t`` passes the Tasks page's filters (each "" passes everything)."""
    return ((not state or task_state(t.state) == state) and (not queue or (t.queue or "default") == queue)
            and (not user or t.submitted_by == user) and (not array or t.array_id == array)
            and (not node or any(a.node_id == node for a in t.allocation.nodes)))


def tasks_body(rows: Sequence[dict[str, str]], total: int, filters: dict[str, str]) -> Html:
    states = join(tag("option", s or "any state", value=s, selected="selected" if filters["state"] == s else None)
                  for s in ["", *(v for k, v in sorted(_TASK_STATES.items()) if k)])
    form = Html("<form method=\"get\" action=\"/tasks\" class=\"filters\">"
                f"<label>State <select name=\"state\">{states}</select></label>"
                + join(Html(f"<label>{esc(k.title())} <input name=\"{esc(k)}\" value=\"{esc(filters.get(k, ''))}\" "
                            "size=\"12\"></label>") for k in ("queue", "user", "node", "array"))
                + "<button type=\"submit\">Filter</button></form>")
    grouped = "" if filters.get("array") else " An array is one line (its least advanced elements' state); its id " \
        "lists its elements."
    more = tag("p", f"Showing the newest {len(rows)} lines of {total} tasks.{grouped}", cls="note") \
        if total > len(rows) else ""
    return Html(form + more + table(TASK_COLUMNS, rows, table_id="tasks", link=("id", "/tasks")))


def task_body(t: types_pb2.Task, gpus: Sequence[tuple[str, int, str]], *, logs_shown: bool, log_note: str,
              util_history: dict[str, dict[str, Any]] | None = None) -> Html:
    """One task: its facts, history, parts and ranks, GPUs (node, index, utilization now, and per node a
    chart of their utilization since it was placed: ``util_history``), elastic sizes, and its log (live)
    for roles that may read it, else why not."""
    energy_kwh = t.energy_j / 3.6e6
    items: list[tuple[str, object]] = [
        ("State", task_state(t.state)), ("Reason", t.reason or "-"), ("Name", t.spec.name),
        ("Queue", t.queue or "default"), ("Submitted by", t.submitted_by or "-"),
        ("Submitted", when(t.submit_unix_s)), ("Restarts", t.restarts), ("Preemptions", t.preemptions),
        ("Energy", f"{energy_kwh:.3f} kWh"),
        ("Exit code", t.exit_code if t.has_exit_code else "-"),
        ("Command", " ".join(t.spec.argv)),
    ]
    if t.service_id:
        items.append(("Service", f"{t.service_id} replica {t.replica_index}"))
    history = table((("time", "Time (UTC)"), ("state", "State"), ("reason", "Reason")),
                    ({"id": str(i), "time": when(h.time_unix_s), "state": task_state(h.state), "reason": h.reason}
                     for i, h in enumerate(t.history)), table_id="history")
    parts = table((("rank", "Rank"), ("node", "Node"), ("state", "State"), ("exit", "Exit"), ("reason", "Reason")),
                  ({"id": str(p.rank), "rank": str(p.rank), "node": p.node_id, "state": task_state(p.state),
                    "exit": str(p.exit_code) if p.has_exit_code else "", "reason": p.reason} for p in t.parts),
                  table_id="parts")
    gpu_table = table((("node", "Node"), ("gpu", "GPU"), ("util", "Utilization now")),
                      ({"id": f"{n}/{i}", "node": n, "gpu": str(i), "util": u} for n, i, u in gpus), table_id="gpus")
    out = [facts(items, dl_id="task"), Html("<h2>History</h2>"), history]
    if t.parts:
        out += [Html("<h2>Parts and ranks</h2>"), parts]
    out += [Html("<h2>GPUs</h2>"), gpu_table if gpus else tag("p", "None held.", cls="note")]
    out += [Html(f"<figure class=\"chart util-chart\" data-points=\"{esc(json.dumps(series))}\"><figcaption>"
                 f"{esc(node)}: GPU utilization (%) since placed, as far back as the coordinator keeps"
                 "</figcaption></figure>") for node, series in (util_history or {}).items()]
    if t.spec.HasField("elastic"):
        e = t.elastic
        sizes = [[r.time_unix_s, r.to_gpus] for r in reversed(e.history)]   # oldest first
        if sizes:
            sizes.insert(0, [t.submit_unix_s, e.history[-1].from_gpus])
        out += [Html("<h2>Elastic sizes</h2>"),
                Html(f"<figure class=\"chart\" id=\"elastic-chart\" data-points=\"{esc(json.dumps(sizes))}\">"
                     "<figcaption>GPUs over time</figcaption></figure>") if sizes else Html(""),
                facts([("Range", f"{t.spec.elastic.min_gpus}–{t.spec.elastic.max_gpus} GPUs"), ("Now", e.gpus),
                       ("Target", e.target_gpus or "max"), ("Resizes", e.resizes),
                       ("Blocked", e.grow_blocked or "-")]),
                table((("time", "Time (UTC)"), ("from", "From"), ("to", "To"), ("reason", "Reason")),
                      ({"id": str(i), "time": when(r.time_unix_s), "from": str(r.from_gpus), "to": str(r.to_gpus),
                        "reason": r.reason} for i, r in enumerate(e.history)), table_id="resizes")]
    out.append(Html("<h2>Log</h2>"))
    if logs_shown:
        out.append(Html(f"<pre id=\"log\" class=\"log\">{esc(t.log_tail)}</pre>"))
    else:
        out.append(tag("p", log_note, cls="note", id="log-hidden"))
    return join(out)


# ---- queues -------------------------------------------------------------------------------------------

QUEUE_COLUMNS = (("name", "Queue"), ("order", "Fair order"), ("quota", "Quota"), ("used", "Used"),
                 ("borrowed", "Borrowed"), ("lendable", "Idle quota (lendable)"), ("running", "Running"),
                 ("waiting", "Waiting"), ("usage", "GPU-hours (7 days)"), ("budget", "Budget used"),
                 ("gate", "Budget gate"))


def queue_row(v: admin_pb2.QueueView, gpu_hours: float) -> dict[str, str]:
    q = v.queue
    quota = sum(x.gpus for x in q.quotas)
    own = sum(h.own for h in v.held)
    borrowed = sum(h.borrowed for h in v.held)
    lend = sum(min(x.lend, x.gpus) if x.has_lend else x.gpus for x in q.quotas)
    return {"id": q.name, "name": q.name, "parent": q.parent, "order": str(v.fair_order) if v.fair_order else "",
            "quota": str(quota), "used": str(own), "borrowed": str(borrowed),
            "lendable": str(max(0, min(lend, quota - own))), "running": str(v.running), "waiting": str(v.pending),
            "usage": f"{gpu_hours:.1f}", "budget": f"{v.budget_used * 100:.0f}%" if q.has_budget else "",
            "gate": v.budget_gate if q.has_budget else ""}


def _meter(value: float, high: float, label: str) -> Html:
    high = max(high, value, 1e-9)
    return Html(f"<meter min=\"0\" max=\"{high:.6g}\" value=\"{value:.6g}\" title=\"{esc(label)}\"></meter>")


def queues_body(views: admin_pb2.ListQueuesResponse, rows: Sequence[dict[str, str]]) -> Html:
    """The queue tree with its figures, and bars: GPUs used and borrowed against quota, GPU-hours against the
    largest, budget used."""
    most = max((float(r["usage"]) for r in rows), default=0.0)
    bars = []
    for r in rows:
        quota = float(r["quota"])
        used, borrowed = float(r["used"]), float(r["borrowed"])
        cap = max(quota, used + borrowed, 1.0)
        parts = [tag("span", r["name"], cls="qname"),
                 _meter(used, cap, f"used {r['used']} of quota {r['quota']}"),
                 _meter(borrowed, cap, f"borrowed {r['borrowed']}"),
                 _meter(float(r["usage"]), most, f"{r['usage']} GPU-hours")]
        if r["budget"]:
            parts.append(_meter(float(r["budget"].rstrip("%")) / 100, 1.0, f"budget {r['budget']} used"))
        bars.append(tag("div", join(parts), cls="bars"))
    note = "" if views.managed else tag("p", "No queues configured: every task runs in the default queue.", cls="note")
    order = sorted((r for r in rows if r["order"]), key=lambda r: int(r["order"]))
    fair = tag("p", "Fair-share order now: " + (", ".join(r["name"] for r in order) or "-"), id="fair")
    return Html(note + fair + table(QUEUE_COLUMNS, rows, table_id="queues")
                + "<h2>Quota, use and budget</h2><p class=\"legend\">Bars: used of quota · borrowed · GPU-hours "
                  "(7 days, against the largest) · budget used</p>" + join(bars))


# ---- services -----------------------------------------------------------------------------------------

SERVICE_COLUMNS = (("id", "Service"), ("name", "Name"), ("replicas", "Replicas"), ("desired", "Desired"),
                   ("range", "Min–max"), ("load", "Load"), ("forecast", "Forecast"), ("signal", "Signal"),
                   ("model", "Forecast model"), ("reason", "Reason"))


def service_row(v: admin_pb2.ServiceView) -> dict[str, str]:
    s = v.service
    running = sum(1 for t in v.replicas if t.state == types_pb2.TASK_STATE_RUNNING)
    return {"id": s.id, "name": s.spec.name, "replicas": f"{running}/{len(v.replicas)}",
            "desired": str(s.desired) + (" (pinned)" if s.pinned else ""),
            "range": f"{s.spec.service.min_replicas}–{s.spec.service.max_replicas}",
            "load": _num(s.load, 2), "forecast": _num(s.forecast_load, 2), "signal": _num(s.signal, 2),
            "model": s.forecast_model, "reason": "stopped" if s.stopped else s.reason}


def services_body(rows: Sequence[dict[str, str]]) -> Html:
    charts = join(Html(f"<figure class=\"chart\" id=\"chart:{esc(r['id'])}\" data-service=\"{esc(r['id'])}\">"
                       f"<figcaption>{esc(r['id'])}: load against forecast</figcaption></figure>") for r in rows)
    return Html(table(SERVICE_COLUMNS, rows, table_id="services")
                + ("" if rows else str(tag("p", "No services.", cls="note"))) + charts)


# ---- events -------------------------------------------------------------------------------------------

EVENT_COLUMNS = (("time", "Time (UTC)"), ("kind", "Kind"), ("node", "Node"), ("task", "Task"), ("message", "Message"))
_EVENT_KINDS = {v: k.removeprefix("EVENT_KIND_").lower() for k, v in admin_pb2.EventKind.items()}


def event_row(e: admin_pb2.Event) -> dict[str, str]:
    return {"id": str(e.seq), "time": when(e.time_unix_s), "kind": _EVENT_KINDS.get(e.kind, "unknown"),
            "node": e.node_id, "task": e.task_id, "message": e.message}


def events_body(rows: Sequence[dict[str, str]]) -> Html:
    return table(EVENT_COLUMNS, rows, table_id="events")


def error_body(message: str) -> Html:
    return tag("p", message, cls="error")


def as_dict(rows: Iterable[dict[str, Any]], key: str = "id") -> dict[str, dict[str, Any]]:
    return {str(r[key]): r for r in rows}
