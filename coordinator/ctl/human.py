"""gptrmctl's human output: units, ages, aligned tables, reasons that lead with their cause.

Everything here reads the JSON documents of :mod:`coordinator.ctl.render`, so the tables
show exactly what ``-o json`` prints. Text that comes from users or remote processes (task
and node names, reasons, log tails) passes through :func:`escape` so that a control
character in a name cannot move the cursor or recolour the terminal.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "age",
    "demand_text",
    "escape",
    "event_line",
    "fmt_bytes",
    "fmt_duration",
    "lead_with_cause",
    "node_detail",
    "nodes_table",
    "status_text",
    "table",
    "task_detail",
    "tasks_table",
    "truncate",
    "truncate_words",
]

GIB = 1024**3
REASON_WIDTH = 72
"""Widest REASON cell in the normal task table (``-o wide`` shows the whole reason)."""
HEALTH_WIDTH = 48
"""Widest HEALTH cell in the normal node table (``-o wide`` shows the whole summary)."""
_FINAL = ("succeeded", "failed", "cancelled", "timeout")
# C0/C1 control characters, and the bidirectional overrides/isolates and line separators that
# can make a terminal show text other than what is there (U+202E reverses what follows).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CAUSE = re.compile(r"^(?P<head>.*?)\s*\((?P<cause>[^()]*(?:\([^()]*\)[^()]*)*)\)\s*$", re.DOTALL)


def escape(text: Any, *, keep_newlines: bool = False) -> str:
    """``text`` with control characters written as ``\\xNN`` and bidirectional controls as ``\\uNNNN``
    (newlines and tabs kept when asked)."""
    def sub(m: re.Match[str]) -> str:
        ch = m.group()
        if keep_newlines and ch in "\n\t":
            return ch
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _CONTROL.sub(sub, str(text))


def truncate(text: str, width: int) -> str:
    """Cut the tail of ``text`` to ``width`` characters, marking the cut with ``…``."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def truncate_words(text: str, width: int) -> str:
    """Like :func:`truncate`, but cut after a whole word (a reason is never cut mid-word); a single word longer
    than ``width`` is cut as :func:`truncate` cuts it."""
    if len(text) <= width:
        return text
    head = text[: max(0, width - 1)]
    if text[len(head)] != " " and " " in head:     # the cut falls inside a word: leave that word out
        head = head[: head.rfind(" ")]
    return head.rstrip(" ,;:—") + "…"


def lead_with_cause(reason: str) -> str:
    """Put a reason's cause first: ``no node with X (1 nodes: cpu_cores over threshold)`` →
    ``1 nodes: cpu_cores over threshold — no node with X``, so a cut tail loses the detail, not the cause."""
    m = _CAUSE.match(reason)
    if m is None or not m["head"]:
        return reason
    return f"{m['cause']} — {m['head']}"


