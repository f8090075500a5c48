"""Team queues: the model, admission, planning in the scheduling cycle, storage and administration.

The pure model (no etcd, no gRPC, no clock), which this package's ``__init__`` exports:

- :mod:`~coordinator.queues.model` — the queue tree (:class:`Queue`, :class:`QueueConfig`), GPU
  pools, access (``may_submit``, ``default_queue``) and :class:`Budget` (prices are not part of the
  queue tree: they are the coordinator's flags, applied by :mod:`coordinator.usage.report`).
- :mod:`~coordinator.queues.tomlfile` — the configuration file (:func:`load_toml`).
- :mod:`~coordinator.queues.admission` — quota, limit and borrowing (:func:`admit`; :func:`room`, what a
  queue could still be admitted, which elastic tasks grow by).
- :mod:`~coordinator.queues.fairshare` — weighted dominant share with decayed usage
  (:class:`UsageDecay`, :func:`order_queues`, :func:`order_pending`).
- :mod:`~coordinator.queues.holdings` — running tasks (:class:`QueueHolding`), their ``borrowed`` counts
  recomputed (:func:`rebalance`) and summed per queue (:func:`queue_use`).
- :mod:`~coordinator.queues.reclaim` — taking borrowed GPUs back (:func:`reclaim_victims`).
- :mod:`~coordinator.queues.budget` — budget readings, the 80 % warning and the gate past 100 %.

The model works on plain values passed in (what each queue holds, the cluster's capacity,
``now``); the modules below build those values from the leader's state and act on the answers
(imported by their own path, not exported here):

- :mod:`~coordinator.queues.planning` — the queues in the scheduling cycle (:func:`plan_queues`, which
  the leader's cycle and the simulator both call; :class:`LeaderQueues`; :func:`reclaim_for`).
- :mod:`~coordinator.queues.admin` — the admin's changes to the tree, who may submit where, budgets
  (:class:`QueueAdmin`, :class:`QueueMetrics`).

The tree's storage in etcd is :mod:`coordinator.sync.queues` (:class:`~coordinator.sync.queues.QueueStore`):
``coordinator/sync/`` is the only package that talks to etcd.
"""

from __future__ import annotations

from coordinator.queues.admission import AdmissionDecision, Demand, Held, PoolState, QueueUse, admit, pool_state, room
from coordinator.queues.budget import (
    WARN_FRACTION,
    BudgetState,
    Gate,
    budget_gate,
    budget_state,
    lines_crossed,
    period_start,
)
from coordinator.queues.fairshare import Consumed, Pending, UsageDecay, order_pending, order_queues, weighted_share
from coordinator.queues.holdings import QueueHolding, queue_use, rebalance
from coordinator.queues.model import (
    ANY_MODEL,
    DEFAULT_HALF_LIFE_H,
    DEFAULT_QUEUE,
    MAX_DEPTH,
    MAX_QUEUES,
    NAME_PATTERN,
    Budget,
    BudgetAction,
    BudgetKind,
    BudgetPeriod,
    Queue,
    QueueConfig,
    normalise_model,
)
from coordinator.queues.reclaim import Victim, reclaim_victims
from coordinator.queues.tomlfile import dumps_toml, load_toml, loads_toml

__all__ = [
    "ANY_MODEL",
    "DEFAULT_HALF_LIFE_H",
    "DEFAULT_QUEUE",
    "MAX_DEPTH",
    "MAX_QUEUES",
    "NAME_PATTERN",
    "WARN_FRACTION",
    "AdmissionDecision",
    "Budget",
    "BudgetAction",
    "BudgetKind",
    "BudgetPeriod",
    "BudgetState",
    "Consumed",
    "Demand",
    "Gate",
    "Held",
    "Pending",
    "PoolState",
    "Queue",
    "QueueConfig",
    "QueueHolding",
    "QueueUse",
    "UsageDecay",
    "Victim",
    "admit",
    "budget_gate",
    "budget_state",
    "dumps_toml",
    "lines_crossed",
    "load_toml",
    "loads_toml",
    "normalise_model",
    "order_pending",
    "order_queues",
    "period_start",
    "pool_state",
    "queue_use",
    "rebalance",
    "reclaim_victims",
    "room",
    "weighted_share",
]
