"""GPU health rules: pure functions on the protobuf messages (no I/O, no clock of their own).

Each rule is written once here and used by the leader's watch (:mod:`coordinator.health.watch`), the
snapshot, the pending reasons, ResumeGpus and the metric.

* :func:`effective` reads one GPU's health from a sample; an older agent's sample (state UNSPECIFIED)
  with ``healthy=false`` counts as UNHEALTHY with action REPLACE and its ``health_reason``.
* :func:`apply_reports` brings a node record in line with what the agent reports: an UNHEALTHY GPU gets a
  :class:`GpuFence` (unless an admin resumed that very episode, see :func:`resumed_at`); a RESET fence is
  lifted when the GPU is reported HEALTHY or DEGRADED again; a REPLACE fence stays until
  :func:`apply_resume`. Every change is appended to ``gpu_health_history`` (at most :data:`HISTORY_MAX`).
* :func:`drain_cause` and :func:`apply_drain`: the node itself at fault (≥ ``drain_gpus`` fences, or the
  site's health check FAILED) sets ``health_drained``; it is lifted when the cause goes away. An admin's
  ``draining`` is a separate field and never touched here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from common.pbenum import pb_enum

__all__ = [
    "AGENT", "APP_XIDS_MAX", "HISTORY_MAX", "LEADER", "Change", "add_app_xid", "apply_drain", "apply_reports",
    "apply_resume", "describe_fence", "drain_cause", "effective", "fence_of", "fenced", "health_notes", "last_state",
    "resumed_at", "state_label",
]

HISTORY_MAX = 32
"""GPU health events a node record keeps (newest last)."""
APP_XIDS_MAX = 16
"""Application XIDs a task keeps (newest last)."""
AGENT = "agent"
"""``GpuHealthEvent.by`` for a change the agent reported."""
LEADER = "leader"
"""``GpuHealthEvent.by`` for a change the leader decided (a node drained by health)."""

HEALTHY = types_pb2.GPU_HEALTH_STATE_HEALTHY
DEGRADED = types_pb2.GPU_HEALTH_STATE_DEGRADED
UNHEALTHY = types_pb2.GPU_HEALTH_STATE_UNHEALTHY
RESET = types_pb2.GPU_HEALTH_ACTION_RESET
REPLACE = types_pb2.GPU_HEALTH_ACTION_REPLACE
_LABELS = {types_pb2.GPU_HEALTH_STATE_UNSPECIFIED: "healthy", HEALTHY: "healthy", DEGRADED: "degraded",
           UNHEALTHY: "unhealthy"}
_ACTIONS = {types_pb2.GPU_HEALTH_ACTION_NONE: "none", RESET: "reset", REPLACE: "replace"}


@dataclass(frozen=True, slots=True)
class Change:
    """One health change of a node, for its event and log line.

    :param gpu: the GPU index (-1: the node as a whole).
    :param state: ``healthy``, ``degraded``, ``unhealthy``; for the node: ``drained`` or ``undrained``.
    :param reason: why (the agent's reason, or the drain's).
    :param evidence: what was read.
    :param by: ``agent``, ``leader`` or the admin's identity.
    :param action: ``reset``/``replace`` for a fence, else "".
    :param lifted: a fence was lifted.
    """

    gpu: int
    state: str
    reason: str = ""
    evidence: str = ""
    by: str = AGENT
    action: str = ""
    lifted: bool = False

    def message(self, node_id: str) -> str:
        """The event's message."""
        if self.gpu < 0:
            return f"node {node_id} {self.state} by health" + (f": {self.reason}" if self.reason else "")
        if self.lifted:
            return f"{node_id} GPU {self.gpu} back in service ({self.state}, by {self.by})"
        if self.state == "unhealthy":
            return f"{node_id} GPU {self.gpu} unhealthy: {self.reason} (fenced, {self.action})"
        return f"{node_id} GPU {self.gpu} {self.state}" + (f": {self.reason}" if self.reason else "")


def state_label(state: int) -> str:
    """``healthy``, ``degraded`` or ``unhealthy`` for a :class:`GpuHealthState` (UNSPECIFIED: healthy)."""
    return _LABELS.get(pb_enum(types_pb2.GpuHealthState, state), "healthy")


def effective(gpu: types_pb2.GpuSample) -> types_pb2.GpuHealth:
    """The GPU's health as the rules read it: the agent's classification, or for an older agent (state
    UNSPECIFIED) HEALTHY, or UNHEALTHY/REPLACE with its ``health_reason`` when it says ``healthy=false``."""
    health = gpu.health
    if health.state != types_pb2.GPU_HEALTH_STATE_UNSPECIFIED:
        return health
    if gpu.healthy:
        return types_pb2.GpuHealth(state=HEALTHY, app_xid_count=health.app_xid_count,
                                   app_xid_last=health.app_xid_last, app_xid_unix_s=health.app_xid_unix_s)
    return types_pb2.GpuHealth(state=UNHEALTHY, action=REPLACE, reason=gpu.health_reason or "unhealthy",
                               evidence="healthy=false", simulated=health.simulated)


