"""Fair order across queues: weighted dominant share, with decayed past usage.

Past usage. :class:`UsageDecay` keeps, per queue, GPU-seconds and CPU core-seconds that decay
exponentially with a half-life (``half_life_h`` of the configuration): usage ``h`` ago weighs
``2^(−h / half_life)``. Time is explicit: every call passes ``now`` (seconds, any epoch, the same
for all calls); nothing here reads a clock. A ``now`` earlier than the last update is taken as
the last update (usage never grows by going back in time).

Share. For each resource ``r`` (GPUs over all models; CPU cores when a CPU capacity is given) a
queue's share is ``held_r / capacity_r + decayed_r / (capacity_r · τ)``, with ``τ = half_life / ln 2``
the mean lifetime of the decay, so that a queue that has held a fraction ``f`` of ``r`` for a long
time has a past term of ``f``: now and the past weigh alike. The **dominant share** is the largest
over the resources, and a queue's **weighted share** is its dominant share divided by its
``weight``.

:func:`order_queues` lists the leaf queues lowest weighted share first, ties by name.
:func:`order_pending` interleaves pending tasks: it repeatedly takes the next task of the queue with
the lowest weighted share, then *recomputes* that queue's share as if the task were running (its
GPUs and cores added to what the queue holds), so a queue far below its share gets several tasks
in a row. Equal shares go to the queue that has had fewer tasks taken so far, then by name, so
queues whose tasks change no share (no capacity, or tasks that ask for nothing) alternate.
Within a queue the caller's order is kept (the scheduler sorts by priority, deadline slack and
submit time).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import ValidationError
from coordinator.queues.admission import QueueUse
from coordinator.queues.model import QueueConfig

__all__ = ["Consumed", "Pending", "UsageDecay", "order_pending", "order_queues", "weighted_share"]


@dataclass(frozen=True)
class Consumed:
    """Decayed past usage of one queue: GPU-seconds and CPU core-seconds."""

    gpu_s: float = 0.0
    cpu_s: float = 0.0


class UsageDecay:
    """Per-queue GPU-seconds and core-seconds, decaying with ``half_life_s``; time passed in explicitly.

    :raises ValidationError: ``half_life_s`` is not positive.
    """

    def __init__(self, half_life_s: float) -> None:
        if not math.isfinite(half_life_s) or half_life_s <= 0:
            raise ValidationError("half_life_s", f"{half_life_s!r} is not a positive number of seconds")
        self.half_life_s = float(half_life_s)
        self._values: dict[str, tuple[float, float, float]] = {}     # queue -> (gpu_s, cpu_s, as of)

    @classmethod
    def for_config(cls, config: QueueConfig) -> UsageDecay:
        """An empty accumulator with the configuration's half-life."""
        return cls(config.half_life_h * 3600.0)

    @property
    def tau_s(self) -> float:
        """Mean lifetime of the decay, ``half_life_s / ln 2`` (seconds)."""
        return self.half_life_s / math.log(2)

    def _decayed(self, queue: str, now: float) -> tuple[float, float, float]:
        gpu_s, cpu_s, then = self._values.get(queue, (0.0, 0.0, now))
        if now <= then:
            return gpu_s, cpu_s, then
        factor = 0.5 ** ((now - then) / self.half_life_s)
        return gpu_s * factor, cpu_s * factor, now

    def add(self, queue: str, now: float, gpu_s: float = 0.0, cpu_s: float = 0.0) -> None:
        """Add usage that happened at ``now`` (e.g. one accounting interval's GPU-seconds)."""
        if gpu_s < 0 or cpu_s < 0:
            raise ValidationError("usage", f"negative usage {gpu_s!r} GPU-s, {cpu_s!r} core-s")
        old_gpu, old_cpu, then = self._decayed(queue, now)
        self._values[queue] = (old_gpu + gpu_s, old_cpu + cpu_s, then)

    def at(self, queue: str, now: float) -> Consumed:
        """The queue's decayed usage as of ``now``."""
        gpu_s, cpu_s, _ = self._decayed(queue, now)
        return Consumed(gpu_s, cpu_s)

    def snapshot(self, now: float) -> dict[str, Consumed]:
        """Every queue's decayed usage as of ``now``."""
        return {queue: self.at(queue, now) for queue in sorted(self._values)}

    def forget(self, queue: str) -> None:
        """Drop a queue's history (the queue was removed)."""
        self._values.pop(queue, None)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for storing: ``{"half_life_s", "queues": {name: [gpu_s, cpu_s, as_of]}}``."""
        return {"half_life_s": self.half_life_s, "queues": {q: list(v) for q, v in sorted(self._values.items())}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UsageDecay:
        """The accumulator :meth:`to_dict` wrote."""
        decay = cls(float(data["half_life_s"]))
        for queue, (gpu_s, cpu_s, as_of) in data.get("queues", {}).items():
            decay._values[str(queue)] = (float(gpu_s), float(cpu_s), float(as_of))
        return decay


@dataclass(frozen=True)
class Pending:
    """A pending task as :func:`order_pending` sees it: its id, queue and what it will hold."""

    task_id: str
    queue: str
    gpus: int = 0
    cpu: float = 0.0


def weighted_share(config: QueueConfig, queue: str, held_gpus: float, held_cpu: float, past: Consumed,
                   capacity: Mapping[str, int], tau_s: float, cpu_capacity: float = 0.0) -> float:
    """The queue's dominant share divided by its weight (module docstring); 0 without capacity."""
    shares = [0.0]
    gpu_capacity = sum(capacity.values())
    if gpu_capacity > 0:
        shares.append(held_gpus / gpu_capacity + past.gpu_s / (gpu_capacity * tau_s))
    if cpu_capacity > 0:
        shares.append(held_cpu / cpu_capacity + past.cpu_s / (cpu_capacity * tau_s))
    return max(shares) / config.get(queue).weight


