"""What running tasks hold: :class:`QueueHolding`, and the views admission and reclaim need of it.

- :func:`rebalance` recomputes each task's ``borrowed`` count from its queue's quota: per queue
  and GPU pool, the **oldest** tasks (earliest ``start_time``, then task id) fill the quota first
  and what lies beyond it is borrowed. Call it whenever tasks end or the configuration changes, so
  that a queue whose own tasks ended no longer shows its remaining tasks as borrowing (and so
  that the newest tasks, which reclaim preempts first, are the borrowing ones).
- :func:`queue_use` sums holdings into the per-queue :class:`~coordinator.queues.admission.QueueUse`
  that :func:`~coordinator.queues.admission.admit` and the fair order take.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from coordinator.queues.admission import Held, QueueUse
from coordinator.queues.model import QueueConfig

__all__ = ["QueueHolding", "queue_use", "rebalance"]


@dataclass(frozen=True)
class QueueHolding:
    """A running task as the queue model sees it.

    :param gpus: GPUs it holds (all of ``gpu_model``).
    :param borrowed: how many of them are beyond its queue's quota (0 ≤ borrowed ≤ gpus).
    :param start_time: when it started (seconds, the caller's epoch); newer tasks are reclaimed first.
    :param cpu: cores it asked for; ``mem_gib``: memory it asked for.
    :param nodes: GPUs it holds on each node, when the caller knows (reclaim then frees whole nodes'
        worth for tasks that need them; :func:`~coordinator.queues.reclaim.reclaim_victims`).
    """

    task_id: str
    queue: str
    gpu_model: str
    gpus: int
    borrowed: int
    preemptible: bool
    start_time: float
    cpu: float = 0.0
    mem_gib: float = 0.0
    nodes: Mapping[str, int] = field(default_factory=dict, compare=False)


def rebalance(config: QueueConfig, holdings: Sequence[QueueHolding]) -> list[QueueHolding]:
    """``holdings`` (same order) with ``borrowed`` recomputed: oldest tasks within quota first."""
    remaining: dict[tuple[str, str], int] = {}
    borrowed: dict[str, int] = {}
    for h in sorted(holdings, key=lambda h: (h.start_time, h.task_id)):
        pool = config.pool_of(h.gpu_model)
        key = (h.queue, pool)
        if key not in remaining:
            remaining[key] = config.get(h.queue).quota_in(pool) if h.queue in config and config.managed else 0
        own = min(h.gpus, remaining[key])
        remaining[key] -= own
        borrowed[h.task_id] = h.gpus - own if config.managed else 0
    return [h if h.borrowed == borrowed[h.task_id] else replace(h, borrowed=borrowed[h.task_id]) for h in holdings]


def queue_use(holdings: Sequence[QueueHolding]) -> dict[str, QueueUse]:
    """Per queue: GPUs per model (own and borrowed as the holdings say), cores and memory."""
    gpus: dict[str, dict[str, Held]] = defaultdict(dict)
    cpu: dict[str, float] = defaultdict(float)
    mem: dict[str, float] = defaultdict(float)
    for h in holdings:
        per_model = gpus[h.queue]
        per_model[h.gpu_model] = per_model.get(h.gpu_model, Held()) + Held(h.gpus - h.borrowed, h.borrowed)
        cpu[h.queue] += h.cpu
        mem[h.queue] += h.mem_gib
    return {q: QueueUse(gpus=dict(gpus[q]), cpu=cpu[q], mem_gib=mem[q]) for q in gpus}
