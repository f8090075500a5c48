"""Reservations: GPUs kept for one queue's (or some users') work during a window (docs/limits-and-reservations.md).

A reservation (``gptrmctl reservations create NAME --gpus N [--gpu-model M] [--nodes ...] --start T
--end T|--duration D --queue Q|--users U,...``) is stored in etcd (``reservations/<name>``, written by the
leader, fenced; ``coordinator/sync/reservations.py``) and so survives a leader change.

**Which GPUs.** Every scheduling cycle the leader chooses the GPUs each reservation keeps (:func:`choose_kept`),
among the known nodes it may use (its ``nodes``, its GPU model), reservations by start time: first GPUs its own
work holds, then free GPUs on nodes that are on, then free GPUs of nodes that are off (woken ahead of the start),
then GPUs others' work holds (those become its own as that work ends). A GPU is kept by one reservation at once.

**Placement.** From the moment a reservation exists until its end, others' work never lands on the GPUs it keeps
(in the cycle's snapshot they offer nothing free, :func:`blocked`); before its start nobody's does, so they are
free at the start. From its start its own work is placed on them first (:func:`keep_only` builds the snapshot
with only those GPUs free), then anywhere else its queue may go. Work already running on a GPU when a reservation
chose it is not stopped: its time limit (or its end) gives the GPU back.

**Preemption and reclaim.** A reservation's own work running on its kept GPUs during its window is never the
victim of others' preemption or of another queue's reclaim (:meth:`Reservations.shields`); preemption plans on
the snapshot the preemptor's placement sees (:meth:`Reservations.view_for`), so nothing is preempted for GPUs
its placement could not use.

**Power.** Nodes holding GPUs of a reservation that is active or starts within the Resource Adaptor's wake time
are never powered down, and are woken when off (:meth:`Reservations.nodes_needed`).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from common.errors import NotFound, ValidationError
from common.logging import get_logger
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from common.types import NodeState, TaskState
from coordinator.domain import ClusterSnapshot, GpuSlot, NodeSnapshot
from coordinator.elastic.rules import ElasticJob, Resize
from coordinator.events import EventBus

if TYPE_CHECKING:
    from coordinator.monitor.nodes import NodeRegistry
    from coordinator.sync.leadership import Leadership
    from coordinator.sync.reservations import ReservationStore

__all__ = ["Kept", "Reservations", "blocked", "choose_kept", "is_member", "keep_only", "shrinks_off", "state_of",
           "validate_reservation"]

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
"""What a reservation name must match, whole."""
MAX_GPUS = 100_000
MAX_NODES = 256
MAX_USERS = 1000
MAX_RESERVATIONS = 1000
_MAX_AHEAD_S = 10 * 365 * 86400.0
_HOLDING = (TaskState.SCHEDULED, TaskState.STARTING, TaskState.RUNNING, TaskState.PAUSED, TaskState.PREEMPTED)

GpuRef = tuple[str, int]
"""(node id, GPU index)."""


def validate_reservation(r: types_pb2.Reservation, now: float | None = None) -> None:
    """Check a reservation's fields (``now`` given: also that its window has not passed and is within ten
    years); the first problem is raised as :class:`ValidationError` naming the field."""
    if not NAME_PATTERN.fullmatch(r.name):
        raise ValidationError("name", f"{r.name[:64]!r} does not match {NAME_PATTERN.pattern}")
    if not 0 < r.gpus <= MAX_GPUS:
        raise ValidationError("gpus", f"must be between 1 and {MAX_GPUS}, got {r.gpus}")
    if len(r.gpu_model) > 128:
        raise ValidationError("gpu_model", "longer than 128 characters")
    if len(r.nodes) > MAX_NODES:
        raise ValidationError("nodes", f"{len(r.nodes)} nodes; at most {MAX_NODES}")
    for i, node in enumerate(r.nodes):
        if not 0 < len(node) <= 253:
            raise ValidationError(f"nodes[{i}]", "not a node id")
    for name in ("start_unix_s", "end_unix_s"):
        if not math.isfinite(getattr(r, name)) or getattr(r, name) <= 0:
            raise ValidationError(name, "must be a time (unix seconds)")
    if r.end_unix_s <= r.start_unix_s:
        raise ValidationError("end_unix_s", "must be after the start")
    if bool(r.queue) == bool(r.users):
        raise ValidationError("queue", "give the queue whose work it is for, or the users, not both")
    if r.queue and not NAME_PATTERN.fullmatch(r.queue):
        raise ValidationError("queue", f"{r.queue[:64]!r} is not a queue name")
    if len(r.users) > MAX_USERS:
        raise ValidationError("users", f"{len(r.users)} users; at most {MAX_USERS}")
    for i, user in enumerate(r.users):
        if not 0 < len(user) <= 256:
            raise ValidationError(f"users[{i}]", "not an identity")
    if now is not None:
        if r.end_unix_s <= now:
            raise ValidationError("end_unix_s", "has passed")
        if r.start_unix_s > now + _MAX_AHEAD_S:
            raise ValidationError("start_unix_s", "is more than ten years ahead")


def state_of(r: types_pb2.Reservation, now: float) -> str:
    """``upcoming``, ``active`` or ``ended``."""
    return "upcoming" if now < r.start_unix_s else "active" if now < r.end_unix_s else "ended"


def is_member(task: types_pb2.Task, r: types_pb2.Reservation) -> bool:
    """Whether the task is the reservation's own work: of its queue, or submitted by one of its users."""
    return (bool(r.queue) and (task.queue or "default") == r.queue) or (bool(task.submitted_by)
                                                                       and task.submitted_by in r.users)


