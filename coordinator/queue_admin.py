"""The leader's team queues: the tree in etcd, the admin's changes to it, who may submit where, and
what each queue holds.

- A new leader reads the stored tree; when none is stored and ``--queues FILE`` names a TOML file
  (:func:`coordinator.queues.load_toml`), that file's tree is stored. From then on etcd is the
  truth and ``gptrmctl queues set/rm`` change it, under the ``queues`` lock, compared on the key's
  revision, validated as a whole tree (:class:`~coordinator.queues.QueueConfig`).
- A queue is removed only when no unfinished task is in it.
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
from typing import Protocol

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
from coordinator.scheduler.queueing import LeaderQueues, queue_of
from coordinator.state import LeaderState
from coordinator.sync.leadership import Leadership
from coordinator.sync.lock import AdminLocks
from coordinator.sync.queues import QueueStore
from coordinator.sync.usage import hours_between
from coordinator.usage import AccountedPass, Prices, UsageDuty, summarize
from coordinator.usage.ledger import Rows

__all__ = ["MAX_QUEUE_SERIES", "QueueAdmin", "QueueMetrics", "Submitter", "queue_from_proto", "queue_to_proto"]

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
                          default_for=list(q.default_for))
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
    data.update(gpus=gpus, limit=limit, lend=lend, members=list(msg.members), default_for=list(msg.default_for))
    if msg.has_cpu:
        data["cpu"] = msg.cpu
    if msg.has_mem_gib:
        data["mem_gib"] = msg.mem_gib
    if msg.has_budget:
        data["budget"] = {"kind": msg.budget.kind, "amount": msg.budget.amount,
                          "period": msg.budget.period or "month", "action": msg.budget.action or "hold"}
    return Queue.from_dict(data, where="queue")


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

    # ---- a new leader -------------------------------------------------------------------------

    async def recover(self) -> None:
        """Read the stored tree; store ``--queues FILE`` when there is none.

        :raises ConfigError, ValidationError: the file is unreadable or invalid (the leader then gives up
            its lease: a replica with another file may lead)."""
        stored = await asyncio.to_thread(self._store.get)
        if not stored.revision and self._file:
            config = await asyncio.to_thread(load_toml, self._file)
            stored = await self._leadership.write_as_leader(self._store.put, config, 0)
            self._log.info("queues_loaded", file=self._file, queues=len(config.queues))
        elif stored.revision and self._file:
            self._log.info("queues_file_ignored", file=self._file,
                           reason="etcd holds queues already; gptrmctl queues set/rm change them")
        self._state.apply_queues(stored.config, stored.revision)
        await self.restore_decay()

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

    async def set(self, queue: Queue) -> Queue:
        """Create or replace one queue (the whole tree validated). :raises ValidationError, NotLeader."""
        self._leadership.require_leader()
        async with self._locks.hold("queues"):
            config = _named(lambda: self._state.queues.set(queue), self._state.queues, queue)
            stored = await self._leadership.write(self._store.put, config, self._state.queues_revision)
            self._state.apply_queues(stored.config, stored.revision)
        self._log.info("queue_set", queue=queue.name)
        self._events.publish("queues", f"queue {queue.name} set", queue=queue.name)
        self._rebudget(stored.config.get(queue.name))
        return stored.config.get(queue.name)

    async def remove(self, name: str) -> Queue:
        """Remove an empty leaf queue. :raises NotFound, IllegalTransition (it holds or waits for work)."""
        self._leadership.require_leader()
        async with self._locks.hold("queues"):
            config = self._state.queues
            if not config.managed or name not in config:
                raise NotFound(f"no queue named {name!r}")
            busy = [t.id for t in self._state.tasks.values() if queue_of(t) == name and t.state not in TERMINAL_STATES]
            if busy:
                raise IllegalTransition(f"queue {name}: {len(busy)} unfinished task(s) in it "
                                        f"({', '.join(sorted(busy)[:5])}); cancel or wait for them first")
            removed = config.get(name)
            stored = await self._leadership.write(self._store.put, config.remove(name), self._state.queues_revision)
            self._state.apply_queues(stored.config, stored.revision)
        self._log.info("queue_removed", queue=name)
        self._events.publish("queues", f"queue {name} removed", queue=name)
        return removed

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
        if name and name not in config.names:
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
        out = admin_pb2.ListQueuesResponse(managed=config.managed, half_life_h=config.half_life_h)
        for q in _tree_order(config):
            if name and q.name != name:
                continue
            state = self._queues.budgets.get(q.name) if leading else None
            others = any(k[1] == "pending" and k[0] != q.name for k in counts)
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


def _named(change: Callable[[], QueueConfig], before: QueueConfig, queue: Queue) -> QueueConfig:
    """``change()``, its validation error naming queues by name (``queue 'org'.gpus``) rather than by their
    index in the tree (``queue[0].gpus``, the form that points into a TOML file)."""
    try:
        return change()
    except ValidationError as e:
        names = [q.name for q in before.queues]
        if queue.name not in names:
            names.append(queue.name)
        field = re.sub(r"^queue\[(\d+)\]", lambda m: f"queue {names[int(m.group(1))]!r}"
                       if int(m.group(1)) < len(names) else m.group(0), e.field)
        raise ValidationError(field, e.problem) from None


def _tree_order(config: QueueConfig) -> Iterable[Queue]:
    """Each parent before its children, siblings by name."""
    def walk(parent: str | None) -> Iterable[Queue]:
        for q in sorted((q for q in config.all_queues if q.parent == parent), key=lambda q: q.name):
            yield q
            yield from walk(q.name)
    return walk(None)



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