def fmt_bytes(n: float | None) -> str:
    """Human size with binary units (``80.0 GiB``); ``-`` when unknown."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns at TiB


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.0f} %"


def _watts(w: float | None) -> str:
    return "-" if w is None else f"{w:.0f} W"


def fmt_duration(seconds: float) -> str:
    """``42s``, ``5m``, ``3h``, ``2d``."""
    d = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if d >= size:
            return f"{d / size:.0f}{unit}"
    return f"{d:.0f}s"


def age(unix_s: float | None, now: Callable[[], float] = time.time) -> str:
    """Time since ``unix_s`` (:func:`fmt_duration`); ``-`` when unset."""
    return "-" if not unix_s else fmt_duration(now() - unix_s)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, right: Sequence[int] = ()) -> str:
    """Aligned columns separated by two spaces; columns in ``right`` (numbers) are right-aligned."""
    cells = [[str(h) for h in headers]] + [[escape(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _plural(n: float, word: str) -> str:
    return f"{n:g} {word}" + ("" if n == 1 else "s")


_ACTIONS = {   # verb → (the state that means it is done, the -ing form, what its agents do meanwhile)
    "cancelled": ("cancelled", "cancelling", "its agents are stopping it"),
    "paused": ("paused", "pausing", "its agents are suspending its processes"),
    "resumed": ("running", "resuming", "its agents are continuing its processes"),
}


def task_action_text(verb: str, d: Mapping[str, Any]) -> str:
    """What ``cancel``, ``pause`` or ``resume`` did to a task, from the task document the call returned:
    ``task T cancelled`` when it is done, else ``cancelling task T (was running): its agents are stopping it``
    (the agents report the final state; ``gptrmctl tasks T`` shows it)."""
    done, ongoing, meanwhile = _ACTIONS[verb]
    task_id = escape(d["task_id"])
    if d["state"] == done:
        return f"task {task_id} {verb}"
    return f"{ongoing} task {task_id} (was {d['state']}): {meanwhile}"


def demand_text(d: Mapping[str, Any]) -> str:
    """A ResourceVector document as ``1 GPU × 10.0 GiB, 1 core, 16.0 GiB memory, 10.0 GiB disk``."""
    gpus = d.get("gpus") or 0
    parts = []
    if gpus:
        per = f" × {fmt_bytes(d['gpu_mem_bytes'])}" if d.get("gpu_mem_bytes") else ""
        parts.append(_plural(gpus, "GPU") + per)
    parts.append(_plural(d.get("cpu_cores") or 0, "core"))
    parts.append(f"{fmt_bytes(d.get('mem_bytes') or 0)} memory")
    if d.get("disk_bytes"):
        parts.append(f"{fmt_bytes(d['disk_bytes'])} disk")
    return ", ".join(parts)


def reserved_text(r: Mapping[str, Any]) -> str:
    """A node's reservation (``NodeRecord.reserved``, whose GPU memory is the node's total, not per GPU) as
    ``5 GPUs (10.0 GiB GPU memory in all), 1 core, 16.0 GiB memory``."""
    text = demand_text({**r, "gpu_mem_bytes": 0})
    if r.get("gpus") and r.get("gpu_mem_bytes"):
        gpus, _, rest = text.partition(", ")
        text = f"{gpus} ({fmt_bytes(r['gpu_mem_bytes'])} GPU memory in all), {rest}"
    return text


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def threshold_rule(p: Mapping[str, Any]) -> str:
    """What the threshold caps, in words, from a policy document."""
    if p.get("threshold_mode") == "paper":
        return "paper: caps every dimension, GPU count included"
    return "whole-gpus: caps host CPU, memory, disk and shared GPUs; whole GPUs may fill a node"


def status_text(d: Mapping[str, Any]) -> str:
    """``gptrmctl status``."""
    o, p = d["objectives"], d["policy"]
    role = "leader" if d["is_leader"] else "standby"
    return "\n".join([
        f"coordinator   {escape(d['coordinator_id'])} ({role}){' [stale]' if d['stale'] else ''}",
        f"leader        {escape(d['leader_id'] or '-')} at {d['leader_address'] or '-'} (epoch {d['leader_epoch']})",
        f"uptime        {fmt_duration(d['uptime_s'])}",
        f"policy        {escape(p['name'])} (threshold {p['threshold']:.2f}, {threshold_rule(p)})",
        f"nodes         {escape(_counts(d['nodes_by_state']))}",
        f"tasks         {escape(_counts(d['tasks_by_state']))}",
        f"gpus          {d['gpus_allocated']}/{d['gpus_total']} allocated",
        f"utilization   mean {_pct(o['util_mean'])} (Eq. 1)  std-dev {_pct(o['util_std'])} (Eq. 2)  "
        f"gpu memory {_pct(o['gpu_mem_util'])}",
        f"power         {_watts(o['power_w'])} (Eq. 3)  energy {(o['energy_j'] or 0) / 3.6e6:.3f} kWh since start",
        f"security      {'INSECURE: plaintext gRPC, agents unauthenticated' if d['insecure'] else 'mutual TLS'}"
        f" (auth: {escape(d['auth'] or 'unknown')})",
        *_rate_lines(d.get("telemetry_rate")),
        *([f"telemetry     {d['telemetry_rejected_total']} samples refused (NaN, negative or impossible values)"]
          if d.get("telemetry_rejected_total") else []),
        *([f"quarantined   {len(d['quarantined_keys'])} corrupt etcd value(s) moved aside: "
           + escape(", ".join(d["quarantined_keys"]))] if d.get("quarantined_keys") else []),
        *_duty_lines(d.get("leader_duties") or []),
    ])


def _rate_lines(r: Mapping[str, Any] | None) -> list[str]:
    """The telemetry rate in force: every sample, or one summary per report interval, and the ingest."""
    if not r or not r["report_interval_s"]:
        return []
    every, sampling = r["report_interval_s"], r["sampling_interval_s"]
    how = (f"every {every:g} s (summaries of {sampling:g} s samples)" if every > sampling
           else f"every sample ({sampling:g} s)")
    return [f"telemetry     {how}, {r['reporting_nodes']} nodes reporting; ingest {r['ingest_per_s']:,.0f}/s "
            f"(budget {r['ingest_budget_per_s']:,.0f}/s)"]


def _duty_lines(duties: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per leader duty: state, failures, age of its last completed pass (and the last error)."""
    lines = []
    for i, x in enumerate(duties):
        age = "-" if x["last_pass_age_s"] is None else f"{fmt_duration(x['last_pass_age_s'])} ago"
        err = f"  last error: {escape(x['last_error'])}" if x["last_error"] else ""
        lines.append(f"{'duties' if i == 0 else '':<14}{escape(x['name']):<11} {x['state']:<10} "
                     f"failures {x['failures']:<3} last pass {age}{err}")
    return lines


