"""gptrmctl output: stable JSON documents and aligned human tables with units."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict

from common.pb.gptrm.v1 import admin_pb2, types_pb2

__all__ = ["dump_json", "event_dict", "fmt_bytes", "node_dict", "status_dict", "table", "task_dict"]

GIB = 1024**3


def enum_label(enum_type: Any, value: int) -> str:
    """``TASK_STATE_RUNNING`` → ``running``; ``NODE_STATE_NOT_READY`` → ``not-ready``."""
    name = enum_type.Name(value) if value in enum_type.values() else str(value)
    prefix = {types_pb2.TaskState: "TASK_STATE_", types_pb2.NodeState: "NODE_STATE_",
              types_pb2.TaskKind: "TASK_KIND_", admin_pb2.EventKind: "EVENT_KIND_"}.get(enum_type, "")
    name = name.removeprefix(prefix).lower()
    return name.replace("_", "-") if enum_type is not types_pb2.TaskState else name


def fmt_bytes(n: float) -> str:
    """Human size with binary units."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def dump_json(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True)


def status_dict(s: admin_pb2.ClusterStatus) -> dict[str, Any]:
    o = s.objectives
    return {
        "coordinator_id": s.coordinator_id,
        "is_leader": s.is_leader,
        "leader_id": s.leader_id,
        "leader_address": s.leader_address,
        "leader_epoch": s.leader_epoch,
        "uptime_s": round(s.uptime_s, 3),
        "version": s.version,
        "stale": s.stale,
        "nodes_by_state": {c.key: c.count for c in s.nodes_by_state},
        "tasks_by_state": {c.key: c.count for c in s.tasks_by_state},
        "gpus_total": s.gpus_total,
        "gpus_allocated": s.gpus_allocated,
        "objectives": {
            "util_mean": o.util_mean, "util_std": o.util_std, "power_w": o.power_w,
            "gpu_mem_util": o.gpu_mem_util, "energy_j": o.energy_j,
        },
        "policy": {"name": s.policy.name, "threshold": s.policy.threshold},
        "insecure": s.insecure,
        "auth": s.auth,
    }


def _gpu_dict(g: types_pb2.GpuInfo, sample: types_pb2.GpuSample | None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "index": g.index, "uuid": g.uuid, "model": g.model, "mem_total_bytes": g.mem_total_bytes,
        "power_limit_w": g.power_limit_w, "power_min_w": g.power_min_w, "power_max_w": g.power_max_w,
    }
    if sample is not None:
        d["telemetry"] = MessageToDict(sample, preserving_proto_field_name=True)
    return d


def node_dict(v: admin_pb2.NodeView) -> dict[str, Any]:
    inv = v.record.inventory
    samples = {g.index: g for g in v.latest.gpus} if v.has_latest else {}
    return {
        "node_id": inv.node_id,
        "hostname": inv.hostname,
        "state": enum_label(types_pb2.NodeState, v.state),
        "simulated": inv.simulated,
        "gpu_backend": inv.gpu_backend,
        "agent_version": inv.agent_version,
        "cordoned": v.record.cordoned,
        "draining": v.record.draining,
        "cpu_cores": inv.cpu_cores,
        "mem_total_bytes": inv.mem_total_bytes,
        "disk_total_bytes": inv.disk_total_bytes,
        "labels": dict(inv.labels),
        "gpus": [_gpu_dict(g, samples.get(g.index)) for g in inv.gpus],
        "host": MessageToDict(v.latest.host, preserving_proto_field_name=True) if v.has_latest else None,
        "last_seen_age_s": round(v.last_seen_age_s, 3),
        "task_ids": list(v.task_ids),
        "allocations": [MessageToDict(a, preserving_proto_field_name=True) for a in v.allocations],
        "dropped_samples_total": v.dropped_samples_total,
        "power_curve": (
            {"idle_w": v.power_curve.idle_w, "max_w": v.power_curve.max_w, "source": v.power_curve.source,
             "samples": v.power_curve.samples}
            if v.HasField("power_curve") else None
        ),
    }


def task_dict(t: types_pb2.Task) -> dict[str, Any]:
    spec = MessageToDict(t.spec, preserving_proto_field_name=True)
    return {
        "task_id": t.id,
        "name": t.spec.name,
        "state": enum_label(types_pb2.TaskState, t.state),
        "reason": t.reason,
        "kind": enum_label(types_pb2.TaskKind, t.spec.kind) if t.spec.kind else "",
        "priority": t.spec.priority,
        "submit_unix_s": t.submit_unix_s,
        "demand": MessageToDict(t.demand, preserving_proto_field_name=True),
        "allocation": [
            {"node_id": n.node_id, "gpu_indices": list(n.gpu_indices), "gpu_share": n.gpu_share}
            for n in t.allocation.nodes
        ],
        "exit_code": t.exit_code if t.has_exit_code else None,
        "log_tail": t.log_tail,
        "restarts": t.restarts,
        "pids": list(t.pids),
        "history": [
            {"state": enum_label(types_pb2.TaskState, h.state), "time_unix_s": h.time_unix_s, "reason": h.reason}
            for h in t.history
        ],
        "spec": spec,
    }


def event_dict(e: admin_pb2.Event) -> dict[str, Any]:
    return {
        "seq": e.seq, "time_unix_s": e.time_unix_s, "kind": enum_label(admin_pb2.EventKind, e.kind),
        "node_id": e.node_id, "task_id": e.task_id, "message": e.message, "fields": dict(e.fields),
    }


def age(unix_s: float) -> str:
    """Seconds since ``unix_s`` as 12s / 5m / 3h / 2d."""
    if not unix_s:
        return "-"
    d = max(0.0, time.time() - unix_s)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if d >= size:
            return f"{d / size:.0f}{unit}"
    return f"{d:.0f}s"