def fenced(record: types_pb2.NodeRecord) -> dict[int, types_pb2.GpuFence]:
    """The node's fences by GPU index (the question "which GPUs of node n are fenced, and why")."""
    return {f.gpu_index: f for f in record.gpu_fences}


def fence_of(record: types_pb2.NodeRecord, index: int) -> types_pb2.GpuFence | None:
    """GPU ``index``'s fence (``reason``, ``evidence``, ``action``, ``since_unix_s``), None when in service."""
    for f in record.gpu_fences:
        if f.gpu_index == index:
            return f
    return None


def describe_fence(node_id: str, fence: types_pb2.GpuFence) -> str:
    """How refusals and pending reasons name a fenced GPU: ``n1 GPU 3 unhealthy: xid 79``."""
    return f"{node_id} GPU {fence.gpu_index} unhealthy: {fence.reason or 'fenced'}"


_NOTES_MAX = 4


def health_notes(nodes: Iterable[tuple[str, types_pb2.NodeRecord, bool]]) -> list[str]:
    """What pending reasons add about health: each fenced GPU (``n1 GPU 3 unhealthy: xid 79``), each node drained
    by health, each node whose health check has no verdict yet (``n1 health check pending``); at most a few,
    then how many more.

    :param nodes: ``(node id, record, health check pending)`` per node, in the order to name them.
    """
    notes: list[str] = []
    for node_id, record, pending in nodes:
        if pending:
            notes.append(f"{node_id} health check pending")
        if record.health_drained:
            notes.append(f"{node_id} drained by health: {record.health_drain_reason}")
        notes.extend(describe_fence(node_id, f) for f in sorted(record.gpu_fences, key=lambda f: f.gpu_index))
    if len(notes) > _NOTES_MAX:
        notes[_NOTES_MAX:] = [f"{len(notes) - _NOTES_MAX} more unhealthy GPUs or nodes"]
    return notes


def last_state(record: types_pb2.NodeRecord, index: int) -> int:
    """The GPU's state as last recorded in the node's history (HEALTHY when none is recorded)."""
    for event in reversed(record.gpu_health_history):
        if event.gpu_index == index:
            return event.state
    return HEALTHY


def resumed_at(record: types_pb2.NodeRecord, index: int) -> float:
    """When an admin last put GPU ``index`` back in service (0: never, or no longer in the history).

    An agent whose GPU stays UNHEALTHY after a resume (a lost GPU's XID stays in its state) is not fenced
    again for the episode the admin cleared: only an UNHEALTHY state that began after the resume is."""
    for event in reversed(record.gpu_health_history):
        if event.gpu_index == index:
            return event.time_unix_s if event.by not in (AGENT, LEADER) else 0.0
    return 0.0


def _history(record: types_pb2.NodeRecord, now: float, index: int, state: int, reason: str, evidence: str,
             by: str) -> None:
    record.gpu_health_history.append(types_pb2.GpuHealthEvent(
        time_unix_s=now, gpu_index=index, state=pb_enum(types_pb2.GpuHealthState, state),
        reason=reason, evidence=evidence, by=by))
    extra = len(record.gpu_health_history) - HISTORY_MAX
    if extra > 0:
        del record.gpu_health_history[:extra]


def _remove_fences(record: types_pb2.NodeRecord, indices: Iterable[int]) -> None:
    drop = set(indices)
    kept = [f for f in record.gpu_fences if f.gpu_index not in drop]
    del record.gpu_fences[:]
    record.gpu_fences.extend(kept)