def _node_gpu_summary(n: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """Mean GPU utilization, GPU memory used/total, GPU power, and the GPU description."""
    gpus = n["gpus"]
    tele = [g["telemetry"] for g in gpus if g["telemetry"] is not None]
    util = [t["util_gpu"] for t in tele if t["util_gpu"] is not None]
    used = sum(t["mem_used_bytes"] or 0 for t in tele)
    total = sum(g["mem_total_bytes"] for g in gpus)
    power = [t["power_w"] for t in tele if t["power_w"] is not None]
    model = gpus[0]["model"] if gpus else "-"
    what = f"{len(gpus)}x {model}" + (" (simulated)" if n["simulated"] else "")
    return (_pct(sum(util) / len(util)) if util else "-", f"{fmt_bytes(used)} / {fmt_bytes(total)}" if tele else "-",
            _watts(sum(power)) if power else "-", what)


def nodes_table(docs: Sequence[Mapping[str, Any]], *, wide: bool = False) -> str:
    """``gptrmctl nodes`` (``-o wide`` adds host, cores, memory, reservations and backend)."""
    headers = ["NODE", "STATE", "HEALTH", "GPUS", "GPU UTIL", "GPU MEMORY", "GPU POWER", "CPU", "TASKS", "LAST SEEN"]
    if wide:
        headers += ["HOSTNAME", "CORES", "MEMORY", "RESERVED", "BACKEND"]
    rows = []
    for n in docs:
        util, mem, power, what = _node_gpu_summary(n)
        host = n["host"]
        switched = n.get("power_state", "ready")
        state = n["state"] + ("" if switched == "ready" else f" ({switched})")
        health = n["health"]["summary"] if n.get("health") else "-"
        row = [n["node_id"], state, health if wide else truncate_words(health, HEALTH_WIDTH), what, util, mem, power,
               _pct(host["cpu_util"]) if host else "-", len(n["task_ids"]),
               fmt_duration(n["last_seen_age_s"]) + " ago"]
        if wide:
            r = n["reserved"]
            sim = " (simulated)" if n["host_simulated"] else ""
            row += [n["hostname"], f"{n['cpu_cores']}{sim}", fmt_bytes(n["mem_total_bytes"]),
                    f"{r['gpus']:g} GPUs, {r['cpu_cores']:g} cores", n["gpu_backend"]]
        rows.append(row)
    return table(headers, rows, right=(4, 6, 8))


def node_detail(d: Mapping[str, Any], now: Callable[[], float] = time.time) -> str:
    """``gptrmctl nodes NODE``: the node, then one row per GPU."""
    flags = (" cordoned" if d["cordoned"] else "") + (" draining" if d["draining"] else "")
    host = d["host"]
    sim_host = " (SIMULATED host)" if d["host_simulated"] else ""
    r = d["reserved"]
    head = [
        f"node          {escape(d['node_id'])} ({escape(d['hostname'])})",
        f"state         {d['state']}{flags}, last seen {fmt_duration(d['last_seen_age_s'])} ago",
        f"power         {d.get('power_state', 'ready')}"
        + (f": {escape(d['power_reason'])}" if d.get("power_reason") else ""),
        f"gpu backend   {escape(d['gpu_backend'])}{' (SIMULATED GPUs)' if d['simulated'] else ''}",
        f"host          {d['cpu_cores']} cores, {fmt_bytes(d['mem_total_bytes'])} memory{sim_host}",
        "host now      " + (f"CPU {_pct(host['cpu_util'])}, memory {fmt_bytes(host['mem_used_bytes'])} used"
                             + (f", CPU package {_watts(host['cpu_power_w'])}" if host["cpu_power_w"] else "")
                             if host else "-"),
        f"reserved      {reserved_text(r)}",
        f"tasks         {escape(', '.join(d['task_ids']) or 'none')}",
    ]
    if d.get("advertise_address"):
        ports = f", task ports {d['task_port_min']}-{d['task_port_max']}" if d.get("task_port_min") else ""
        head.append(f"address       {escape(d['advertise_address'])}{ports}")
    room = [f"{d[key]} {what}" for key, what in (("task_uid_room", "tasks with a uid of their own"),
                                                  ("task_ports_free", "free task ports"))
            if d.get(key) is not None]
    if room:
        head.append(f"room          {', '.join(room)}")
    curve = d["power_curve"]
    if curve is not None:
        origin = f"fitted from {curve['samples']} samples" if curve["source"] == "fitted" else "datasheet"
        head.append(f"power curve   GPUs {_watts(curve['idle_w'])} idle, {_watts(curve['max_w'])} at full load "
                    f"({origin})")
    head += health_lines(d, now)
    rows = []
    for g in d["gpus"]:
        t = g["telemetry"] or {}
        limit = t.get("power_limit_w") or g["power_limit_w"]   # the enforced limit now (power capping moves it)
        power = f"{t['power_w']:.0f} / {limit:.0f} W" if t.get("power_w") is not None else "-"
        rows.append([
            g["index"], g["model"], _pct(t.get("util_gpu")),
            f"{fmt_bytes(t.get('mem_used_bytes') or 0)} / {fmt_bytes(g['mem_total_bytes'])}", power,
            f"{t['temperature_c']:.0f} C" if t.get("temperature_c") is not None else "-",
            _gpu_state(g.get("health")),
        ])
    gpu_table = table(["GPU", "MODEL", "UTIL", "MEMORY", "POWER", "TEMP", "HEALTH"], rows, right=(0, 2, 5))
    sections = [gpu_table, gpu_health_text(d, now), gpu_history_text(d, now), topology_text(d)]
    return "\n".join(head) + "\n\n" + "\n\n".join(x for x in sections if x)


def _gpu_state(h: Mapping[str, Any] | None) -> str:
    """A GPU's HEALTH cell: ``healthy``, ``degraded``, ``unhealthy (fenced)``, ``unknown``."""
    if not h:
        return "unknown"
    notes = [word for word, on in (("fenced", h["fenced"]), ("simulated", h["simulated"])) if on]
    return h["state"] + (f" ({', '.join(notes)})" if notes else "")


def _check_line(c: Mapping[str, Any], now: Callable[[], float]) -> str:
    """The health-check program's last verdict in words."""
    if c["state"] == "pending":
        return "pending: no verdict yet since its agent started (nothing is placed here until it passes)"
    ran = f"ran {age(c['ran_unix_s'], now)} ago"
    if c["state"] == "ok":
        return f"ok, {ran}" + (f": {escape(c['message'])}" if c["message"] else "")
    how = "timed out" if c["exit_code"] == -1 else f"exit code {c['exit_code']}"
    return f"{c['state']} ({how}), {ran}: {escape(c['message'])}"


def health_lines(d: Mapping[str, Any], now: Callable[[], float] = time.time) -> list[str]:
    """``gptrmctl nodes NODE``'s health lines: the summary, the health-check verdict, the health drain."""
    h = d.get("health")
    if not h:
        return []
    lines = [f"health        {escape(h['summary'])}"]
    if h["check"] is not None:
        lines.append(f"health check  {_check_line(h['check'], now)}")
    if h["drained"]:
        lines.append(f"drained       by health (lifted when health comes back): {escape(h['drain_reason'] or '-')}")
    return lines


def gpu_health_text(d: Mapping[str, Any], now: Callable[[], float] = time.time) -> str:
    """Each GPU that is not simply healthy: its state, reason, evidence, since when, what brings it back, and the
    application XIDs its agent counted ("" when every GPU is healthy with none)."""
    rows = []
    for g in d["gpus"]:
        h = g.get("health") or {}
        t = (g["telemetry"] or {}).get("health") or {}
        xids = t.get("app_xid_count") or 0
        if h.get("state", "healthy") == "healthy" and not xids:
            continue
        action = {"reset": "a reset", "replace": "repair (gptrmctl gpus resume)"}.get(h.get("action", ""), "-")
        app = (f"{xids} (last xid {t.get('app_xid_last')}, {age(t.get('app_xid_unix_s'), now)} ago)" if xids
               else "-")
        rows.append([g["index"], _gpu_state(h), h.get("reason") or "-", h.get("evidence") or "-",
                     f"{age(h.get('since_unix_s'), now)} ago" if h.get("since_unix_s") else "-",
                     action if h.get("state") == "unhealthy" else "-", app])
    if not rows:
        return ""
    return "gpu health\n" + table(["GPU", "STATE", "REASON", "EVIDENCE", "SINCE", "BACK AFTER", "APP XIDS"], rows,
                                   right=(0,))


def gpu_history_text(d: Mapping[str, Any], now: Callable[[], float] = time.time) -> str:
    """The node's GPU health history, oldest first ("" when there is none)."""
    history = (d.get("health") or {}).get("history") or []
    if not history:
        return ""
    rows = [[f"{age(e['time_unix_s'], now)} ago", e["gpu_index"], e["state"], e["reason"] or "-",
             e["evidence"] or "-", e["by"] or "-"] for e in history]
    return "gpu health history\n" + table(["WHEN", "GPU", "STATE", "REASON", "EVIDENCE", "BY"], rows, right=(1,))


def event_line(d: Mapping[str, Any], now: Callable[[], float] = time.time) -> str:
    """One event of ``gptrmctl events``: sequence, age, kind, subject and message. A health event's subject is
    ``NODE:GPU`` when it names a GPU (its ``gpu_index`` field), and one about a task on a node names the task too;
    simulated faults say so."""
    fields = d.get("fields") or {}
    subject = d["node_id"] or d["task_id"]
    message = d["message"]
    if d["kind"] == "health":
        if d["node_id"] and fields.get("gpu_index"):
            subject = f"{d['node_id']}:{fields['gpu_index']}"
        if d["node_id"] and d["task_id"]:
            message = f"{message} (task {d['task_id']})"
        if fields.get("simulated", "").lower() == "true":
            message = f"{message} [simulated]"
    return f"{d['seq']:>6}  {age(d['time_unix_s'], now):>4}  {d['kind']:<11} {escape(subject):<16} {escape(message)}"


def topology_text(d: Mapping[str, Any]) -> str:
    """The GPU topology as ``nvidia-smi topo -m`` shows it, with each GPU's NUMA node and CPUs ("" unknown)."""
    matrix = d.get("topology")
    gpus = d["gpus"]
    if not matrix and not any(g.get("numa_node") is not None or g.get("cpu_list") for g in gpus):
        return ""
    names = [f"GPU{g['index']}" for g in sorted(gpus, key=lambda g: g["index"])]
    ordered = sorted(gpus, key=lambda g: g["index"])
    rows = []
    for k, g in enumerate(ordered):
        links = matrix[k] if matrix else ["?"] * len(ordered)
        numa = "-" if g.get("numa_node") is None else g["numa_node"]
        rows.append([names[k], *links, numa, g.get("cpu_list") or "-"])
    legend = ("X = self, NV# = # NVLinks, PIX = same PCIe switch, NODE = same socket (host bridge), "
              "SYS = across sockets, ? = unknown")
    return "topology\n" + table(["", *names, "NUMA", "CPUS"], rows) + "\n" + legend


def _placement(t: Mapping[str, Any]) -> str:
    return ",".join(f"{a['node_id']}:{'+'.join(map(str, a['gpu_indices']))}" for a in t["allocation"]) or "-"


def tasks_table(docs: Sequence[Mapping[str, Any]], *, wide: bool = False,
                now: Callable[[], float] = time.time) -> str:
    """``gptrmctl tasks`` (``-o wide`` adds kind, demand, exit code, restarts, preemptions and the whole reason)."""
    headers = ["TASK", "NAME", "USER", "QUEUE", "STATE", "PRIO", "PLACEMENT", "AGE"]
    if wide:
        headers += ["KIND", "DEMAND", "EXIT", "RESTARTS", "PREEMPTED"]
    headers.append("REASON")
    rows = []
    for t in docs:
        state = f"{t['state']} (deadline missed)" if t.get("deadline_missed") else t["state"]
        row = [t["task_id"], truncate(t["name"], 24), truncate(t.get("submitted_by") or "-", 16),
               truncate(t.get("queue") or "default", 16), state, t["priority"], _placement(t),
               age(t["submit_unix_s"], now)]
        reason = lead_with_cause(t["reason"])
        if wide:
            row += [t["kind"], demand_text(t["demand"]), "-" if t["exit_code"] is None else t["exit_code"],
                    t["restarts"], t.get("preemptions", 0)]
        row.append(reason if wide else truncate_words(reason, REASON_WIDTH))
        rows.append(row)
    return table(headers, rows, right=(5, 7))


def task_detail(d: Mapping[str, Any], now: Callable[[], float] = time.time) -> str:
    """``gptrmctl tasks TASK``."""
    reason = lead_with_cause(d["reason"])
    history = " → ".join(f"{h['state']} ({age(h['time_unix_s'], now)} ago)" for h in d["history"])
    lines = [
        f"task          {escape(d['task_id'])} ({escape(d['name'])})",
        f"state         {d['state']}" + (" (deadline missed)" if d.get("deadline_missed") else "")
        + (f": {escape(reason)}" if reason else ""),
        f"kind          {d['kind']}" + (" (profiled as inference)" if d["kind"] == "unspecified" else "")
        + f"  priority {d['priority']}",
        f"submitted     {age(d['submit_unix_s'], now)} ago"
        + (f" by {escape(d['submitted_by'])}" if d.get("submitted_by") else ""),
        f"queue         {escape(d.get('queue', 'default'))}"
        + (f" ({d['borrowed_gpus']} GPU(s) borrowed from others' idle quota)" if d.get("borrowed_gpus") else ""),
        f"demand        {demand_text(d['demand'])}",
        "placement     " + (", ".join(f"{escape(a['node_id'])} GPUs {', '.join(map(str, a['gpu_indices']))}"
                                      for a in d["allocation"]) or "-"),
        f"exit code     {d['exit_code'] if d['exit_code'] is not None else '-'}",
        f"restarts      {d['restarts']}  preemptions {d.get('preemptions', 0)}",
        f"energy        {d['energy_j'] / 3.6e6:.4f} kWh" + ("" if d["state"] in _FINAL else " so far"),
        f"command       {escape(' '.join(d['spec']['argv']))}",
        "history       " + (history or "-"),
    ]
    if d.get("time_limit_s") or d.get("min_runtime_s"):
        from coordinator.run_limits import fmt_s

        limits = [f"time limit {fmt_s(d['time_limit_s'])}" if d.get("time_limit_s") else "",
                  f"protected for its first {fmt_s(d['min_runtime_s'])}" if d.get("min_runtime_s") else "",
                  "reached: stopping" if d.get("timed_out") and d["state"] not in _FINAL else ""]
        lines.append("limits        " + ", ".join(x for x in limits if x))
    if d.get("gpu_fault_moves"):
        lines.append(f"gpu faults    moved {d['gpu_fault_moves']} time(s) off a GPU that turned unhealthy "
                     "(not counted as restarts)")
    if d.get("app_xids"):
        lines.append("app xids      " + ", ".join(
            f"xid {x['xid']} on {escape(x['node_id'])} GPU {x['gpu_index']} ({age(x['time_unix_s'], now)} ago)"
            for x in d["app_xids"]) + " (the task's own fault: the GPUs stay in service)")
    if d.get("qos_reading") is not None:
        lines.append(f"qos           {escape(qos_line(d['qos_reading']))}")
    lines += workflow_lines(d)
    if d.get("elastic") is not None:
        lines += elastic_lines(d["elastic"], now)
    if d.get("parts"):
        if d.get("master_port"):
            lines.append(f"rendezvous    port {d['master_port']} on rank 0")
        rows = [[p["rank"], p["node_id"], p["state"], "-" if p["exit_code"] is None else p["exit_code"],
                 p["reason"] or "-"] for p in d["parts"]]
        lines += ["parts:", table(["RANK", "NODE", "STATE", "EXIT", "REASON"], rows, right=(0, 3))]
    if d["log_tail"]:
        lines += ["log tail:", escape(d["log_tail"].rstrip(), keep_newlines=True)]
    return "\n".join(lines)


def workflow_lines(d: Mapping[str, Any]) -> list[str]:
    """A task's array, dependencies and start time (``gptrmctl tasks TASK``)."""
    spec, lines = d["spec"], []
    if d.get("array_id"):
        a = spec.get("array") or {}
        cap = f", at most {a['max_running']} running at once" if a.get("max_running") else ""
        lines.append(f"array         element {d['array_index']} of {escape(d['array_id'])} "
                     f"({a.get('first', 0)}-{a.get('last', 0)}:{a.get('step') or 1}{cap})")
    for dep in spec.get("after") or []:
        lines.append(f"after         {dep['kind']}:{escape(','.join(dep['ids']))}"
                     + ("  (kept pending if it can no longer be met)" if spec.get("keep_unmet") else ""))
    if spec.get("begin_unix_s"):
        lines.append(f"begins        {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(spec['begin_unix_s']))}")
    return lines


def collapse_arrays(docs: Sequence[Mapping[str, Any]], arrays: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Task documents for ``gptrmctl tasks``: each array as one row (at its first element's place) whose state is
    its elements' counts by state (``tasks ARRAY`` lists them)."""
    summaries = {a["array_id"]: a for a in arrays}
    out: list[dict[str, Any]] = []
    for d in docs:
        array_id = d.get("array_id")
        if not array_id:
            out.append(dict(d))
            continue
        summary = summaries.pop(array_id, None)
        if summary is None:
            continue   # a later element of an array already shown
        states = ", ".join(f"{n} {state}" for state, n in sorted(summary["states"].items(), key=lambda kv: -kv[1]))
        cap = f" %{summary['max_running']}" if summary["max_running"] else ""
        out.append({**d, "task_id": array_id, "state": states, "allocation": [], "deadline_missed": False,
                    "reason": f"array of {summary['elements']}{cap}; see gptrmctl tasks {array_id}",
                    "exit_code": None})
    return out


def elastic_lines(e: Mapping[str, Any], now: Callable[[], float] = time.time) -> list[str]:
    """An elastic task's range, size, resizes and learned curve (``gptrmctl tasks TASK``)."""
    size = f"{e['gpus']} GPU(s) now" if e["gpus"] else "none held now"
    lines = [f"elastic       {e['min_gpus']}:{e['max_gpus']} GPUs, {size}, next placement aims at {e['target_gpus']}",
             f"resizes       {e['resizes']}" + (f", last {age(e['last_resize_unix_s'], now)} ago: "
                                                f"{escape(e['resize_reason'])}" if e["last_resize_unix_s"] else "")
             + (f"  (restart cost {e['restart_cost_s']:.0f} s measured)" if e.get("restart_cost_s") else "")]
    if e.get("interval_s"):
        nxt = e.get("next_resize_unix_s")
        when = f", next one possible in {fmt_duration(nxt - now())}" if nxt and nxt > now() else ""
        lines.append(f"interval      at most one resize per {e['interval_s']:g} s{when}")
    if e["gpus"] and e["gpus"] < e["max_gpus"]:
        lines.append("growing       " + (f"blocked: {escape(e['grow_blocked'])}" if e.get("grow_blocked") else
                                         "nothing blocks it (it grows when idle GPUs are worth a restart)"))
    unit = escape(e["throughput_counter"]) + "/s" if e["throughput_counter"] else "busy GPUs"
    if e["curve"]:
        lines.append("speed-up      " + ", ".join(f"{p['gpus']} GPU(s) {p['throughput']:.4g} {unit} "
                                                  f"(×{p['speedup']:.2f})" for p in e["curve"]))
    else:
        lines.append("speed-up      not measured yet")
    return lines


def qos_line(reading: dict[str, Any] | None) -> str:
    """A task's QoS reading in one line: ``p95 230 ms, ttft p95 41 ms, 1200 tok/s, 3 running, 0 waiting (30 s)``."""
    if reading is None:
        return "-"
    if reading.get("metrics_unavailable"):
        return f"metrics unavailable: {reading['metrics_unavailable']}"
    latencies = (("latency_p95_s", "p95"), ("ttft_p95_s", "ttft p95"))
    parts = [f"{label} {reading[key] * 1000:.0f} ms" for key, label in latencies if reading.get(key) is not None]
    if reading.get("tokens_per_s") is not None:
        parts.append(f"{reading['tokens_per_s']:.0f} tok/s")
    queue = (("requests_running", "running"), ("requests_waiting", "waiting"))
    parts += [f"{reading[key]:.0f} {label}" for key, label in queue if reading.get(key) is not None]
    return (", ".join(parts) or "no requests yet") + f" (over {reading.get('window_s') or 0:.0f} s)"


def _qos_text(reading: Mapping[str, Any] | None) -> str:
    if not reading:
        return "-"
    parts = []
    if reading.get("latency_p95_s") is not None:
        parts.append(f"p95 {reading['latency_p95_s'] * 1000:.0f} ms")
    if reading.get("tokens_per_s") is not None:
        parts.append(f"{reading['tokens_per_s']:.0f} tok/s")
    load = (reading.get("requests_running") or 0) + (reading.get("requests_waiting") or 0)
    if reading.get("requests_running") is not None or reading.get("requests_waiting") is not None:
        parts.append(f"load {load:g}")
    if reading.get("metrics_unavailable"):
        parts.append(f"metrics unavailable: {truncate(reading['metrics_unavailable'], 40)}")
    return ", ".join(parts) or "-"


def _maybe(x: float | None, fmt: str = ".3g") -> str:
    return "n/a" if x is None else format(x, fmt)


def service_detail(d: Mapping[str, Any], now: Callable[[], float] = time.time) -> str:
    """``gptrmctl tasks SERVICE``: the count and why, the forecast and its error, each replica."""
    target = d["target"]
    lines = [
        f"service       {escape(d['service_id'])} ({escape(d['name'])})",
        f"replicas      {d['desired']} desired ({d['min_replicas']}..{d['max_replicas']}"
        + (", cancelled)" if d.get("stopped") else ", pinned by an admin)" if d["pinned"] else ", autoscaled)"),
        f"target        {target['signal']} {target['value']:g}   now {_maybe(d['signal'])}   "
        f"load {_maybe(d['load'])}",
        f"forecast      load {_maybe(d['forecast_load'])} within {d['lead_time_s']:.0f} s "
        f"({d['forecast_model']}) → {d['forecast_replicas']} replica(s); MAPE last day "
        + ("n/a" if d["forecast_mape"] is None else f"{d['forecast_mape']:.1f} %"),
        f"reason        {escape(d['reason'])}",
    ]
    if d["decisions"]:
        lines.append("decisions")
        for dec in d["decisions"][:5]:
            lines.append(f"  {age(dec.get('time_unix_s', 0), now):>4} ago  {dec.get('from_replicas', 0)} → "
                         f"{dec.get('to_replicas', 0)}  {escape(truncate_words(dec.get('reason', ''), 100))}")
    rows = [[r["replica"], r["task_id"], r["state"], escape(r["node"] or "-"), _qos_text(r["qos_reading"])]
            for r in d["replicas"]]
    lines.append(table(["REPLICA", "TASK", "STATE", "NODE", "QOS"], rows, right=(0,)) if rows else "no replicas")
    return "\n".join(lines)
