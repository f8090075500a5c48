"""Reclaim: a queue below its quota takes back GPUs that other queues borrow.

:func:`reclaim_victims` looks at the ``waiting`` demands in the order given (the scheduler passes
them in fair order, :mod:`coordinator.queues.fairshare`). A demand is **owed** when its queue's
GPUs in the demand's pool plus the demand are within the queue's quota; then the *scope* of the
claim is the queue itself. Failing that, it is owed within an ancestor's quota when that
ancestor's subtree holds, with the demand, no more than the ancestor's quota (a parent whose quota
exceeds its children's keeps the remainder for them); the scope is then the nearest such ancestor.
A demand owed nowhere reclaims nothing (it would borrow, which admission decides), with one exception:

**A queue under its quota with a larger task** (its GPUs in the pool below its quota, but its
held GPUs plus the demand above it, within its limit and its ancestors' limits) makes a *partial
claim* for the whole task, after every owed demand has made its claim: the scope is the queue, and
victims come only from queues that hold more than their quota by at least the victims' GPUs, so
no queue is brought under its quota for it. Without it, a team whose jobs are larger than what is
left of its quota would only ever borrow, and under contention nobody lends. Once its task runs
the queue is over its quota, so it makes no further partial claim, and its borrowing task can be
taken back by queues owed within their quota like any borrower.

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

**Where the GPUs are** (``free_by_node`` given, and a demand that says how many GPUs it needs on each
of how many nodes, ``per_node`` × ``node_count``): GPUs scattered over many nodes do not place an
8-GPU task or a gang of whole nodes, so the claim is made node by node instead. For each node of the
model, the GPUs free there (and those of victims already chosen) count first; the rest come from the
newest eligible tasks holding GPUs on that node, just enough of them; a node that cannot be freed
that way is out. The ``node_count`` nodes that cost the fewest preempted GPUs (then by name) are
taken, and their victims are the claim's; with fewer such nodes, nothing is preempted.

The ``borrowed`` counts are taken as given; :func:`~coordinator.queues.holdings.rebalance` keeps
them current as tasks end.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coordinator.queues.admission import Demand
from coordinator.queues.holdings import QueueHolding
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


def reclaim_victims(config: QueueConfig, holdings: Sequence[QueueHolding], waiting: Sequence[Demand],
                    free: Mapping[str, int] | None = None,
                    free_by_node: Mapping[str, tuple[str, int]] | None = None) -> list[Victim]:
    """Victims to preempt for the ``waiting`` demands owed within their quota (module docstring).

    :param holdings: every running task.
    :param waiting: pending demands, in the order they should be served.
    :param free: GPUs free now per concrete model (default: none).
    :param free_by_node: node → (its GPU model, GPUs free there now): claims of demands that give
        ``per_node`` are then made node by node (module docstring).
    """
    if not config.managed:
        return []
    spare: dict[str, int] = defaultdict(int, free or {})
    node_spare: dict[str, list] = {n: [normalise_model(m), f] for n, (m, f) in (free_by_node or {}).items()}
    held: dict[tuple[str, str], int] = defaultdict(int)            # (queue, pool) -> GPUs
    for h in holdings:
        held[h.queue, config.pool_of(h.gpu_model)] += h.gpus
    taken: set[str] = set()
    models = sorted({normalise_model(h.gpu_model) for h in holdings} | {m for m, n in spare.items() if n > 0})
    victims: list[Victim] = []
    claimed: set[int] = set()
    for partial in (False, True):
        for i, demand in enumerate(waiting):
            if i in claimed or demand.queue not in config or not config.is_leaf(demand.queue) or demand.gpus <= 0:
                continue
            if _claim(config, holdings, demand, partial, held, taken, spare, node_spare, models, victims,
                      free_by_node is not None):
                claimed.add(i)
    return victims


def _claim(config: QueueConfig, holdings: Sequence[QueueHolding], demand: Demand, partial: bool,
           held: dict[tuple[str, str], int], taken: set[str], spare: dict[str, int], node_spare: Mapping[str, list],
           models: Sequence[str], victims: list[Victim], by_node: bool) -> bool:
    """One demand's claim (owed, or with ``partial`` a queue under its quota claiming up to its job's size;
    module docstring): its victims appended and the books updated. True when it was claimed."""
    queue = config.get(demand.queue)
    model = normalise_model(demand.gpu_model)
    best: tuple[int, str, list[QueueHolding], list[str]] | None = None
    for candidate_model in (models if model == ANY_MODEL else [model]):
        pool = config.pool_of(candidate_model)
        allowance: dict[str, int] | None = None
        if partial:
            if not _under_quota(config, held, queue.name, pool, demand.gpus):
                continue
            scope: frozenset[str] | None = frozenset((queue.name,))
            allowance = {q: held.get((q, pool), 0) - config.get(q).quota_in(pool) for q in config.leaves()}
        else:
            scope = _scope(config, held, queue.name, pool, demand.gpus)
        if scope is None:
            continue                                                # not owed: it would borrow
        nodes: list[str] = []
        if by_node and demand.per_node > 0:
            covered = _cover_nodes(holdings, taken, scope, candidate_model, demand, node_spare, allowance)
            chosen, nodes = covered if covered is not None else (None, [])
        else:
            chosen = _cover(holdings, taken, scope, candidate_model, demand.gpus - spare[candidate_model], allowance)
        if chosen is None:
            continue
        cost = sum(h.gpus for h in chosen)
        if best is None or cost < best[0]:
            best = (cost, candidate_model, chosen, nodes)
    if best is None:
        return False
    _, chosen_model, chosen, chosen_nodes = best
    freed = spare[chosen_model] + sum(h.gpus for h in chosen)
    spare[chosen_model] = freed - demand.gpus
    held[queue.name, config.pool_of(chosen_model)] += demand.gpus
    for h in chosen:
        taken.add(h.task_id)
        held[h.queue, config.pool_of(h.gpu_model)] -= h.gpus
        victims.append(Victim(h.task_id, h.queue, h.gpu_model, h.gpus, h.borrowed, queue.name))
        for node, gpus in h.nodes.items():                          # freed where it ran
            if node in node_spare:
                node_spare[node][1] += gpus
    for node in chosen_nodes:                                        # the demand takes them
        node_spare[node][1] -= demand.per_node
    return True


def _under_quota(config: QueueConfig, held: Mapping[tuple[str, str], int], queue: str, pool: str, gpus: int) -> bool:
    """Whether a queue holds less than its quota in ``pool`` and the demand keeps it within its limits (its own and
    its ancestors' over their subtrees): what a partial claim needs."""
    mine = held.get((queue, pool), 0)
    limit = config.get(queue).limit_in(pool)
    if mine >= config.get(queue).quota_in(pool) or (limit is not None and mine + gpus > limit):
        return False
    for name in config.ancestors(queue):
        above = config.get(name).limit_in(pool)
        if above is not None and sum(held.get((q, pool), 0) for q in (name, *config.descendants(name))) + gpus > above:
            return False
    return True


def _eligible(h: QueueHolding, taken: set[str], scope: frozenset[str], model: str,
              allowance: Mapping[str, int] | None) -> bool:
    """Whether a task may be a victim of a claim: borrowing, preemptible, of ``model``, outside the claim's scope,
    not chosen yet, and (``allowance`` given: a partial claim) its queue over its quota by at least its GPUs."""
    return (h.queue not in scope and h.borrowed > 0 and h.preemptible and h.gpus > 0 and h.task_id not in taken
            and normalise_model(h.gpu_model) == model and (allowance is None or h.gpus <= allowance.get(h.queue, 0)))


def _within(chosen: Sequence[QueueHolding], allowance: Mapping[str, int] | None) -> bool:
    """Whether the victims leave every queue at or above its quota (always, without an ``allowance``)."""
    if allowance is None:
        return True
    took: dict[str, int] = defaultdict(int)
    for h in chosen:
        took[h.queue] += h.gpus
    return all(n <= allowance.get(q, 0) for q, n in took.items())


def _node_options(holdings: Sequence[QueueHolding], taken: set[str], scope: frozenset[str], model: str,
                  per_node: int, node_spare: Mapping[str, list],
                  allowance: Mapping[str, int] | None = None) -> list[tuple[int, str, list[QueueHolding]]]:
    """Per node of ``model`` that can be freed for ``per_node`` GPUs: (GPUs preempted, node, victims)."""
    on_node: dict[str, list[QueueHolding]] = defaultdict(list)
    for h in holdings:
        if _eligible(h, taken, scope, model, allowance):
            for node in h.nodes:
                on_node[node].append(h)
    options = []
    for node, (node_model, spare) in node_spare.items():
        if node_model != model:
            continue
        missing = per_node - spare
        chosen: list[QueueHolding] = []
        if missing > 0:
            total = 0
            for h in sorted(on_node.get(node, ()), key=lambda h: (h.start_time, h.task_id), reverse=True):
                if total >= missing:
                    break
                chosen.append(h)
                total += h.nodes[node]
            if total < missing:
                continue
            for h in list(chosen):                                  # let go of the ones not needed
                if total - h.nodes[node] >= missing:
                    chosen.remove(h)
                    total -= h.nodes[node]
            if not _within(chosen, allowance):
                continue
        options.append((sum(h.gpus for h in chosen), node, chosen))
    return sorted(options, key=lambda o: (o[0], o[1]))


def _cover_nodes(holdings: Sequence[QueueHolding], taken: set[str], scope: frozenset[str], model: str, demand: Demand,
                 node_spare: Mapping[str, list],
                 allowance: Mapping[str, int] | None = None) -> tuple[list[QueueHolding], list[str]] | None:
    """Victims that free ``demand.per_node`` GPUs on each of ``demand.node_count`` nodes of ``model``, and those
    nodes (module docstring); None when too few nodes can be freed."""
    options = _node_options(holdings, taken, scope, model, demand.per_node, node_spare, allowance)
    if len(options) < max(1, demand.node_count):
        return None
    chosen: dict[str, QueueHolding] = {}
    nodes = []
    for _cost, node, victims in options[:max(1, demand.node_count)]:
        chosen.update((h.task_id, h) for h in victims)
        nodes.append(node)
    if not _within(list(chosen.values()), allowance):
        return None
    return list(chosen.values()), nodes


def _scope(config: QueueConfig, held: Mapping[tuple[str, str], int], queue: str, pool: str,
           gpus: int) -> frozenset[str] | None:
    """The queues a demand's claim covers (module docstring), or None when it is owed nowhere."""
    for name in (queue, *config.ancestors(queue)):
        subtree = (name, *config.descendants(name))
        if sum(held.get((q, pool), 0) for q in subtree) + gpus <= config.get(name).quota_in(pool):
            return frozenset(subtree)
    return None


def _cover(holdings: Sequence[QueueHolding], taken: set[str], scope: frozenset[str], model: str,
           missing: int, allowance: Mapping[str, int] | None = None) -> list[QueueHolding] | None:
    """Just enough borrowing, preemptible tasks of ``model`` outside ``scope`` to free ``missing``
    GPUs, newest first (with an ``allowance``: no more from a queue than it holds beyond its quota);
    ``[]`` when nothing is missing, None when they cannot cover it."""
    if missing <= 0:
        return []
    candidates = sorted((h for h in holdings if _eligible(h, taken, scope, model, allowance)),
                        key=lambda h: (h.start_time, h.task_id), reverse=True)
    chosen: list[QueueHolding] = []
    total = 0
    left = dict(allowance) if allowance is not None else None
    for h in candidates:
        if total >= missing:
            break
        if left is not None:
            if h.gpus > left.get(h.queue, 0):
                continue
            left[h.queue] -= h.gpus
        chosen.append(h)
        total += h.gpus
    if total < missing:
        return None
    for h in list(chosen):                                          # let go of the ones not needed
        if total - h.gpus >= missing:
            chosen.remove(h)
            total -= h.gpus
    return chosen
