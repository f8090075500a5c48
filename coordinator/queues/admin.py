"""The leader's team queues: the tree in etcd, the admin's changes to it, who may submit where, and
what each queue holds.

- A new leader reads the stored tree; when none is stored and ``--queues FILE`` names a TOML file
  (:func:`coordinator.queues.load_toml`), that file's tree is stored. From then on etcd is the
  truth and ``gptrmctl queues set/rm`` change it, under the ``queues`` lock, compared on the key's
  revision, validated as a whole tree (:class:`~coordinator.queues.QueueConfig`).
- A change never strands work (:func:`_stranded`, one rule for ``set`` and ``rm``): a queue that holds
  unfinished tasks is not removed, not given child queues (it would stop taking tasks) and not moved
  under another parent.
- The first queue set on a cluster without queues keeps the implicit ``default`` queue, in which every
  task ran until then, as a queue of the tree (everyone's, no quota, no limit): its tasks keep running
  (or wait there when a queue with a quota reclaims their GPUs), and submits without ``--queue`` still
  go to it until a queue claims ``default_for = "*"`` or an admin removes it (``queues rm default``).
  ``SetQueue`` answers what it did with existing work (``QueueView.existing_work``). A ``--queues`` file
  stored by a new leader keeps ``default`` the same way while unfinished tasks are in it.
- **Who may submit where** (:meth:`QueueAdmin.resolve`): a credential that names queues
  (certificate SAN URIs or the token file's ``queues=``) may submit to those only, the first being
  its default; a credential that names none may submit to the queues whose ``members`` list it
  (or ``"*"``), and its default is the queue whose ``default_for`` lists it. Without
  authentication (``--insecure`` alone) every queue is open. Without configured queues every task
  runs in the one implicit ``default`` queue.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.errors import GptrmError, IllegalTransition, NotFound, PermissionDenied, ValidationError
from common.logging import get_logger
from common.pb.gptrm.v1 import admin_pb2
from common.types import TERMINAL_STATES, TaskState
from coordinator.events import EventBus
from coordinator.queues import (
    ANY_MODEL,
    DEFAULT_QUEUE,
    BudgetState,
    Queue,
    QueueConfig,
    QueueUse,
    UsageDecay,
    budget_gate,
    budget_state,
    lines_crossed,
    load_toml,
    period_start,
    queue_use,
    rebalance,
)
from coordinator.queues.fairshare import order_queues
from coordinator.queues.planning import LeaderQueues, queue_of
from coordinator.state import LeaderState
from coordinator.sync.leadership import Leadership
from coordinator.sync.lock import AdminLocks
from coordinator.sync.queues import QueueStore
from coordinator.sync.state_machine import Conflict
from coordinator.sync.usage import hours_between
from coordinator.usage import AccountedPass, Prices, UsageDuty, summarize
from coordinator.usage.ledger import Rows

__all__ = ["MAX_QUEUE_SERIES", "QueueAdmin", "QueueMetrics", "QueueSet", "Submitter", "queue_from_proto",
           "queue_to_proto"]

T = TypeVar("T")

_NO_USE = QueueUse()


class Submitter(Protocol):
    """Who submits (``coordinator.api.auth.Principal``)."""

    @property
    def name(self) -> str: ...

    @property
    def via(self) -> str: ...

    @property
    def default_queue(self) -> str: ...

    @property
    def any_queue(self) -> bool: ...


def queue_to_proto(q: Queue) -> admin_pb2.Queue:
    """The API form of a queue."""
    out = admin_pb2.Queue(name=q.name, parent=q.parent or "", weight=q.weight, members=list(q.members),
                          default_for=list(q.default_for), mount_allowed=list(q.mount_allowed))
    for model in sorted(set(q.gpus) | set(q.limit) | set(q.lend)):
        quota = out.quotas.add(gpu_model=model, gpus=q.gpus.get(model, 0))
        if model in q.limit:
            quota.has_limit, quota.limit = True, q.limit[model]
        if model in q.lend:
            quota.has_lend, quota.lend = True, q.lend[model]
    if q.cpu is not None:
        out.has_cpu, out.cpu = True, q.cpu
    if q.mem_gib is not None:
        out.has_mem_gib, out.mem_gib = True, q.mem_gib
    if q.budget is not None:
        out.has_budget = True
        out.budget.CopyFrom(admin_pb2.QueueBudget(kind=q.budget.kind, amount=q.budget.amount,
                                                  period=q.budget.period, action=q.budget.action))
    for name in _TIME_FIELDS:   # 0 on the wire: not set
        setattr(out, name, getattr(q, name) or 0.0)
    return out


def queue_from_proto(msg: admin_pb2.Queue) -> Queue:
    """A queue from the API, validated (:class:`ValidationError` naming the field)."""
    data: dict[str, object] = {"name": msg.name, "weight": msg.weight or 1.0}
    if msg.parent:
        data["parent"] = msg.parent
    gpus: dict[str, int] = {}
    limit: dict[str, int] = {}
    lend: dict[str, int] = {}
    for i, quota in enumerate(msg.quotas):
        model = quota.gpu_model or ANY_MODEL
        if model in gpus:
            raise ValidationError(f"queue.quotas[{i}].gpu_model", f"{model!r} is given twice")
        gpus[model] = quota.gpus
        if quota.has_limit:
            limit[model] = quota.limit
        if quota.has_lend:
            lend[model] = quota.lend
    data.update(gpus=gpus, limit=limit, lend=lend, members=list(msg.members), default_for=list(msg.default_for),
                mount_allowed=list(msg.mount_allowed))
    if msg.has_cpu:
        data["cpu"] = msg.cpu
    if msg.has_mem_gib:
        data["mem_gib"] = msg.mem_gib
    if msg.has_budget:
        data["budget"] = {"kind": msg.budget.kind, "amount": msg.budget.amount,
                          "period": msg.budget.period or "month", "action": msg.budget.action or "hold"}
    for name in _TIME_FIELDS:
        if getattr(msg, name):
            data[name] = getattr(msg, name)
    return Queue.from_dict(data, where="queue")


_TIME_FIELDS = ("default_time_limit_s", "max_time_limit_s", "default_min_runtime_s", "grace_s")
"""A queue's run-time settings, the same names in the API and the model (0 on the wire: not set)."""


