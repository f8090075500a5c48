"""Admission: may a queue start a task now, and how many of its GPUs are borrowed?

Inputs are plain values: the :class:`~coordinator.queues.model.QueueConfig`, what each queue holds
now (:class:`QueueUse`: GPUs per concrete model split into ``own`` — within quota — and
``borrowed``, plus cores and memory), the cluster's GPU capacity per concrete model, and the task's
:class:`Demand`. :func:`admit` answers an :class:`AdmissionDecision`.

The rule, in the demand's pool (see :mod:`coordinator.queues.model` for pools):

1. The queue's ``cpu`` and ``mem_gib`` caps, and those of its ancestors over their subtrees, must
   hold (they are caps; cores and memory are never borrowed).
2. ``held + gpus ≤ quota``: admitted, nothing borrowed. Quota is a guarantee: this holds even
   when other queues are borrowing the queue's idle quota at the moment (reclaim,
   :mod:`coordinator.queues.reclaim`, takes it back).
3. Otherwise the part beyond quota, ``borrowed = held + gpus − max(quota, held)`` (all of it when
   the queue is already at or above its quota), is borrowed. It is admitted when

   - ``held + gpus ≤ limit`` for the queue, and ``subtree held + gpus ≤ limit`` for each ancestor
     with a limit in the pool; and
   - ``borrowed ≤ pool``, where ``pool = Σ lendable + unassigned − already borrowed``:
     each other leaf queue lends ``min(lend, max(0, quota − held))``; *unassigned* is the capacity
     nobody has a quota on (``capacity − Σ leaf quotas``, at least 0); *already borrowed* is what
     every queue holds as borrowed in the pool.

   Unassigned capacity counts as borrowed: nobody is guaranteed it, so a queue whose quota covers
   it may take it back by reclaim like any other borrowed GPU. Inner queues' quotas are bounds on
   their children (validated), not pools of their own; lending and borrowing are across the whole
   tree, and a parent's remainder over its children's quotas is part of *unassigned* (which
   its children may reclaim from queues outside the parent, :mod:`coordinator.queues.reclaim`).

A demand for ``"*"`` (any model) is decided in each pool of the cluster; the first pool that
admits it without borrowing wins, else the one that admits it borrowing least (ties in
:meth:`~coordinator.queues.model.QueueConfig.pools` order). :attr:`AdmissionDecision.pool` says which, so
the scheduler places the task on that pool's models.

Without configured queues every demand is admitted with nothing borrowed (the cluster as before
queues); the placement engine alone decides where it fits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from common.errors import ValidationError
from coordinator.queues.model import ANY_MODEL, QueueConfig, normalise_model

__all__ = ["AdmissionDecision", "Demand", "Held", "PoolState", "QueueUse", "admit", "pool_state", "room"]


@dataclass(frozen=True)
class Held:
    """GPUs a queue holds of one model: ``own`` within its quota, ``borrowed`` beyond it."""

    own: int = 0
    borrowed: int = 0

    @property
    def total(self) -> int:
        """``own + borrowed``."""
        return self.own + self.borrowed

    def __add__(self, other: Held) -> Held:
        return Held(self.own + other.own, self.borrowed + other.borrowed)


@dataclass(frozen=True)
class QueueUse:
    """What one queue's running tasks hold: GPUs per concrete GPU model, cores, memory."""

    gpus: Mapping[str, Held] = field(default_factory=dict)
    cpu: float = 0.0
    mem_gib: float = 0.0

    def held_in(self, config: QueueConfig, pool: str) -> Held:
        """The GPUs held of the models that make up ``pool``."""
        total = Held()
        for model, held in self.gpus.items():
            if config.pool_of(model) == pool:
                total = total + held
        return total


_NO_USE = QueueUse()


@dataclass(frozen=True)
class Demand:
    """What a task asks of its queue.

    :param queue: the (leaf) queue it was submitted to.
    :param gpu_model: a concrete GPU model, or ``"*"`` (or ``""``) for any model.
    :param gpus: GPUs it needs (all of them at once).
    :param per_node: of them, GPUs it needs on each of ``node_count`` nodes (0: unknown; reclaim then
        counts GPUs only, wherever they are).
    """

    queue: str
    gpu_model: str = ANY_MODEL
    gpus: int = 0
    cpu: float = 0.0
    mem_gib: float = 0.0
    per_node: int = 0
    node_count: int = 1