def _past(decayed_usage: UsageDecay | Mapping[str, Consumed], queue: str, now: float) -> Consumed:
    if isinstance(decayed_usage, UsageDecay):
        return decayed_usage.at(queue, now)
    return decayed_usage.get(queue, Consumed())


def _tau_s(config: QueueConfig, decayed_usage: UsageDecay | Mapping[str, Consumed]) -> float:
    if isinstance(decayed_usage, UsageDecay):
        return decayed_usage.tau_s
    return config.half_life_h * 3600.0 / math.log(2)


def _held(use: QueueUse | None) -> tuple[float, float]:
    if use is None:
        return 0.0, 0.0
    return float(sum(h.total for h in use.gpus.values())), use.cpu


def order_queues(config: QueueConfig, current_use: Mapping[str, QueueUse],
                 decayed_usage: UsageDecay | Mapping[str, Consumed], capacity: Mapping[str, int], now: float,
                 cpu_capacity: float = 0.0) -> list[str]:
    """The leaf queues, lowest weighted dominant share first, ties by name.

    :param current_use: what each queue holds now (missing: nothing).
    :param decayed_usage: a :class:`UsageDecay` (read as of ``now``) or its :meth:`~UsageDecay.snapshot`.
    :param capacity: GPUs in the cluster per model.
    :param cpu_capacity: cores in the cluster; 0 leaves CPU out of the dominant share.
    """
    tau = _tau_s(config, decayed_usage)
    keyed = []
    for name in config.leaves():
        gpus, cpu = _held(current_use.get(name))
        share = weighted_share(config, name, gpus, cpu, _past(decayed_usage, name, now), capacity, tau, cpu_capacity)
        keyed.append((share, name))
    return [name for _, name in sorted(keyed)]


def order_pending(config: QueueConfig, pending: Sequence[Pending], current_use: Mapping[str, QueueUse],
                  decayed_usage: UsageDecay | Mapping[str, Consumed], capacity: Mapping[str, int], now: float,
                  cpu_capacity: float = 0.0) -> list[str]:
    """Task ids of ``pending`` in fair order: lowest weighted share first, the share recomputed
    after each task taken (module docstring); within a queue, the order given.

    :raises ValidationError: a task names no queue of the configuration.
    """
    tau = _tau_s(config, decayed_usage)
    by_queue: dict[str, deque[Pending]] = defaultdict(deque)
    for i, task in enumerate(pending):
        if task.queue not in config:
            raise ValidationError(f"pending[{i}].queue", f"no queue named {task.queue!r}")
        by_queue[task.queue].append(task)
    held = {name: list(_held(current_use.get(name))) for name in by_queue}
    past = {name: _past(decayed_usage, name, now) for name in by_queue}

    def share(name: str) -> float:
        gpus, cpu = held[name]
        return weighted_share(config, name, gpus, cpu, past[name], capacity, tau, cpu_capacity)

    taken = dict.fromkeys(by_queue, 0)
    heap = [(share(name), 0, name) for name in by_queue]
    heapq.heapify(heap)
    order: list[str] = []
    while heap:
        _, _, name = heapq.heappop(heap)
        task = by_queue[name].popleft()
        order.append(task.task_id)
        held[name][0] += task.gpus
        held[name][1] += task.cpu
        taken[name] += 1
        if by_queue[name]:
            heapq.heappush(heap, (share(name), taken[name], name))
    return order