class QueueAdmin:
    """The queue tree on the leader: recovery, changes, access, and views.

    :param store: the queue tree in etcd.
    :param leadership: leader check and fenced writes.
    :param locks: the admin locks (``queues``).
    :param state: the leader's state (holds the tree; tasks for the views and the removal check).
    :param queues: the scheduler's queue side (capacity, holdings, decayed usage, budget readings).
    :param usage: the usage ledger (what budgeted queues consumed).
    :param prices: prices of GPU-hours and energy (``cost`` budgets).
    :param events: the cluster event log.
    :param queues_file: the TOML file stored when etcd holds no tree ("" none).
    """

    def __init__(self, store: QueueStore, leadership: Leadership, locks: AdminLocks, state: LeaderState,
                 queues: LeaderQueues, usage: UsageDuty, prices: Prices, events: EventBus,
                 queues_file: str = "") -> None:
        self._store, self._leadership, self._locks, self._state = store, leadership, locks, state
        self._queues, self._usage, self._prices = queues, usage, prices
        self._events, self._file = events, queues_file
        self._used: dict[str, tuple[str, str, float, float]] = {}
        """Queue → (budget kind, period, used in the period, when) of the last budget reading."""
        self._log = get_logger("coordinator")

    @property
    def managed(self) -> bool:
        """Whether queues are configured (else one implicit default queue)."""
        return self._state.queues.managed

    @property
    def config(self) -> QueueConfig:
        """The tree as this replica holds it (a standby's is not the leader's: judge changes on the leader)."""
        return self._state.queues

    # ---- a new leader -------------------------------------------------------------------------

    async def recover(self) -> None:
        """Read the stored tree; store ``--queues FILE`` when there is none.

        :raises ConfigError, ValidationError: the file is unreadable or invalid (the leader then gives up
            its lease: a replica with another file may lead)."""
        stored = await asyncio.to_thread(self._store.get)
        if not stored.revision and self._file:
            config = await asyncio.to_thread(load_toml, self._file)
            config = self._keeping_default_work(config)
            stored = await self._leadership.write_as_leader(self._store.put, config, 0)
            self._log.info("queues_loaded", file=self._file, queues=len(config.queues))
        elif stored.revision and self._file:
            self._log.info("queues_file_ignored", file=self._file,
                           reason="etcd holds queues already; gptrmctl queues set/rm change them")
        self._state.apply_queues(stored.config, stored.revision)
        await self.restore_decay()

    def _keeping_default_work(self, config: QueueConfig) -> QueueConfig:
        """``config`` (the ``--queues`` file, stored on a cluster that ran without queues) with the implicit
        ``default`` queue kept when unfinished tasks are in it and the file has no queue of that name, so they
        are not stranded; it lends its ``"*"`` default to a queue of the file that claims it."""
        default = DEFAULT_QUEUE.name
        if default in config or not any(queue_of(t) == default and t.state not in TERMINAL_STATES
                                        for t in self._state.tasks.values()):
            return config
        claimed = {who for q in config.queues for who in q.default_for}
        kept = replace(DEFAULT_QUEUE, default_for=tuple(w for w in DEFAULT_QUEUE.default_for if w not in claimed))
        try:
            with_default = QueueConfig(queues=(kept, *config.queues), half_life_h=config.half_life_h)
        except ValidationError as e:          # e.g. the file is at the bound on queues: stored as it is
            self._log.warning("queues_default_not_kept", file=self._file, reason=str(e))
            return config
        self._log.warning("queues_default_kept", file=self._file,
                          reason="tasks of the implicit default queue are unfinished; remove it with "
                                 "gptrmctl queues rm default once it is empty")
        return with_default

    async def restore_decay(self) -> None:
        """Rebuild each queue's decayed past usage from the usage ledger's hours (the last eight half-lives,
        beyond which usage weighs under 0.4 %), so that a new leader orders the queues as the old one did."""
        config = self._state.queues
        if not config.managed:
            return
        now = self._queues.clock()
        decay = UsageDecay.for_config(config)
        try:
            hours, accounted = await self._usage.report(now - 8 * decay.half_life_s, now, now)
        except GptrmError as e:   # the fair order then starts without history; nothing else depends on it
            self._log.warning("queue_usage_history_unavailable", reason=str(e))
            return
        for hour in sorted(hours):
            for key, used in hours[hour].items():
                decay.add(key.queue or DEFAULT_QUEUE.name, hour + 1800.0, gpu_s=used.gpu_s, cpu_s=used.cpu_core_s)
        self._queues.restore(decay, accounted or now)

    # ---- admin changes ------------------------------------------------------------------------

    async def set(self, queue: Queue) -> QueueSet:
        """Create or replace one queue (the whole tree validated, off the event loop: its cost grows with the
        tree). :raises ValidationError, NotLeader, IllegalTransition (it would strand work, :func:`_stranded`)."""
        self._leadership.require_leader()

        async def change() -> tuple[QueueConfig, list[str]]:
            before = self._state.queues
            config, notes = await asyncio.to_thread(_named, lambda: _set_keeping_default(before, queue), before, queue)
            self._refuse_stranding(before, config)
            return await self._store_queues(config), notes

        stored, notes = await self._locks.run("queues", change)
        self._log.info("queue_set", queue=queue.name, kept_default=bool(notes))
        self._events.publish("queues", f"queue {queue.name} set", queue=queue.name)
        self._rebudget(stored.get(queue.name))
        return QueueSet(stored.get(queue.name), " ".join(notes) or _UNCHANGED)

    async def remove(self, name: str) -> Queue:
        """Remove an empty leaf queue. :raises NotFound, IllegalTransition (it holds or waits for work)."""
        self._leadership.require_leader()

        async def change() -> Queue:
            config = self._state.queues
            if not config.managed or name not in config:
                raise NotFound(f"no queue named {name!r}")
            removed = config.get(name)
            after = await asyncio.to_thread(config.remove, name)      # validates the tree: off the loop
            self._refuse_stranding(config, after)
            await self._store_queues(after)
            return removed

        removed = await self._locks.run("queues", change)
        self._log.info("queue_removed", queue=name)
        self._events.publish("queues", f"queue {name} removed", queue=name)
        return removed

    async def _store_queues(self, config: QueueConfig) -> QueueConfig:
        """Write the tree (compared on the revision the leader's state follows) and apply what etcd stored.
        Called under the ``queues`` lock, through :meth:`AdminLocks.run`, so that a caller gone meanwhile never
        leaves etcd a revision ahead of the leader's state."""
        try:
            stored = await self._leadership.write(self._store.put, config, self._state.queues_revision)
        except Conflict:
            # etcd holds a tree the leader's state does not follow (a write that was stored although its answer
            # was lost): follow it, so that the admin's next change compares against it instead of failing too.
            current = await asyncio.to_thread(self._store.get)
            self._state.apply_queues(current.config, current.revision)
            self._log.warning("queues_reread", revision=current.revision, reason="the stored tree changed meanwhile")
            raise
        self._state.apply_queues(stored.config, stored.revision)
        return stored.config

    def _refuse_stranding(self, before: QueueConfig, after: QueueConfig) -> None:
        """:raises IllegalTransition: ``after`` strands unfinished tasks (:func:`_stranded`)."""
        busy: dict[str, list[str]] = {}
        for t in self._state.tasks.values():
            if t.state not in TERMINAL_STATES and _stranded(before, after, queue_of(t)):
                busy.setdefault(queue_of(t), []).append(t.id)
        if busy:
            name = min(busy)
            ids = sorted(busy[name])
            raise IllegalTransition(f"queue {name}: {len(ids)} unfinished task(s) in it ({', '.join(ids[:5])}) "
                                    f"and the change would {_stranded(before, after, name)}; cancel or wait for "
                                    f"them first")

    # ---- who may submit where -----------------------------------------------------------------

    def resolve(self, asked: str, principal: Submitter | None) -> str:
        """The queue a submit goes to: ``asked``, or the submitter's default. (Whether the submitter's
        credential names that queue is the servicer's check, ``coordinator.api.auth.queue_refusal``.)

        :raises PermissionDenied: the credential names no queues and the queue's members leave it out.
        :raises ValidationError: no such leaf queue, or no queue given and none is the submitter's default.
        """
        config = self._state.queues
        open_mode = principal is None or principal.via == "none"
        name = asked or (principal.default_queue if principal is not None else "")
        if not name:
            if not config.managed:
                name = DEFAULT_QUEUE.name
            else:
                try:
                    name = config.default_queue(principal.name if principal is not None else "anonymous")
                except NotFound as e:
                    raise ValidationError("spec.queue", str(e)) from None
        if name not in config.names or not config.is_leaf(name):
            known = ", ".join(n for n in config.names if config.is_leaf(n))
            raise ValidationError("spec.queue", f"no queue {name!r} takes tasks (queues: {known})")
        if open_mode or principal is None:
            return name
        if principal.any_queue and config.managed and not config.may_submit(principal.name, name):
            raise PermissionDenied(f"queue {name!r}: {principal.name!r} is not among its members")
        return name

    # ---- views --------------------------------------------------------------------------------

    async def stored_views(self, name: str = "") -> admin_pb2.ListQueuesResponse:
        """:meth:`views` on a standby: the tree etcd holds, without what the leader alone knows (``stale``)."""
        stored = await asyncio.to_thread(self._store.get)
        out = self._views(stored.config, name, leading=False)
        out.stale = True
        return out

    def views(self, name: str = "") -> admin_pb2.ListQueuesResponse:
        """Every queue (tree order), or one: its settings, what it holds (own and borrowed), its tasks,
        its place in the fair order and its budget."""
        return self._views(self._state.queues, name, leading=True)

    def _views(self, config: QueueConfig, name: str, *, leading: bool) -> admin_pb2.ListQueuesResponse:
        if name and name not in config:
            raise NotFound(f"no queue named {name!r}")
        held, stopping = self._queues.holdings() if leading else ([], [])
        current = rebalance(config, held + stopping)
        use = queue_use(current)
        capacity = self._queues.capacity()
        now = self._queues.clock()
        order = order_queues(config, use, self._queues.decay, capacity, now) if config.managed else []
        rank = {q: i + 1 for i, q in enumerate(order)}
        counts: dict[tuple[str, str], int] = {}
        for t in self._state.tasks.values():
            kind = "pending" if t.state == TaskState.PENDING else "running" if t.allocation.nodes and \
                t.state not in TERMINAL_STATES else ""
            if kind:
                counts[queue_of(t), kind] = counts.get((queue_of(t), kind), 0) + 1
        waiting = {queue for queue, kind in counts if kind == "pending"}
        out = admin_pb2.ListQueuesResponse(managed=config.managed, half_life_h=config.half_life_h)
        for q in (config.get(name),) if name else config.tree_order():
            state = self._queues.budgets.get(q.name) if leading else None
            others = bool(waiting - {q.name})
            view = out.queues.add(queue=queue_to_proto(q), leaf=config.is_leaf(q.name),
                                  running=counts.get((q.name, "running"), 0),
                                  pending=counts.get((q.name, "pending"), 0),
                                  budget_gate=budget_gate(q, state, others),
                                  budget_used=state.fraction if state else 0.0)
            for model, h in sorted(use.get(q.name, _NO_USE).gpus.items()):
                view.held.add(gpu_model=model, own=h.own, borrowed=h.borrowed)
            view.fair_order = rank.get(q.name, 0)
        return out

    # ---- budgets ------------------------------------------------------------------------------

    def budget_readings(self) -> list[admin_pb2.UsageBudget]:
        """Every budgeted queue's budget, the fraction used in its current period and its gate now."""
        out = []
        for view in self.views().queues:
            q = view.queue
            if q.has_budget:
                out.append(admin_pb2.UsageBudget(queue=q.name, kind=q.budget.kind, amount=q.budget.amount,
                                                 period=q.budget.period, action=q.budget.action,
                                                 fraction=view.budget_used, gate=view.budget_gate))
        return out

    async def check_budgets(self, accounted: AccountedPass) -> None:
        """Read what each budgeted queue consumed in its current period, as the usage ledger stored it up to the
        pass just stored (priced), into the scheduler's budget readings, so that a queue's new work is held from
        the pass that accounts it past its budget; an event for each line (80 %, 100 %) that pass crossed.

        Called by the usage duty after each stored pass (``UsageDuty.on_accounted``). What the pass added is
        the difference between the reading before it and after it, so a line is announced by the one pass that
        crossed it in its period, also when the pass jumped past both lines, and never again by a new leader
        (its passes start from the stored usage)."""
        config = self._state.queues
        budgeted = [q for q in config.queues if q.budget is not None] if config.managed else []
        readings: dict[str, BudgetState] = {}
        now = accounted.until
        by_start: dict[float, list[Queue]] = {}
        for q in budgeted:
            assert q.budget is not None
            by_start.setdefault(period_start(q.budget.period, now), []).append(q)
        for start, queues in by_start.items():
            stored, _accounted = await asyncio.to_thread(self._usage.read, hours_between(start, now))
            after = self._used_by_queue(stored.values())
            added = self._used_by_queue(rows for hour, rows in accounted.hours.items() if hour >= start)
            for q in queues:
                assert q.budget is not None
                used = after.get(q.name, {}).get(q.budget.kind, 0.0)
                current = budget_state(q.budget, used, now)
                before = budget_state(q.budget, used - added.get(q.name, {}).get(q.budget.kind, 0.0), now)
                readings[q.name] = current
                self._used[q.name] = (q.budget.kind, q.budget.period, used, now)
                for line in lines_crossed(before.fraction, current.fraction):
                    self._announce(q, line, current)
        self._queues.budgets = readings
        self._used = {name: used for name, used in self._used.items() if name in readings}

    def _rebudget(self, queue: Queue) -> None:
        """A queue's budget was set: its reading follows the new amount at once (the gate with it), and the lines
        the change itself took it past are announced. A new kind or period waits for the next pass's reading."""
        readings = dict(self._queues.budgets)
        last = self._used.get(queue.name)
        if queue.budget is None:
            readings.pop(queue.name, None)
        elif last is not None and queue.name in readings and last[:2] == (queue.budget.kind, queue.budget.period):
            before, current = readings[queue.name], budget_state(queue.budget, last[2], last[3])
            readings[queue.name] = current
            for line in lines_crossed(before.fraction, current.fraction):
                self._announce(queue, line, current)
        self._queues.budgets = readings

    def _used_by_queue(self, hours: Iterable[Rows]) -> dict[str, dict[str, float]]:
        """Queue → what its rows in ``hours`` add up to in each budget kind (gpu_hours, kwh, cost)."""
        return {r.key: {"gpu_hours": r.gpu_hours, "kwh": r.energy_kwh, "cost": r.cost}
                for r in summarize(hours, by="queue", prices=self._prices)}

    def _announce(self, queue: Queue, line: float, current: BudgetState) -> None:
        """A ``queues`` event (and a log line): ``queue`` crossed ``line`` of its budget."""
        budget = queue.budget
        assert budget is not None
        fraction = round(current.fraction, 4)
        self._log.warning("queue_budget", queue=queue.name, line=line, fraction=fraction, kind=budget.kind,
                          period=budget.period)
        head = f"queue {queue.name} is at {current.fraction * 100:.0f}% of its {budget.kind} budget of " \
               f"{budget.amount:g} per {budget.period}"
        if line >= 1.0:
            head = f"queue {queue.name} is past its {budget.kind} budget of {budget.amount:g} per " \
                   f"{budget.period} ({current.fraction * 100:.0f}%); new work: {budget.action}"
        else:
            head += f" (past {line * 100:.0f}%)"
        self._events.publish("queues", head, queue=queue.name, line=line, fraction=fraction)


