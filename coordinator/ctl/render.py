"""gptrmctl's JSON documents, one builder per kind (schemas in ``schemas/``; human text in ``human.py``)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from common.topology import format_cpu_list, link_code
from common.types import DEFAULT_THRESHOLD_MODE, TERMINAL_STATES
from coordinator.ctl.jsondoc import enum_label, proto_dict
from coordinator.elastic.spec import curve_of, elastic_gpus, elastic_range
from coordinator.power_states import power_label

__all__ = ["dump_json", "enum_label", "event_dict", "gpu_health", "health_summary", "log_chunk_dict", "node_dict",
           "policy_dict", "status_dict", "task_dict"]

_GPU_STATE = types_pb2.GpuHealthState
_CHECK = types_pb2.HealthCheckState


def finite(doc: Any) -> Any:
    """``doc`` with every NaN or infinite float replaced by None (JSON has no NaN)."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [finite(v) for v in doc]
    return doc


def dump_json(doc: Any, *, indent: int | None = 2) -> str:
    """One document with sorted keys, always valid JSON (non-finite numbers are null)."""
    return json.dumps(finite(doc), indent=indent, sort_keys=True, allow_nan=False)


def status_dict(s: admin_pb2.ClusterStatus) -> dict[str, Any]:
    """The ``status`` document (schema ``status.json``)."""
    return {
        "coordinator_id": s.coordinator_id,
        "is_leader": s.is_leader,
        "leader_id": s.leader_id,
        "leader_address": s.leader_address,
        "leader_epoch": s.leader_epoch,
        "uptime_s": s.uptime_s,
        "version": s.version,
        "stale": s.stale,
        "nodes_by_state": {c.key: c.count for c in s.nodes_by_state},
        "tasks_by_state": {c.key: c.count for c in s.tasks_by_state},
        "gpus_total": s.gpus_total,
        "gpus_allocated": s.gpus_allocated,
        "objectives": proto_dict(s.objectives),
        "policy": policy_dict(s.policy),
        "insecure": s.insecure,
        "auth": s.auth,
        "quarantined_keys": list(s.quarantined_keys),
        "telemetry_rejected_total": s.telemetry_rejected_total,
        "leader_duties": [{"name": d.name, "state": d.state, "failures": d.failures,
                           "last_pass_age_s": d.last_pass_age_s if d.has_last_pass else None,
                           "last_error": d.last_error} for d in s.leader_duties],
        "telemetry_rate": proto_dict(s.telemetry_rate),
    }


def _gpu_dict(g: types_pb2.GpuInfo, sample: types_pb2.GpuSample | None,
              health: dict[str, Any] | None) -> dict[str, Any]:
    doc = proto_dict(g)
    del doc["numa_node_plus_one"]   # shown as numa_node, null when unknown
    for link, raw in zip(doc["links"], g.links, strict=True):
        link["code"] = link_code(raw.level, raw.nvlinks)
    return {**doc, "numa_node": g.numa_node_plus_one - 1 if g.numa_node_plus_one else None,
            "cpu_list": format_cpu_list(g.cpu_affinity),
            "telemetry": proto_dict(sample) if sample is not None else None,
            "health": health if health is not None else _UNKNOWN_GPU}


_UNKNOWN_GPU: dict[str, Any] = {"state": "unknown", "reason": "", "evidence": "", "since_unix_s": None,
                                "action": "none", "simulated": False, "fenced": False}


def gpu_health(v: admin_pb2.NodeView) -> dict[int, dict[str, Any]]:
    """Each GPU's health as the cluster treats it, by index: the leader's fence (``NodeRecord.gpu_fences``: out of
    service, whatever the agent says now) over the agent's latest classification (``GpuSample.health``), over an
    older agent's ``healthy`` flag. ``state`` is healthy, degraded, unhealthy, or unknown (no sample yet)."""
    out: dict[int, dict[str, Any]] = {}
    if v.has_latest:
        for s in v.latest.gpus:
            h = s.health
            if h.state != _GPU_STATE.GPU_HEALTH_STATE_UNSPECIFIED:
                out[s.index] = {"state": enum_label(_GPU_STATE, h.state), "reason": h.reason, "evidence": h.evidence,
                                "since_unix_s": h.since_unix_s or None,
                                "action": enum_label(types_pb2.GpuHealthAction, h.action), "simulated": h.simulated,
                                "fenced": False}
            else:   # an agent that only says healthy or not
                out[s.index] = {**_UNKNOWN_GPU, "state": "healthy" if s.healthy else "unhealthy",
                                "reason": "" if s.healthy else s.health_reason}
    for f in v.record.gpu_fences:
        out[f.gpu_index] = {"state": "unhealthy", "reason": f.reason, "evidence": f.evidence,
                            "since_unix_s": f.since_unix_s or None,
                            "action": enum_label(types_pb2.GpuHealthAction, f.action), "simulated": f.simulated,
                            "fenced": True}
    return out