@dataclass(frozen=True)
class AdmissionDecision:
    """The decision: ``admit``; how many of the task's GPUs are ``borrowed`` (0 when refused);
    ``reason``, whole sentences with the numbers behind it (what ``gptrmctl tasks`` shows a waiting task); the
    ``pool`` the decision was made in."""

    admit: bool
    borrowed: int
    reason: str
    pool: str = ANY_MODEL


@dataclass(frozen=True)
class PoolState:
    """The borrowing pool of one GPU pool as seen by one queue (:func:`pool_state`).

    ``available = lendable + unassigned − borrowed`` (may be negative when lenders took their
    quota back and reclaim has not happened yet).
    """

    lendable: int
    unassigned: int
    borrowed: int

    @property
    def available(self) -> int:
        """GPUs that may still be borrowed."""
        return self.lendable + self.unassigned - self.borrowed


def _capacity_in(config: QueueConfig, capacity: Mapping[str, int], pool: str) -> int:
    return sum(n for model, n in capacity.items() if config.pool_of(model) == pool)


def pool_state(config: QueueConfig, use: Mapping[str, QueueUse], capacity: Mapping[str, int], pool: str,
               borrower: str | None = None) -> PoolState:
    """What ``borrower`` could borrow in ``pool``: the idle lendable quota of every other leaf
    queue, the capacity nobody has a quota on, and what all queues already borrow there."""
    lendable = 0
    quotas = 0
    for name in config.leaves():
        queue = config.get(name)
        quotas += queue.quota_in(pool)
        if name == borrower:
            continue
        idle = max(0, queue.quota_in(pool) - use.get(name, _NO_USE).held_in(config, pool).total)
        lendable += min(queue.lend_in(pool), idle)
    borrowed = sum(u.held_in(config, pool).borrowed for u in use.values())
    unassigned = max(0, _capacity_in(config, capacity, pool) - quotas)
    return PoolState(lendable=lendable, unassigned=unassigned, borrowed=borrowed)


def _subtree_use(config: QueueConfig, use: Mapping[str, QueueUse], name: str) -> list[QueueUse]:
    return [use[q] for q in (name, *config.descendants(name)) if q in use]


def admit(config: QueueConfig, use: Mapping[str, QueueUse], capacity: Mapping[str, int],
          demand: Demand) -> AdmissionDecision:
    """Decide ``demand`` against the queues' quotas, limits and the borrowing pool (module docstring).

    Deciding several tasks in one cycle, add each admitted task to ``use`` (its GPUs as own and
    ``borrowed``) before deciding the next, or two tasks may be admitted on the same idle quota.

    :param use: per queue name, what its running tasks hold (a queue missing holds nothing).
    :param capacity: GPUs in the cluster per concrete GPU model.
    :raises ValidationError: ``demand.queue`` names no leaf queue, or a count is negative.
    """
    if demand.queue not in config:
        raise ValidationError("demand.queue", f"no queue named {demand.queue!r}")
    if not config.is_leaf(demand.queue):
        raise ValidationError("demand.queue", f"queue {demand.queue} has child queues; submit to one of them")
    if isinstance(demand.gpus, bool) or not isinstance(demand.gpus, int) or demand.gpus < 0:
        raise ValidationError("demand.gpus", f"{demand.gpus!r} is not a whole number ≥ 0")
    for name in ("cpu", "mem_gib"):
        if getattr(demand, name) < 0:
            raise ValidationError(f"demand.{name}", f"{getattr(demand, name)!r} is below 0")
    model = normalise_model(demand.gpu_model)
    if not config.managed:
        return AdmissionDecision(True, 0, "No queues are configured, so every task is admitted.", config.pool_of(model))
    refused = _caps(config, use, demand)
    if refused is not None:
        return AdmissionDecision(False, 0, refused, config.pool_of(model))
    if model != ANY_MODEL:
        return _admit_in(config, use, capacity, demand, config.pool_of(model))
    pools = config.pools(capacity) or (ANY_MODEL,)
    decisions = [_admit_in(config, use, capacity, demand, pool) for pool in pools]
    admitted = [d for d in decisions if d.admit]
    if admitted:
        return min(admitted, key=lambda d: d.borrowed)      # min keeps the first of equals
    if len(decisions) == 1:
        return decisions[0]
    return AdmissionDecision(False, 0, " ".join(f"For {_pool_words(d.pool)}: {d.reason}" for d in decisions),
                             decisions[0].pool)


def _pool_words(pool: str) -> str:
    return "GPUs of models no queue names" if pool == ANY_MODEL else f"{pool} GPUs"