_UNCHANGED = "No existing task changed queue."


@dataclass(frozen=True)
class QueueSet:
    """What :meth:`QueueAdmin.set` did: the queue as stored, and a sentence on what became of existing work."""

    queue: Queue
    existing_work: str


def _stranded(before: QueueConfig, after: QueueConfig, name: str) -> str:
    """What the change from ``before`` to ``after`` does to the tasks of queue ``name`` that strands them
    ("" nothing): the queue is removed, gets child queues (it stops taking tasks) or moves under another
    parent. The one rule behind ``queues rm`` and ``queues set``."""
    if name not in before or not before.is_leaf(name):
        return ""                       # its tasks already wait on a queue that takes none
    if name not in after:
        return "remove it"
    if not after.is_leaf(name):
        return f"give it child queues ({', '.join(after.children(name)[:5])}), after which it takes no tasks"
    old, new = before.get(name).parent, after.get(name).parent
    if old != new:
        return f"move it from under {old or 'no queue'} to under {new or 'no queue'}"
    return ""


def _set_keeping_default(config: QueueConfig, queue: Queue) -> tuple[QueueConfig, list[str]]:
    """``config.set(queue)``, keeping the implicit ``default`` queue when ``queue`` is the first one set, and
    moving the implicit ``default_for`` entries ``queue`` claims from a ``default`` queue still as it was
    implicitly; with sentences saying so (module docstring)."""
    notes: list[str] = []
    default = DEFAULT_QUEUE.name
    claimed = [who for who in queue.default_for if who in DEFAULT_QUEUE.default_for] if queue.name != default else []
    if queue.name != default and not config.managed:
        config = config.set(DEFAULT_QUEUE)
        notes.append(f"Queue {default}, in which every task ran until now, is kept with no quota and no limit: "
                     f"its tasks keep running (a queue reclaiming its quota may preempt them, and they then "
                     f"wait in {default})" + ("" if claimed else ", and submits without --queue still go to it")
                     + f"; remove it with `gptrmctl queues rm {default}` once it is empty.")
    if claimed and default in config and config.get(default) == DEFAULT_QUEUE:
        config = config.set(replace(DEFAULT_QUEUE, default_for=()))
        notes.append(f"Submits without --queue now go to queue {queue.name} instead of queue {default}.")
    return config.set(queue), notes