def _gpus_text(gpus: list[tuple[int, dict[str, Any]]], word: str) -> str:
    """``GPU 3 unhealthy: xid 79`` for one GPU, ``2 GPUs unhealthy (1, 3)`` for several; simulated ones say so."""
    if len(gpus) == 1:
        index, h = gpus[0]
        sim = " (simulated)" if h["simulated"] else ""
        return f"GPU {index} {word}" + (f": {h['reason']}" if h["reason"] else "") + sim
    sim = " (simulated)" if all(h["simulated"] for _, h in gpus) else ""
    return f"{len(gpus)} GPUs {word} ({', '.join(str(i) for i, _ in gpus)}){sim}"


def health_summary(v: admin_pb2.NodeView, gpus: dict[int, dict[str, Any]] | None = None) -> str:
    """A node's health in a few words (``gptrmctl nodes``' HEALTH column), the causes joined by "; " in this order
    (short and per GPU first, so a cut cell keeps them): ``GPU 3 unhealthy: xid 79`` (or ``2 GPUs unhealthy (1,
    3)``), ``drained: REASON`` (drained by health) or else ``check failed: MESSAGE``, ``check pending`` (the
    health-check program has not answered yet since its agent started: nothing is placed there), ``GPU 1 degraded:
    thermal slowdown``; else ``ok``, or ``unknown`` before any sample.

    :param gpus: :func:`gpu_health` of ``v``, when already computed.
    """
    gpus = gpu_health(v) if gpus is None else gpus
    check = v.latest.health_check if v.has_latest else types_pb2.NodeHealthCheck()
    parts = []
    for word in ("unhealthy", "degraded"):
        found = sorted((i, h) for i, h in gpus.items() if h["state"] == word)
        if found:
            parts.append(_gpus_text(found, word))
        if word == "unhealthy":   # the node-wide causes come after the unhealthy GPUs (short) and before degraded
            if v.record.health_drained:
                parts.append(f"drained: {v.record.health_drain_reason or 'health'}")
            elif check.state == _CHECK.HEALTH_CHECK_STATE_FAILED:
                parts.append(f"check failed: {check.message or f'exit code {check.exit_code}'}")
            if check.state == _CHECK.HEALTH_CHECK_STATE_PENDING:
                parts.append("check pending")
    if parts:
        return "; ".join(parts)
    return "ok" if v.has_latest or v.record.gpu_fences else "unknown"