@dataclass(frozen=True, slots=True)
class Kept:
    """The GPUs a reservation keeps now.

    :param reservation: the reservation.
    :param gpus: the GPUs, in node and index order (fewer than it asks when too few exist).
    :param used: of those, how many its own work holds.
    """

    reservation: types_pb2.Reservation
    gpus: tuple[GpuRef, ...]
    used: int = 0

    def by_node(self) -> dict[str, frozenset[int]]:
        out: dict[str, set[int]] = {}
        for node, index in self.gpus:
            out.setdefault(node, set()).add(index)
        return {node: frozenset(indices) for node, indices in out.items()}


def choose_kept(reservations: Iterable[types_pb2.Reservation], gpus: Sequence[tuple[str, int, str, bool]],
                holders: Mapping[GpuRef, types_pb2.Task], now: float) -> list[Kept]:
    """The GPUs each reservation that has not ended keeps (module docstring), reservations by start then name.

    :param reservations: every reservation.
    :param gpus: every known GPU: (node id, index, model, whether its node is on).
    :param holders: the task holding each held GPU.
    :param now: the clock.
    """
    taken: set[GpuRef] = set()
    out: list[Kept] = []
    for r in sorted(reservations, key=lambda r: (r.start_unix_s, r.name)):
        if state_of(r, now) == "ended":
            continue
        model = r.gpu_model.lower()
        allowed = set(r.nodes)
        ranked = []
        for node, index, gpu_model, on in gpus:
            if (node, index) in taken or (allowed and node not in allowed) or model not in gpu_model.lower():
                continue
            holder = holders.get((node, index))
            rank = (0 if holder is not None and is_member(holder, r) else
                    1 if holder is None and on else 2 if holder is None else 3)
            ranked.append((rank, node, index))
        ranked.sort()
        chosen = tuple(sorted((node, index) for _rank, node, index in ranked[:r.gpus]))
        taken.update(chosen)
        used = sum(1 for ref in chosen if (h := holders.get(ref)) is not None and is_member(h, r))
        out.append(Kept(r, chosen, used))
    return out


def shrinks_off(jobs: Iterable[ElasticJob], kept: Sequence[Kept], tasks: Mapping[str, types_pb2.Task], now: float,
                lead_s: float) -> list[Resize]:
    """Elastic jobs holding GPUs a reservation keeps, of which they are not the own work, shrink by those GPUs
    once the reservation starts within ``lead_s`` (never below their minimum, never inside their protected run
    time; the hysteresis does not hold them): restarted at the smaller size, they are placed off the kept GPUs,
    which are then free at the start.

    :param jobs: the running elastic jobs.
    :param kept: the GPUs each reservation keeps.
    :param tasks: every task by id.
    :param now: the clock.
    :param lead_s: how long before a start the GPUs are given back.
    """
    out: list[Resize] = []
    for j in jobs:
        task = tasks.get(j.task_id)
        if task is None or j.size <= j.range.minimum or now < j.protected_until_s:
            continue
        held = {(na.node_id, i) for na in task.allocation.nodes for i in na.gpu_indices}
        for k in kept:
            r = k.reservation
            overlap = len(held & set(k.gpus))
            if not overlap or is_member(task, r) or r.start_unix_s > now + lead_s:
                continue
            to = max(j.range.minimum, j.size - overlap)
            when = time.strftime("%H:%M:%S UTC", time.gmtime(r.start_unix_s))
            out.append(Resize(j.task_id, j.size, to, f"reservation {r.name} keeps {overlap} of its GPUs from {when}: "
                              f"shrinks to {to}", j.curve.throughput(to) / j.curve.throughput(j.size), ""))
            break
    return out


def _without_free(slot: GpuSlot) -> GpuSlot:
    return replace(slot, mem_free_bytes=0, share_free=0.0)