def _named(change: Callable[[], T], before: QueueConfig, queue: Queue) -> T:
    """``change()``, its validation error naming queues by name (``queue 'org'.gpus``) rather than by their
    index in the tree (``queue[0].gpus``, the form that points into a TOML file)."""
    try:
        return change()
    except ValidationError as e:
        # the tree as built: a first queue comes after the default queue it keeps (_set_keeping_default)
        names = [q.name for q in before.queues] or ([DEFAULT_QUEUE.name] if queue.name != DEFAULT_QUEUE.name else [])
        if queue.name not in names:
            names.append(queue.name)
        field = re.sub(r"^queue\[(\d+)\]", lambda m: f"queue {names[int(m.group(1))]!r}"
                       if int(m.group(1)) < len(names) else m.group(0), e.field)
        raise ValidationError(field, e.problem) from None


MAX_QUEUE_SERIES = 256
"""Queues with series of their own; the rest are summed under ``queue="other"`` (bounded cardinality)."""


class QueueMetrics(Collector):
    """Per-queue series, computed at scrape on the leader (a standby exports none):
    ``gptrm_queue_gpus{queue,kind=own|borrowed}``, ``gptrm_queue_tasks{queue,state=running|pending}`` and
    ``gptrm_queue_budget_used_ratio{queue}``. At most :data:`MAX_QUEUE_SERIES` queues by name, in tree order.

    :param admin: the queue views.
    :param leading: whether this replica leads.
    """

    def __init__(self, admin: QueueAdmin, leading: Callable[[], bool]) -> None:
        self._admin, self._leading = admin, leading

    def collect(self) -> Iterator[Metric]:
        gpus = GaugeMetricFamily("gptrm_queue_gpus", "GPUs a queue holds: within its quota (own) or borrowed",
                                 labels=["queue", "kind"])
        tasks = GaugeMetricFamily("gptrm_queue_tasks", "A queue's tasks holding GPUs (running) or waiting (pending)",
                                  labels=["queue", "state"])
        budget = GaugeMetricFamily("gptrm_queue_budget_used_ratio",
                                   "Fraction of its budget a queue used in the current period", labels=["queue"])
        if self._leading() and self._admin.managed:
            resp = self._admin.views()
            sums: dict[tuple[str, str, str], float] = {}
            for i, view in enumerate(v for v in resp.queues if v.leaf):
                name = view.queue.name if i < MAX_QUEUE_SERIES else "other"
                for key, value in ((("gpus", name, "own"), sum(h.own for h in view.held)),
                                   (("gpus", name, "borrowed"), sum(h.borrowed for h in view.held)),
                                   (("tasks", name, "running"), view.running),
                                   (("tasks", name, "pending"), view.pending)):
                    sums[key] = sums.get(key, 0.0) + value
                if view.queue.has_budget and name != "other":
                    budget.add_metric([name], view.budget_used)
            for (family, queue, label), total in sums.items():
                (gpus if family == "gpus" else tasks).add_metric([queue, label], total)
        yield gpus
        yield tasks
        yield budget

    def describe(self) -> Iterator[Metric]:
        return iter(())
