"""Reclaim: a queue below its quota takes back GPUs that other queues borrow.

:func:`reclaim_victims` looks at the ``waiting`` demands in the order given (the scheduler passes
them in fair order, :mod:`coordinator.queues.fairshare`). A demand is **owed** when its queue's
GPUs in the demand's pool plus the demand are within the queue's quota; then the *scope* of the
claim is the queue itself. Failing that, it is owed within an ancestor's quota when that
ancestor's subtree holds, with the demand, no more than the ancestor's quota (a parent whose quota
exceeds its children's keeps the remainder for them); the scope is then the nearest such ancestor.
A demand owed nowhere reclaims nothing (it would borrow, which admission decides).

For each owed demand, GPUs of the demand's model that are free now (``free``) are used first; for
the rest, victims are chosen among the tasks of queues *outside the scope* (for a claim within the
queue's own quota: every other queue; within an ancestor's: queues outside that ancestor's
subtree, so siblings sharing the ancestor's quota are not preempted for it) that

- hold borrowed GPUs (``borrowed > 0``): a task wholly within its queue's quota is never a
  victim of another queue;
- are preemptible; and
- hold GPUs of the demand's model (for a demand of ``"*"``, each model of the cluster is tried and
  the one needing the fewest preempted GPUs wins, ties by model name),

newest first (latest ``start_time``, then task id), until the GPUs they hold cover what is
missing; then any chosen victim that is not needed to cover it is let go again (newest first), so
the victims are just enough. Preempting a task frees all its GPUs, so a victim may free more than
its ``borrowed`` count; what is freed beyond the demand is counted as free for the next demands.
A demand whose missing GPUs the candidates cannot cover gets no victims (nothing is preempted in
vain), and a task is chosen at most once. Without configured queues nothing is reclaimed.

The ``borrowed`` counts are taken as given; :func:`~coordinator.queues.holdings.rebalance` keeps
them current as tasks end.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coordinator.queues.admission import Demand
from coordinator.queues.holdings import Holding
from coordinator.queues.model import ANY_MODEL, QueueConfig, normalise_model

__all__ = ["Victim", "reclaim_victims"]


@dataclass(frozen=True)
class Victim:
    """A task to preempt so that ``for_queue`` gets back GPUs of ``gpu_model``."""

    task_id: str
    queue: str
    gpu_model: str
    gpus: int
    borrowed: int
    for_queue: str


def reclaim_victims(config: QueueConfig, holdings: Sequence[Holding], waiting: Sequence[Demand],
                    free: Mapping[str, int] | None = None) -> list[Victim]:
    """Victims to preempt for the ``waiting`` demands owed within their quota (module docstring).

    :param holdings: every running task.
    :param waiting: pending demands, in the order they should be served.
    :param free: GPUs free now per concrete model (default: none).
    """
    if not config.managed:
        return []
    spare: dict[str, int] = defaultdict(int, free or {})
    held: dict[tuple[str, str], int] = defaultdict(int)            # (queue, pool) -> GPUs
    for h in holdings:
        held[h.queue, config.pool_of(h.gpu_model)] += h.gpus
    taken: set[str] = set()
    models = sorted({normalise_model(h.gpu_model) for h in holdings} | {m for m, n in spare.items() if n > 0})
    victims: list[Victim] = []
    for demand in waiting:
        if demand.queue not in config or not config.is_leaf(demand.queue) or demand.gpus <= 0:
            continue
        queue = config.get(demand.queue)
        model = normalise_model(demand.gpu_model)
        best: tuple[int, str, list[Holding]] | None = None
        for candidate_model in (models if model == ANY_MODEL else [model]):
            pool = config.pool_of(candidate_model)
            scope = _scope(config, held, queue.name, pool, demand.gpus)
            if scope is None:
                continue                                            # not owed: it would borrow
            chosen = _cover(holdings, taken, scope, candidate_model, demand.gpus - spare[candidate_model])
            if chosen is None:
                continue
            cost = sum(h.gpus for h in chosen)
            if best is None or cost < best[0]:
                best = (cost, candidate_model, chosen)
        if best is None:
            continue
        _, chosen_model, chosen = best
        freed = spare[chosen_model] + sum(h.gpus for h in chosen)
        spare[chosen_model] = freed - demand.gpus
        held[queue.name, config.pool_of(chosen_model)] += demand.gpus
        for h in chosen:
            taken.add(h.task_id)
            held[h.queue, config.pool_of(h.gpu_model)] -= h.gpus
            victims.append(Victim(h.task_id, h.queue, h.gpu_model, h.gpus, h.borrowed, queue.name))
    return victims


def _scope(config: QueueConfig, held: Mapping[tuple[str, str], int], queue: str, pool: str,
           gpus: int) -> frozenset[str] | None:
    """The queues a demand's claim covers (module docstring), or None when it is owed nowhere."""
    for name in (queue, *config.ancestors(queue)):
        subtree = (name, *config.descendants(name))
        if sum(held.get((q, pool), 0) for q in subtree) + gpus <= config.get(name).quota_in(pool):
            return frozenset(subtree)
    return None


def _cover(holdings: Sequence[Holding], taken: set[str], scope: frozenset[str], model: str,
           missing: int) -> list[Holding] | None:
    """Just enough borrowing, preemptible tasks of ``model`` outside ``scope`` to free ``missing``
    GPUs, newest first; ``[]`` when nothing is missing, None when they cannot cover it."""
    if missing <= 0:
        return []
    candidates = sorted((h for h in holdings
                         if h.queue not in scope and h.borrowed > 0 and h.preemptible and h.gpus > 0
                         and normalise_model(h.gpu_model) == model and h.task_id not in taken),
                        key=lambda h: (h.start_time, h.task_id), reverse=True)
    chosen: list[Holding] = []
    total = 0
    for h in candidates:
        if total >= missing:
            break
        chosen.append(h)
        total += h.gpus
    if total < missing:
        return None
    for h in list(chosen):                                          # let go of the ones not needed
        if total - h.gpus >= missing:
            chosen.remove(h)
            total -= h.gpus
    return chosen