def blocked(snapshot: ClusterSnapshot, gpus: Mapping[str, frozenset[int]]) -> ClusterSnapshot:
    """The snapshot with these GPUs offering nothing free (as fenced GPUs are offered: no request fits them)."""
    if not gpus:
        return snapshot
    nodes = tuple(replace(n, gpus=tuple(_without_free(g) if g.index in gpus[n.node_id] else g for g in n.gpus))
                  if n.node_id in gpus else n for n in snapshot.nodes)
    return replace(snapshot, nodes=nodes)


def keep_only(nodes: Sequence[NodeSnapshot], original: Mapping[str, NodeSnapshot],
              gpus: Mapping[str, frozenset[int]], taken_at_s: float) -> ClusterSnapshot:
    """Only the nodes holding these GPUs, with only them free (each as ``original`` offered it): where a
    reservation's own work is placed first. ``nodes`` carry what this cycle placed already (host resources)."""
    out = []
    for n in nodes:
        mine = gpus.get(n.node_id)
        if not mine or n.node_id not in original:
            continue
        first = {g.index: g for g in original[n.node_id].gpus}
        out.append(replace(n, gpus=tuple(first[g.index] if g.index in mine and g.index in first else _without_free(g)
                                          for g in n.gpus)))
    return ClusterSnapshot(nodes=tuple(out), taken_at_s=taken_at_s)


def _gpus_of(registry: NodeRegistry) -> list[tuple[str, int, str, bool]]:
    from coordinator.power_states import power_label

    out: list[tuple[str, int, str, bool]] = []
    for e in sorted(registry, key=lambda e: e.node_id):
        if e.state == NodeState.LOST:
            continue
        on = power_label(e.record.power_state) not in ("off", "powering-off")
        out.extend((e.node_id, g.index, g.model, on) for g in e.inventory.gpus)
    return out


def _holders(tasks: Iterable[types_pb2.Task]) -> dict[GpuRef, types_pb2.Task]:
    out: dict[GpuRef, types_pb2.Task] = {}
    for t in tasks:
        if t.state in _HOLDING:
            for na in t.allocation.nodes:
                for i in na.gpu_indices:
                    out[(na.node_id, i)] = t
    return out