def _gpus(n: int, pool: str) -> str:
    """``1 GPU``, ``5 GPUs``, ``5 GPUs of model H100``: a count in words, for reasons."""
    return f"{n} GPU{'' if n == 1 else 's'}" + ("" if pool == ANY_MODEL else f" of model {pool}")


def _caps(config: QueueConfig, use: Mapping[str, QueueUse], demand: Demand) -> str | None:
    for name in (demand.queue, *config.ancestors(demand.queue)):
        queue = config.get(name)
        held = _subtree_use(config, use, name)
        for resource, unit in (("cpu", "cores"), ("mem_gib", "GiB of memory")):
            cap = getattr(queue, resource)
            asked = getattr(demand, resource)
            if cap is None or asked == 0:
                continue
            total = sum(getattr(u, resource) for u in held) + asked
            if total > cap:
                return (f"Queue {name}'s tasks would ask for {total:g} {unit} in all with this one, more than its "
                        f"cap of {cap:g} {unit}.")
    return None


def _admit_in(config: QueueConfig, use: Mapping[str, QueueUse], capacity: Mapping[str, int], demand: Demand,
              pool: str) -> AdmissionDecision:
    queue = config.get(demand.queue)
    quota = queue.quota_in(pool)
    held = use.get(queue.name, _NO_USE).held_in(config, pool).total
    total = held + demand.gpus
    if total <= quota:
        return AdmissionDecision(True, 0,
                                 f"Queue {queue.name} would hold {_gpus(total, pool)} with this task, within its "
                                 f"quota of {quota}.", pool)
    borrowed = min(demand.gpus, total - quota)
    limit = queue.limit_in(pool)
    if limit is not None and total > limit:
        return AdmissionDecision(False, 0,
                                 f"Queue {queue.name} would hold {_gpus(total, pool)} with this task, more than "
                                 f"its limit of {limit}; its quota is {quota}.", pool)
    for name in config.ancestors(queue.name):
        ancestor_limit = config.get(name).limit_in(pool)
        if ancestor_limit is None:
            continue
        subtree = sum(u.held_in(config, pool).total for u in _subtree_use(config, use, name)) + demand.gpus
        if subtree > ancestor_limit:
            return AdmissionDecision(False, 0,
                                     f"Queue {name}, above queue {queue.name}, would hold {_gpus(subtree, pool)} "
                                     f"in all with this task, more than its limit of {ancestor_limit}.", pool)
    state = pool_state(config, use, capacity, pool, borrower=queue.name)
    if borrowed > state.available:
        return AdmissionDecision(False, 0,
                                 f"Queue {queue.name} would hold {_gpus(total, pool)} with this task, more than "
                                 f"its quota of {quota}, so the task needs {borrowed} borrowed; only "
                                 f"{max(0, state.available)} can be borrowed now ({state.lendable} lent by other "
                                 f"queues plus {state.unassigned} under no queue's quota, minus {state.borrowed} "
                                 f"already borrowed).", pool)
    return AdmissionDecision(True, borrowed,
                             f"Queue {queue.name} would hold {_gpus(total, pool)} with this task: "
                             f"{total - borrowed} within its quota of {quota} and {borrowed} borrowed, of "
                             f"{state.available} that can be borrowed.", pool)


def room(config: QueueConfig, use: Mapping[str, QueueUse], capacity: Mapping[str, int], queue: str,
         pool: str) -> int:
    """The most GPUs ``queue`` could be admitted in ``pool`` now (what an elastic task of it may grow by): its idle
    quota plus what it may borrow, within its limit and its ancestors' limits over their subtrees; the same rule as
    :func:`admit` (a demand of up to this many GPUs is admitted, ignoring cores and memory), 0 when none.

    :raises ValidationError: ``queue`` names no leaf queue.
    """
    if queue not in config or not config.is_leaf(queue):
        raise ValidationError("queue", f"no leaf queue named {queue!r}")
    if not config.managed:
        return _capacity_in(config, capacity, pool)
    q = config.get(queue)
    held = use.get(queue, _NO_USE).held_in(config, pool).total
    idle_quota = max(0, q.quota_in(pool) - held)
    most = idle_quota + max(0, pool_state(config, use, capacity, pool, borrower=queue).available)
    limit = q.limit_in(pool)
    if limit is not None:
        most = min(most, limit - held)
    for name in config.ancestors(queue):
        above = config.get(name).limit_in(pool)
        if above is not None:
            most = min(most, above - sum(u.held_in(config, pool).total for u in _subtree_use(config, use, name)))
    return max(0, most)