def node_health_dict(v: admin_pb2.NodeView, gpus: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The node's ``health`` document: the summary, the health-check program's last verdict (null: none
    configured, or no sample yet), the health drain, the fences and the GPU health history (newest last)."""
    gpus = gpu_health(v) if gpus is None else gpus
    check = v.latest.health_check if v.has_latest else None
    return {
        "summary": health_summary(v, gpus),
        "check": proto_dict(check) if check is not None and check.state != _CHECK.HEALTH_CHECK_STATE_UNSPECIFIED
        else None,
        "drained": v.record.health_drained,
        "drain_reason": v.record.health_drain_reason,
        "fences": [proto_dict(f) for f in v.record.gpu_fences],
        "history": [proto_dict(e) for e in v.record.gpu_health_history],
    }


def topology_matrix(gpus: list[types_pb2.GpuInfo]) -> list[list[str]] | None:
    """``nvidia-smi topo -m``'s GPU matrix: ``X`` on the diagonal, ``NV#``, ``PIX``, ``NODE``, ``SYS``, ``?``.

    :returns: one row per GPU in index order, or None when the agent reported no link.
    """
    if not any(g.links for g in gpus):
        return None
    ordered = sorted(gpus, key=lambda g: g.index)
    position = {g.index: k for k, g in enumerate(ordered)}
    rows = [["?"] * len(ordered) for _ in ordered]
    for k, g in enumerate(ordered):
        rows[k][k] = "X"
        for link in g.links:
            if link.peer_index in position and link.peer_index != g.index:
                rows[k][position[link.peer_index]] = link_code(link.level, link.nvlinks)
    return rows


def node_dict(v: admin_pb2.NodeView) -> dict[str, Any]:
    """One node's document (schema ``node.json``)."""
    inv = v.record.inventory
    samples = {g.index: g for g in v.latest.gpus} if v.has_latest else {}
    health = gpu_health(v)
    return {
        "node_id": inv.node_id,
        "hostname": inv.hostname,
        "state": enum_label(types_pb2.NodeState, v.state),
        "simulated": inv.simulated,
        "host_simulated": inv.host_simulated,
        "gpu_backend": inv.gpu_backend,
        "agent_version": inv.agent_version,
        "cordoned": v.record.cordoned,
        "draining": v.record.draining,
        "power_state": power_label(v.record.power_state),
        "power_reason": v.record.power_reason,
        "cpu_cores": inv.cpu_cores,
        "mem_total_bytes": inv.mem_total_bytes,
        "disk_total_bytes": inv.disk_total_bytes,
        "labels": dict(inv.labels),
        "reserved": proto_dict(v.record.reserved),
        "gpus": [_gpu_dict(g, samples.get(g.index), health.get(g.index)) for g in inv.gpus],
        "health": node_health_dict(v, health),
        "topology": topology_matrix(list(inv.gpus)),
        "host": proto_dict(v.latest.host) if v.has_latest else None,
        "telemetry_unix_s": v.latest.time_unix_s if v.has_latest else None,
        "last_seen_age_s": v.last_seen_age_s,
        "task_ids": list(v.task_ids),
        "allocations": [proto_dict(a) for a in v.allocations],
        "dropped_samples_total": v.dropped_samples_total,
        "power_curve": proto_dict(v.power_curve) if v.HasField("power_curve") else None,
        "advertise_address": inv.advertise_address,
        "task_port_min": inv.task_port_min,
        "task_port_max": inv.task_port_max,
        # The room its agent last reported (docs/ports.md); null: not reported (no limit).
        "task_uid_room": v.latest.task_uid_room if v.has_latest and v.latest.HasField("task_uid_room") else None,
        "task_ports_free": v.latest.task_ports_free if v.has_latest and v.latest.HasField("task_ports_free") else None,
    }


def task_dict(t: types_pb2.Task, now: Callable[[], float] = time.time) -> dict[str, Any]:
    """One task's document (schema ``task.json``); ``deadline_missed``: it has a deadline and ended after
    it, or is still unfinished past it."""
    deadline = t.spec.qos.deadline_unix_s
    ended = t.state in TERMINAL_STATES
    missed = bool(deadline) and ((ended and bool(t.history) and t.history[-1].time_unix_s > deadline)
                                 or (not ended and now() > deadline))
    return {
        "task_id": t.id,
        "name": t.spec.name,
        "state": enum_label(types_pb2.TaskState, t.state),
        "reason": t.reason,
        "kind": enum_label(types_pb2.TaskKind, t.spec.kind),
        "priority": t.spec.priority,
        "submit_unix_s": t.submit_unix_s,
        "demand": proto_dict(t.demand),
        "allocation": [proto_dict(n) for n in t.allocation.nodes],
        "exit_code": t.exit_code if t.has_exit_code else None,
        "log_tail": t.log_tail,
        "restarts": t.restarts,
        "preemptions": t.preemptions,
        "deadline_missed": missed,
        "pids": list(t.pids),
        "history": [proto_dict(h) for h in t.history],
        "spec": proto_dict(t.spec),
        "qos_reading": proto_dict(t.qos_reading) if t.HasField("qos_reading") else None,
        "energy_j": t.energy_j,
        "master_port": t.allocation.master_port,
        "parts": [part_dict(p) for p in t.parts],
        "queue": t.queue or "default",
        "submitted_by": t.submitted_by,
        "borrowed_gpus": t.borrowed_gpus,
        "elastic": elastic_dict(t),
        "gpu_fault_moves": t.gpu_fault_moves,
        "app_xids": [proto_dict(x) for x in t.app_xids],
        "array_id": t.array_id or None,
        "array_index": t.array_index if t.array_id else None,
        "time_limit_s": t.spec.time_limit_s or None,
        "min_runtime_s": t.spec.min_runtime_s or None,
        "timed_out": t.timed_out,
    }


def array_summaries(docs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One summary per array among task documents (schema ``tasks.json``, ``arrays``), in the order their first
    element comes: its name, element count and counts by state."""
    return list(count_arrays(docs, {}).values())


def count_arrays(docs: Iterable[Mapping[str, Any]], out: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Add ``docs``' array elements to the summaries ``out`` holds by array id (as :func:`array_summaries` makes
    them), so that a listing read page by page is summed up as it goes; returns ``out``."""
    for d in docs:
        array_id = d.get("array_id")
        if not array_id:
            continue
        summary = out.setdefault(array_id, {"array_id": array_id, "name": d["name"], "elements": 0, "states": {},
                                            "max_running": d["spec"].get("array", {}).get("max_running", 0)})
        summary["elements"] += 1
        summary["states"][d["state"]] = summary["states"].get(d["state"], 0) + 1
    return out


def elastic_dict(t: types_pb2.Task) -> dict[str, Any] | None:
    """An elastic task's range, size, resizes and learned curve (None for a task of fixed size)."""
    if not t.spec.HasField("elastic"):
        return None
    rng = elastic_range(t.spec)
    assert rng is not None
    e = t.elastic
    curve = curve_of(t)
    return {
        "min_gpus": rng.minimum, "max_gpus": rng.maximum,
        "gpus": elastic_gpus(t),
        "target_gpus": e.target_gpus or rng.maximum,
        "interval_s": e.interval_s or None,
        "next_resize_unix_s": e.last_resize_unix_s + e.interval_s if e.last_resize_unix_s and e.interval_s else None,
        "grow_blocked": e.grow_blocked,
        "resizes": e.resizes, "resize_reason": e.resize_reason,
        "last_resize_unix_s": e.last_resize_unix_s or None,
        "restart_cost_s": e.restart_cost_s or None,
        "throughput_counter": t.spec.elastic.throughput_counter,
        "curve": [{"gpus": n, "throughput": tp, "speedup": curve.speedup(n)} for n, tp in curve.points],
        "history": [proto_dict(h) for h in e.history],
    }


def part_dict(p: types_pb2.TaskPart) -> dict[str, Any]:
    """One node's part of a task: its node, rank, state as its agent reported it, and exit code."""
    return {"node_id": p.node_id, "rank": p.rank, "state": enum_label(types_pb2.TaskState, p.state),
            "exit_code": p.exit_code if p.has_exit_code else None, "reason": p.reason}


def _num(x: float) -> float | None:
    return None if x != x else x   # NaN (unknown) → null


def service_dict(v: admin_pb2.ServiceView) -> dict[str, Any]:
    """One service with its replicas, forecast and decisions (``gptrmctl tasks SERVICE``)."""
    s = v.service
    target = ({"signal": "gpu_util", "value": s.spec.service.target_util} if s.spec.service.target_util else
              {"signal": "p95_latency_ms", "value": s.spec.qos.max_latency_ms} if s.spec.qos.max_latency_ms else
              {"signal": "tokens_per_s", "value": s.spec.qos.min_tokens_per_s})
    replicas = []
    for t in v.replicas:
        replicas.append({
            "task_id": t.id, "replica": t.replica_index, "state": enum_label(types_pb2.TaskState, t.state),
            "node": t.allocation.nodes[0].node_id if t.allocation.nodes else "",
            "reason": t.reason,
            "qos_reading": proto_dict(t.qos_reading) if t.HasField("qos_reading") else None,
        })
    return {
        "service_id": s.id, "name": s.spec.name, "min_replicas": s.spec.service.min_replicas,
        "max_replicas": s.spec.service.max_replicas, "target": target, "desired": s.desired, "pinned": s.pinned,
        "stopped": s.stopped, "submitted_by": s.submitted_by,
        "reason": s.reason, "signal": _num(s.signal), "load": _num(s.load), "forecast_load": _num(s.forecast_load),
        "forecast_replicas": s.forecast_replicas, "forecast_model": s.forecast_model or "none",
        "forecast_mape": _num(s.forecast_mape), "lead_time_s": s.lead_time_s,
        "decisions": [proto_dict(d) for d in s.decisions], "replicas": replicas, "stale": v.stale,
    }


def event_dict(e: admin_pb2.Event) -> dict[str, Any]:
    """One event (schema ``event.json``)."""
    return {
        "seq": e.seq, "time_unix_s": e.time_unix_s, "kind": enum_label(admin_pb2.EventKind, e.kind),
        "node_id": e.node_id, "task_id": e.task_id, "message": e.message, "fields": dict(e.fields),
    }


def policy_dict(p: types_pb2.Policy) -> dict[str, Any]:
    """The policy document (schema ``policy.json``)."""
    return {"name": p.name, "threshold": p.threshold, "threshold_mode": p.threshold_mode or DEFAULT_THRESHOLD_MODE}


def log_chunk_dict(c: admin_pb2.TaskLogChunk) -> dict[str, Any]:
    """One chunk of a task's output (schema ``log_chunk.json``); ``text`` is UTF-8 with invalid
    bytes replaced (U+FFFD); chunks end after a newline where the agent could cut there."""
    return {"task_id": c.task_id, "node_id": c.node_id, "seq": c.seq,
            "text": c.data.decode("utf-8", errors="replace")}