def apply_reports(record: types_pb2.NodeRecord, reports: Mapping[int, types_pb2.GpuHealth], now: float, *,
                  uuids: Mapping[int, str] | None = None,
                  first_seen: Mapping[int, float] | None = None) -> list[Change]:
    """Bring ``record`` (a copy the caller owns) in line with the agent's reports; returns what changed.

    :param record: the node record, changed in place.
    :param reports: each reported GPU's :func:`effective` health by index.
    :param now: the leader's time for the history.
    :param uuids: GPU uuids by index (for the fence).
    :param first_seen: when the leader first saw each GPU unhealthy in this episode, for reports without a
        ``since_unix_s`` (an older agent): what a resume is compared with.
    """
    changes: list[Change] = []
    fences = fenced(record)
    lifted: list[int] = []
    for index in sorted(reports):
        h = reports[index]
        fence = fences.get(index)
        if h.state == UNHEALTHY:
            if fence is not None:
                if fence.action != REPLACE and h.action == REPLACE:   # worse than a reset: an admin decides now
                    fence.action, fence.reason, fence.evidence = REPLACE, h.reason, h.evidence
                    _history(record, now, index, UNHEALTHY, h.reason, h.evidence, AGENT)
                    changes.append(Change(index, "unhealthy", h.reason, h.evidence, AGENT, "replace"))
                continue
            since = h.since_unix_s or (first_seen or {}).get(index, now)
            resumed = resumed_at(record, index)
            if resumed and since <= resumed:
                continue   # the episode an admin already cleared
            action = h.action if h.action in (RESET, REPLACE) else REPLACE
            record.gpu_fences.append(types_pb2.GpuFence(
                gpu_index=index, gpu_uuid=(uuids or {}).get(index, ""), action=action, reason=h.reason,
                evidence=h.evidence, since_unix_s=h.since_unix_s or now, simulated=h.simulated))
            _history(record, now, index, UNHEALTHY, h.reason, h.evidence, AGENT)
            changes.append(Change(index, "unhealthy", h.reason, h.evidence, AGENT, _ACTIONS[action]))
            continue
        state = DEGRADED if h.state == DEGRADED else HEALTHY
        if fence is not None:
            if fence.action == RESET:
                lifted.append(index)
                _history(record, now, index, state, h.reason, h.evidence, AGENT)
                changes.append(Change(index, state_label(state), h.reason, h.evidence, AGENT, lifted=True))
            continue
        if last_state(record, index) != state:
            _history(record, now, index, state, h.reason, h.evidence, AGENT)
            changes.append(Change(index, state_label(state), h.reason, h.evidence, AGENT))
    if lifted:
        _remove_fences(record, lifted)
    return changes


def apply_resume(record: types_pb2.NodeRecord, indices: Sequence[int], by: str, now: float) -> list[Change]:
    """An admin puts fenced GPUs back in service (``indices`` empty: every fenced GPU of the node).

    :raises ValidationError: ``gpu_indices`` names a GPU the node does not have or that is not fenced (nothing
        changed), or the node has no fenced GPU at all.
    """
    fences = fenced(record)
    gpus = {g.index for g in record.inventory.gpus}
    for i in indices:
        if i not in gpus:
            raise ValidationError("gpu_indices", f"node {record.inventory.node_id} has no GPU {i}")
        if i not in fences:
            raise ValidationError("gpu_indices", f"{record.inventory.node_id} GPU {i} is not fenced")
    chosen = sorted(set(indices)) if indices else sorted(fences)
    if not chosen:
        raise ValidationError("node_id", f"node {record.inventory.node_id} has no fenced GPU")
    _remove_fences(record, chosen)
    changes = []
    for i in chosen:
        f = fences[i]
        _history(record, now, i, HEALTHY, f"resumed after {f.reason}", f.evidence, by)
        changes.append(Change(i, "healthy", f"resumed after {f.reason}", f.evidence, by, lifted=True))
    return changes


def drain_cause(record: types_pb2.NodeRecord, check: types_pb2.NodeHealthCheck | None, drain_gpus: int) -> str:
    """Why the node itself is at fault ("" when it is not): its health check FAILED (the check's message),
    or ``drain_gpus`` or more of its GPUs are fenced (0: never for that)."""
    if check is not None and check.state == types_pb2.HEALTH_CHECK_STATE_FAILED:
        return check.message or "health check failed"
    n = len(record.gpu_fences)
    if drain_gpus > 0 and n >= drain_gpus:
        return f"{n} GPUs unhealthy"
    return ""


def apply_drain(record: types_pb2.NodeRecord, cause: str) -> Change | None:
    """Set or lift the node's own health drain to match ``cause`` (an admin's ``draining`` is never touched)."""
    if cause:
        if record.health_drained and record.health_drain_reason == cause:
            return None
        record.health_drained, record.health_drain_reason = True, cause
        return Change(-1, "drained", cause, by=LEADER)
    if not record.health_drained:
        return None
    record.health_drained, record.health_drain_reason = False, ""
    return Change(-1, "undrained", "cause gone", by=LEADER)


def add_app_xid(task: types_pb2.Task, xid: types_pb2.AppXid) -> bool:
    """Append an application XID to ``task`` (a copy the caller owns; at most :data:`APP_XIDS_MAX` kept);
    False when the task already has it (the same node, GPU and time: a report seen again after a leader change)."""
    for known in task.app_xids:
        if (known.node_id, known.gpu_index, known.time_unix_s) == (xid.node_id, xid.gpu_index, xid.time_unix_s):
            return False
    task.app_xids.append(xid)
    extra = len(task.app_xids) - APP_XIDS_MAX
    if extra > 0:
        del task.app_xids[:extra]
    return True