class Reservations:
    """The reservations on the leader: recovery from etcd, creation and removal (admin), the GPUs each keeps,
    and what placement, preemption, reclaim and the Resource Adaptor ask of them.

    :param store: the reservations in etcd.
    :param leadership: leader check and fenced writes.
    :param tasks: every task (a live view).
    :param registry: the node table.
    :param events: the cluster event log.
    :param now: the clock (unix seconds).
    """

    def __init__(self, store: ReservationStore, leadership: Leadership,
                 tasks: Callable[[], Mapping[str, types_pb2.Task]], registry: NodeRegistry, events: EventBus,
                 now: Callable[[], float] = time.time) -> None:
        self._store, self._leadership, self._tasks, self._registry = store, leadership, tasks, registry
        self._events, self._now = events, now
        self._current: dict[str, types_pb2.Reservation] = {}
        self._kept: tuple[float, list[Kept]] | None = None
        self._log = get_logger("coordinator")

    async def recover(self) -> None:
        """Load every stored reservation (a new leader's take-over)."""
        import asyncio

        self._current = await asyncio.to_thread(self._store.list)
        self._kept = None

    # ---- admin --------------------------------------------------------------------------------

    async def create(self, r: types_pb2.Reservation, created_by: str = "") -> admin_pb2.ReservationView:
        """Validate and store a new reservation.

        :raises ValidationError: a field is wrong, or too few known GPUs match it in its window.
        :raises IllegalTransition: one of that name exists.
        """
        self._leadership.require_leader()
        now = self._now()
        validate_reservation(r, now)
        if r.name in self._current:
            raise ValidationError("name", f"reservation {r.name} exists; remove it first")
        if len(self._current) >= MAX_RESERVATIONS:
            raise ValidationError("name", f"{len(self._current)} reservations exist; at most {MAX_RESERVATIONS}")
        new = types_pb2.Reservation()
        new.CopyFrom(r)
        new.created_by, new.created_unix_s = created_by[:256], now
        overlapping = [o for o in self._current.values()
                       if o.start_unix_s < new.end_unix_s and new.start_unix_s < o.end_unix_s]
        kept = choose_kept([*overlapping, new], _gpus_of(self._registry), {}, now)
        mine = next(k for k in kept if k.reservation.name == new.name)
        if len(mine.gpus) < new.gpus:
            what = f"{new.gpu_model!r} " if new.gpu_model else ""
            raise ValidationError("gpus", f"{new.gpus} {what}GPUs asked; only {len(mine.gpus)} known GPUs match and "
                                          "are not kept by another reservation in that window")
        stored = await self._leadership.write(self._store.create, new)
        self._current[stored.name] = stored
        self._kept = None
        self._log.info("reservation_created", reservation=stored.name, gpus=stored.gpus,
                       start_unix_s=stored.start_unix_s, end_unix_s=stored.end_unix_s, queue=stored.queue,
                       users=",".join(stored.users), created_by=stored.created_by)
        self._events.publish("reservation", f"reservation {stored.name} created: {stored.gpus} GPU(s) for "
                             f"{_whom(stored)}", reservation=stored.name)
        return self.view(stored.name)

    async def remove(self, name: str) -> admin_pb2.ReservationView:
        """Remove a reservation (its GPUs are free for anyone from the next cycle).

        :raises NotFound: no such reservation.
        """
        self._leadership.require_leader()
        if name not in self._current:
            raise NotFound(f"reservation {name!r} not found")
        view = self.view(name)
        await self._leadership.write(self._store.delete, name)
        del self._current[name]
        self._kept = None
        self._log.info("reservation_removed", reservation=name)
        self._events.publish("reservation", f"reservation {name} removed", reservation=name)
        return view

    # ---- views --------------------------------------------------------------------------------

    def view(self, name: str) -> admin_pb2.ReservationView:
        r = self._current.get(name)
        if r is None:
            raise NotFound(f"reservation {name!r} not found")
        now = self._now()
        kept = next((k for k in self.kept(fresh=True) if k.reservation.name == name), Kept(r, ()))
        return admin_pb2.ReservationView(
            reservation=r, state=state_of(r, now), used_gpus=kept.used,
            held=[admin_pb2.ReservedGpus(node_id=node, gpu_indices=sorted(indices))
                  for node, indices in sorted(kept.by_node().items())])

    def views(self) -> admin_pb2.ListReservationsResponse:
        """Every reservation, by start time."""
        names = sorted(self._current, key=lambda n: (self._current[n].start_unix_s, n))
        return admin_pb2.ListReservationsResponse(reservations=[self.view(n) for n in names])

    # ---- what the leader's duties ask ---------------------------------------------------------

    def kept(self, *, fresh: bool = False) -> list[Kept]:
        """The GPUs each reservation that has not ended keeps now (kept for half a second, forgotten at any
        change of the reservations; ``fresh``: worked out now, for what an admin reads)."""
        now = self._now()
        if not self._current:
            return []
        if fresh or self._kept is None or now - self._kept[0] >= 0.5:
            self._kept = (now, choose_kept(self._current.values(), _gpus_of(self._registry),
                                           _holders(self._tasks().values()), now))
        return self._kept[1]

    def active_member_of(self, task: types_pb2.Task, kept: Sequence[Kept]) -> Kept | None:
        """The active reservation (of ``kept``) ``task`` is the own work of, None when none."""
        now = self._now()
        return next((k for k in kept if k.gpus and state_of(k.reservation, now) == "active"
                     and is_member(task, k.reservation)), None)

    def view_for(self, task: types_pb2.Task, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """The snapshot as ``task``'s placement may use it: every kept GPU blocked, except those of an active
        reservation it is the own work of."""
        kept = self.kept()
        if not kept:
            return snapshot
        mine = self.active_member_of(task, kept)
        gpus: dict[str, set[int]] = {}
        for k in kept:
            if k is not mine:
                for node, index in k.gpus:
                    gpus.setdefault(node, set()).add(index)
        return blocked(snapshot, {n: frozenset(s) for n, s in gpus.items()})

    def shields(self, victim: types_pb2.Task, by: types_pb2.Task | None = None) -> bool:
        """Whether ``victim`` is an active reservation's own work running on its kept GPUs, which nobody else's
        preemption (``by``, not of that reservation) or reclaim (``by`` None) may take."""
        now = self._now()
        for k in self.kept():
            r = k.reservation
            if state_of(r, now) != "active" or not is_member(victim, r) or (by is not None and is_member(by, r)):
                continue
            held = {(na.node_id, i) for na in victim.allocation.nodes for i in na.gpu_indices}
            if held & set(k.gpus):
                return True
        return False

    def nodes_needed(self, within_s: float) -> dict[str, str]:
        """Nodes holding GPUs of a reservation that is active or starts within ``within_s``: node → reservation."""
        now = self._now()
        out: dict[str, str] = {}
        for k in self.kept():
            if k.reservation.start_unix_s <= now + within_s:
                for node, _index in k.gpus:
                    out.setdefault(node, k.reservation.name)
        return out


def _whom(r: types_pb2.Reservation) -> str:
    return f"queue {r.queue}" if r.queue else f"users {', '.join(r.users[:5])}"
