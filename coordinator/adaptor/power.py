"""Node power states and the leader's power manager (Resource Adaptor, scale-in and scale-out).

Each node record carries a power state (``NodeRecord.power_state``; unset reads as ready)::

    ready → draining → powering-off → off → powering-on → ready

- **Scale-in**: a node idle (connected, ready, no task) longer than ``--power-down-after``, beyond
  the ``--spare-nodes`` idle nodes kept on, and usable by no pending task (a pending task that fits on
  none of the idle nodes keeps none of them on, nor does one the workflow rules hold back past
  ``--wake-timeout``: a start time later than that, a dependency not met), goes *draining* (nothing new
  lands on it), is confirmed
  idle after one more scheduling period, goes *powering-off* and is handed to the node provider;
  once the provider accepted it is *off* as soon as its agent is silent. A node that got work
  meanwhile, or a provider failure, returns it to *ready* (its last safe state: it is still on).
- **A power-off that did not happen**: a node whose agent still streams ``--power-off-grace``
  seconds after the provider accepted its power-off (the same stream, never silent: heard from
  within three heartbeat intervals, :meth:`NodeRegistry.stream_live`) is reported
  once (a ``power`` event, ``gptrm_adaptor_power_off_ignored_total``) and goes back to *ready*: it
  is on and takes work. It is not powered off again before ``--power-off-retry`` seconds, a wait
  that doubles with each further ignored power-off (up to ``--power-off-retry-max``) and is
  forgotten once a power-off of the node takes effect. So a node is shown *off* only while silent.
- **Reservations**: a node holding GPUs of a reservation that is active or starts within ``--wake-timeout``
  is never powered down, and is woken when off (``coordinator/reservations.py``).
- **Scale-out**: when the scheduler could not place a pending task (the cycle's rejection hook),
  and the ready nodes cannot hold it but off nodes would (fitting as the placement filter itself
  decides, :class:`~coordinator.scheduler.snapshot.NodeFit`: constraints, every dimension at or under
  its limit after placement under the policy's threshold and threshold mode, GPUs with the memory and
  share asked for), the off node that adds the least idle power (Alg. 3's measure; fewest GPUs that
  fit, then node id) goes *powering-on* and the provider is asked to power it on. It is *ready* again when its agent
  registers; a node that does not register within ``--wake-timeout`` is asked again. A provider
  failure leaves it *off*.

Every change is a fenced write of the node record, made under the node's etcd lock
(``locks/power-<node>``), published as a ``power`` event and logged. After a leader change the
new leader resumes from the stored states: *draining* rolls back to *ready*, *powering-off* is
handed to the provider again (or rolled back when the node got work), *powering-on* waits for
the agent with a fresh deadline; a power-off accepted by the old leader but not yet silent is
asked for again. A node whose power state is not ready is never schedulable, and
an absent stream of a node that is off or switching is expected: it never becomes ``lost``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Protocol, TypeAlias, TypeVar

from common.errors import GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.pbenum import pb_enum
from common.types import NodeState, TaskState
from coordinator.adaptor.providers import NodeProvider, ProviderResult
from coordinator.events import EventBus
from coordinator.monitor.nodes import NodeEntry, NodeRegistry
from coordinator.power_states import power_label
from coordinator.state import LeaderState
from coordinator.supervisor import Beat, no_beat

__all__ = ["PowerManager"]

R = TypeVar("R")


class NodeStore(Protocol):
    """Where node records are written (``Store``; the simulator keeps them in memory)."""

    def put_node(self, record: types_pb2.NodeRecord) -> types_pb2.NodeRecord: ...


class FencedWriter(Protocol):
    """Runs a store write as the leader (``Leadership``; the simulator is its only replica)."""

    async def write(self, fn: Callable[..., R], *args: object, **kwargs: object) -> R: ...


class NodeLocks(Protocol):
    """Per-node admin locks (``AdminLocks``; nobody else takes them in the simulator)."""

    def hold(self, name: str) -> AbstractAsyncContextManager[None]: ...

PS = types_pb2.NodePowerState

Fit: TypeAlias = Callable[[types_pb2.Task], Callable[[NodeEntry], bool]]
"""For a task, whether a node could take its one-node share now, power state set aside (an off node
holds nothing); tasks of one shape get the same predicate: :class:`coordinator.scheduler.snapshot.NodeFit`,
the placement filter."""


def _is_ready(entry: NodeEntry) -> bool:
    return power_label(entry.record.power_state) == "ready"


class PowerManager:
    """Powers idle nodes down and wakes off nodes for tasks that need them, while this replica leads.

    :param registry: the node table.
    :param state: the leader's state: every task by id (pending ones are candidates for a wake); it
        follows each power state etcd stored.
    :param store: the fenced etcd store (``nodes/<id>``).
    :param leadership: fenced writes.
    :param locks: per-node power locks.
    :param provider: the node provider.
    :param events: the cluster event log.
    :param power_down_after_s: idle seconds before a node is powered down (0: never).
    :param spare_nodes: idle nodes kept on.
    :param wake_timeout_s: how long a woken node may take to register.
    :param idle_power_w: a node's idle power (Alg. 3's added power when it is woken).
    :param on_change: called after every power-state change (metrics, scheduler wake-up).
    :param period_s: seconds between two steps; also the wait that confirms a draining node idle.
    :param fit: called once per step for a :data:`Fit` over the cluster as it is then.
    :param on_provider_failure: called with the action of every provider request that was tried and
        failed (``gptrm_adaptor_provider_failures_total``).
    :param power_off_grace_s: how long a node's agent may go on streaming after the provider accepted
        its power-off (the provider's shutdown time) before the power-off counts as ignored; None: the
        node is off once the provider accepted (the simulator, whose agents stop with the request).
    :param power_off_retry_s: the wait before a node whose power-off was ignored is powered off again;
        it doubles with each further ignored power-off, up to ``power_off_retry_max_s``.
    :param on_power_off_ignored: called once per ignored power-off (``gptrm_adaptor_power_off_ignored_total``).
    :param now: monotonic clock (injected in tests; the simulator's virtual clock).
    :param wall: unix clock stamped on power-state changes (the simulator's virtual clock).
    :param sleep: waits ``period_s`` before a draining node is confirmed idle (the simulator,
        whose cycles are atomic, passes a wait that returns at once).
    """

    def __init__(self, registry: NodeRegistry, state: LeaderState, store: NodeStore,
                 leadership: FencedWriter, locks: NodeLocks, provider: NodeProvider, events: EventBus, *,
                 power_down_after_s: float, spare_nodes: int, wake_timeout_s: float,
                 idle_power_w: Callable[[NodeEntry], float] = lambda e: 0.0,
                 fit: Callable[[], Fit], on_change: Callable[[], None] = lambda: None, period_s: float = 1.0,
                 on_provider_failure: Callable[[str], None] = lambda action: None,
                 power_off_grace_s: float | None = None, power_off_retry_s: float = 600.0,
                 power_off_retry_max_s: float = 14400.0, on_power_off_ignored: Callable[[], None] = lambda: None,
                 now: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._registry, self._state, self._store, self._leadership = registry, state, store, leadership
        self._locks, self._provider, self._events = locks, provider, events
        self._after, self._spare, self._wake_timeout_s = power_down_after_s, spare_nodes, wake_timeout_s
        self._idle_power_w, self._on_change, self._period_s, self._now = idle_power_w, on_change, period_s, now
        self._fit, self._on_provider_failure = fit, on_provider_failure
        self._wall, self._sleep = wall, sleep
        self._off_grace_s, self._off_retry_s, self._off_retry_max_s = (power_off_grace_s, power_off_retry_s,
                                                                       power_off_retry_max_s)
        self._on_power_off_ignored = on_power_off_ignored
        self._idle_since: dict[str, float] = {}
        # node → (when the provider accepted its power-off, the stream then open): waiting for silence.
        self._off_accepted: dict[str, tuple[float, int]] = {}
        # node → (the current wait after an ignored power-off, no power-off before): its backoff.
        self._off_backoff: dict[str, tuple[float, float]] = {}
        self._wake_deadline: dict[str, float] = {}
        self._unplaced: set[str] = set()
        self._shrunk: dict[str, types_pb2.Task] = {}   # GPUs shrinks gave up, each asked for once
        self._created: set[str] = set()          # tasks a new node was asked for
        # Reservations: node → the reservation whose GPUs there are needed within a given time (the wake time).
        self.reserved: Callable[[float], Mapping[str, str]] = lambda within_s: {}
        # The pending tasks that may start by a unix time (the scheduler's workflow rules: a start time ahead, a
        # dependency not met, an array at its limit hold a task back); every pending task unless told.
        self.startable: Callable[[float], Iterable[types_pb2.Task]] = lambda by_unix_s: self._state.pending.values()
        self._log = get_logger("adaptor")

    # ---- the scheduler's hook -------------------------------------------------------------------

    def unplaced(self, task: types_pb2.Task) -> None:
        """The scheduler could not place ``task`` this cycle: a candidate for a wake."""
        self._unplaced.add(task.id)

    def shrunk_for(self, task_id: str, gpus: int) -> None:
        """Elastic tasks gave up ``gpus`` GPUs so that waiting task ``task_id`` runs at once: wake an off node that
        holds them, as that task would have woken one had no elastic task been there; once it is up the shrunk
        tasks grow back into it. (A grow alone never wakes a node.)"""
        if gpus > 0:
            wanted = types_pb2.Task(id=f"{task_id}/shrunk", state=pb_enum(types_pb2.TaskState, TaskState.PENDING))
            wanted.demand.gpus = float(gpus)
            self._shrunk[wanted.id] = wanted

    # ---- the loop ---------------------------------------------------------------------------------

    async def run(self, beat: Beat = no_beat) -> None:
        """Step every period while leading (cancelled when leadership ends)."""
        self._idle_since.clear()
        self._wake_deadline.clear()
        self._off_accepted.clear()   # a power-off accepted under an earlier term is asked for again
        while True:
            try:
                await self.step()
            except GptrmError as e:   # etcd trouble, lock contention: the next step tries again
                self._log.warning("power_step_failed", reason=str(e))
            beat()
            await asyncio.sleep(self._period_s)

    async def step(self) -> None:
        """Resume interrupted changes, finish wakes, wake for unplaced tasks, power down idle nodes."""
        await self._resume()
        await self._wake_for_unplaced()
        await self._wake_for_reservations()
        if self._after > 0 and self._provider.can_power:
            await self._scale_in()

    async def _resume(self) -> None:
        now = self._now()
        for entry in self._registry:
            label = power_label(entry.record.power_state)
            if label == "draining" and entry.node_id not in self._busy_ids():
                await self._set(entry, PS.NODE_POWER_STATE_READY, "power-down interrupted: back in service")
            elif label == "powering-off" and entry.node_id in self._off_accepted:
                await self._await_silence(entry, now)
            elif label == "powering-off":
                await self._power_off(entry, "power-down resumed after a leader change")
            elif label == "powering-on":
                if entry.connected and entry.state == NodeState.READY:
                    self._wake_deadline.pop(entry.node_id, None)
                    await self._set(entry, PS.NODE_POWER_STATE_READY, "agent registered after power-on")
                elif now >= self._wake_deadline.setdefault(entry.node_id, now + self._wake_timeout_s):
                    self._wake_deadline.pop(entry.node_id, None)
                    await self._power_on(entry, f"not registered within {self._wake_timeout_s:g}s: asked again")
            elif label == "off" and entry.connected and entry.state == NodeState.READY:
                # Powered on by someone else (an operator): take it back into service.
                await self._set(entry, PS.NODE_POWER_STATE_READY, "agent registered while off")

    def _busy_ids(self) -> set[str]:
        return {e.node_id for e in self._registry if e.holds_tasks}

    def next_due(self) -> float | None:
        """The earliest time (``now`` clock) a step acts without anything else changing: an idle node's
        power-down deadline or a woken node's registration deadline; None when nothing is due.

        A caller that steps on events (the simulator) steps again then; the loop of :meth:`run`
        needs no such hint.
        """
        due = list(self._wake_deadline.values())
        if self._off_grace_s is not None:
            due += [accepted + self._off_grace_s for accepted, _ in self._off_accepted.values()]
        if self._after > 0 and self._provider.can_power and len(self._idle_since) > self._spare:
            due.append(min(self._idle_since.values()) + self._after)
        return min(due, default=None)

    # ---- scale-in ---------------------------------------------------------------------------------

    async def _scale_in(self) -> None:
        now = self._now()
        idle: list[NodeEntry] = []
        for entry in self._registry:
            backoff = self._off_backoff.get(entry.node_id)
            if backoff is not None and now < backoff[1]:
                self._idle_since.pop(entry.node_id, None)   # its last power-off was ignored: not yet again
            elif entry.connected and entry.state == NodeState.READY and _is_ready(entry) and not entry.holds_tasks:
                self._idle_since.setdefault(entry.node_id, now)
                idle.append(entry)
            else:
                self._idle_since.pop(entry.node_id, None)
        if len(idle) <= self._spare or all(now - self._idle_since[e.node_id] < self._after for e in idle):
            return   # nothing is due whatever waits
        # A node whose GPUs a reservation keeps for its window (or the wake time before it) stays on.
        needed = self.reserved(self._wake_timeout_s)
        idle = [e for e in idle if e.node_id not in needed]
        # Waiting work that could run on an idle node keeps it on (the scheduler places it first); a
        # pending task that fits on none of them blocks nothing, nor does one held back past the wake time
        # (a start time later than that, a dependency not met yet): a woken node is back in time for it.
        pending = list(self.startable(self._wall() + self._wake_timeout_s))
        if pending:
            fit = self._fit()
            usable = {fit(t) for t in pending}   # one predicate per request shape
            idle = [e for e in idle if not any(fits(e) for fits in usable)]
        idle.sort(key=lambda e: (self._idle_since[e.node_id], e.node_id))
        for entry in idle[: max(0, len(idle) - self._spare)]:
            if now - self._idle_since[entry.node_id] >= self._after:
                await self._scale_in_one(entry)

    async def _scale_in_one(self, entry: NodeEntry) -> None:
        node_id = entry.node_id
        reason = f"idle for {self._after:g}s beyond {self._spare} spare node(s)"
        async with self._locks.hold(f"power-{node_id}"):
            if entry.holds_tasks or not _is_ready(entry):
                return
            await self._set(entry, PS.NODE_POWER_STATE_DRAINING, reason)
        await self._sleep(self._period_s)   # a cycle that chose it before it was draining commits by now
        async with self._locks.hold(f"power-{node_id}"):
            if entry.holds_tasks:
                await self._set(entry, PS.NODE_POWER_STATE_READY, "got work while draining: back in service")
                return
            await self._power_off(entry, reason, locked=True)
        self._idle_since.pop(node_id, None)

    async def _power_off(self, entry: NodeEntry, reason: str, *, locked: bool = False) -> None:
        if not locked:
            async with self._locks.hold(f"power-{entry.node_id}"):
                await self._power_off(entry, reason, locked=True)
            return
        if entry.holds_tasks:
            await self._set(entry, PS.NODE_POWER_STATE_READY, "got work before power-off: back in service")
            return
        if power_label(entry.record.power_state) != "powering-off":
            await self._set(entry, PS.NODE_POWER_STATE_POWERING_OFF, reason)
        result = await self._request("power_off", entry.node_id, reason)
        if result.ok and self._off_grace_s is not None and self._registry.stream_live(entry):
            # Accepted; it is off once its agent falls silent (_await_silence), which a shutdown takes a while.
            self._off_accepted[entry.node_id] = (self._now(), entry.stream_id)
        elif result.ok:
            self._off_accepted.pop(entry.node_id, None)
            self._off_backoff.pop(entry.node_id, None)
            await self._set(entry, PS.NODE_POWER_STATE_OFF, reason)
        elif result.attempted or power_label(entry.record.power_state) == "powering-off":
            await self._set(entry, PS.NODE_POWER_STATE_READY, f"power-off failed, node left on: {result.reason}")

    async def _await_silence(self, entry: NodeEntry, now: float) -> None:
        """A node whose power-off the provider accepted: off once silent, back in service if it streams on."""
        node_id = entry.node_id
        accepted, stream_id = self._off_accepted[node_id]
        grace = self._off_grace_s or 0.0
        async with self._locks.hold(f"power-{node_id}"):
            if power_label(entry.record.power_state) != "powering-off":
                self._off_accepted.pop(node_id, None)
            elif not self._registry.stream_live(entry) or entry.stream_id != stream_id:
                self._off_accepted.pop(node_id, None)
                self._off_backoff.pop(node_id, None)
                await self._set(entry, PS.NODE_POWER_STATE_OFF, "agent silent after power-off")
            elif now - accepted >= grace:
                self._off_accepted.pop(node_id, None)
                await self._power_off_ignored(entry, now, now - accepted)

    async def _power_off_ignored(self, entry: NodeEntry, now: float, streaming_s: float) -> None:
        """Report once, put the node back in service, and hold off its next power-off (doubling each time)."""
        node_id = entry.node_id
        previous = self._off_backoff.get(node_id)
        wait = self._off_retry_s if previous is None else min(previous[0] * 2, self._off_retry_max_s)
        self._off_backoff[node_id] = (wait, now + wait)
        self._on_power_off_ignored()
        self._log.warning("power_off_ignored", node_id=node_id, streaming_s=round(streaming_s, 1),
                          retry_after_s=wait)
        self._events.publish("power", f"node {node_id} still streams {streaming_s:.0f}s after its power-off was "
                             f"accepted: power-off ignored, back in service, next power-off not before {wait:g}s",
                             node_id=node_id, outcome="power_off_ignored", retry_after_s=wait)
        await self._set(entry, PS.NODE_POWER_STATE_READY,
                        f"power-off accepted but the node still streams: next try in {wait:g}s")

    # ---- scale-out --------------------------------------------------------------------------------

    async def _wake_for_reservations(self) -> None:
        """An off node holding GPUs of a reservation that is active or starts within the wake time is woken now,
        so that it is up at the start."""
        for node_id, name in sorted(self.reserved(self._wake_timeout_s).items()):
            entry = self._registry.get(node_id)
            if entry is None or power_label(entry.record.power_state) != "off":
                continue
            async with self._locks.hold(f"power-{node_id}"):
                if power_label(entry.record.power_state) == "off":
                    await self._power_on(entry, f"reservation {name} starts within {self._wake_timeout_s:g}s")

    async def _wake_for_unplaced(self) -> None:
        if not self._unplaced and not self._shrunk:
            return
        tasks = self._state.tasks
        fit = self._fit()
        waking = [e for e in self._registry if power_label(e.record.power_state) == "powering-on"]
        ready = [e for e in self._registry if _is_ready(e) and e.connected and e.state == NodeState.READY]
        shrunk, self._shrunk = self._shrunk, {}
        for task_id in sorted(self._unplaced) + sorted(shrunk):
            task = shrunk.get(task_id) or tasks.get(task_id)
            if task is None or task.state != TaskState.PENDING:
                self._unplaced.discard(task_id)
                self._created.discard(task_id)
                continue
            need = max(1, task.spec.nodes)
            fits = fit(task)
            fitting_on = _count(itertools.chain(waking, ready), fits, need)   # capacity coming first
            if fitting_on >= need:
                continue   # capacity is there (or coming): the scheduler places it
            off = sorted((e for e in self._registry if power_label(e.record.power_state) == "off"
                          and fits(e)),
                         key=lambda e: (self._idle_power_w(e), len(e.inventory.gpus), e.node_id))
            reason = (f"elastic tasks gave up {int(task.demand.gpus)} GPU(s) for {task_id.removesuffix('/shrunk')}"
                      if task_id in shrunk else f"task {task_id} needs it")
            for entry in off[: need - fitting_on]:
                waking.append(entry)
                async with self._locks.hold(f"power-{entry.node_id}"):
                    if power_label(entry.record.power_state) == "off":
                        await self._power_on(entry, reason, _demand(task))
            if task_id in shrunk:
                continue   # never ask a provider to create a node for what shrinks gave up: an off one, or nothing
            if len(off) < need - fitting_on and task_id not in self._created:
                # Even every off node would not do: ask the provider for a new one (static: a recommendation).
                result = await self._request("create", "", f"task {task_id} fits on no node", _demand(task))
                if result.ok:
                    self._created.add(task_id)

    async def _power_on(self, entry: NodeEntry, reason: str, demand: dict[str, float] | None = None) -> None:
        result = await self._request("power_on", entry.node_id, reason, demand)
        if result.ok:
            self._wake_deadline[entry.node_id] = self._now() + self._wake_timeout_s
            await self._set(entry, PS.NODE_POWER_STATE_POWERING_ON, reason)
        elif power_label(entry.record.power_state) != "off":
            await self._set(entry, PS.NODE_POWER_STATE_OFF, f"power-on failed: {result.reason}")

    async def _request(self, action: str, node_id: str, reason: str,
                       demand: dict[str, float] | None = None) -> ProviderResult:
        """One provider request; a request that was tried and failed is counted."""
        result = await self._provider.request(action, node_id, reason, demand)
        if not result.ok and result.attempted:
            self._on_provider_failure(action)
        return result

    # ---- persistence ------------------------------------------------------------------------------

    async def _set(self, entry: NodeEntry, state: types_pb2.NodePowerState, reason: str) -> None:
        """Persist a power-state change (fenced); memory follows only what etcd accepted."""
        old = power_label(entry.record.power_state)
        async with self._state.node_writes:
            record = types_pb2.NodeRecord()
            record.CopyFrom(entry.record)
            record.power_state = state
            record.power_state_unix_s = self._wall()
            record.power_reason = reason[:256]
            self._state.apply_node(await self._leadership.write(self._store.put_node, record))
        new = power_label(state)
        self._log.info("node_power_changed", node_id=entry.node_id, old=old, new=new, reason=reason)
        self._events.publish("power", f"node {entry.node_id} {old} → {new}: {reason}", node_id=entry.node_id,
                             old=old, new=new, reason=reason)
        self._on_change()


def _count(entries: Iterable[NodeEntry], fits: Callable[[NodeEntry], bool], enough: int) -> int:
    """How many of ``entries`` fit, counting no further than ``enough``."""
    n = 0
    for entry in entries:
        if fits(entry):
            n += 1
            if n >= enough:
                break
    return n


def _demand(task: types_pb2.Task) -> dict[str, float]:
    d = task.demand
    return {"gpus": d.gpus, "gpu_mem_bytes": float(d.gpu_mem_bytes), "cpu_cores": d.cpu_cores,
            "mem_bytes": float(d.mem_bytes), "nodes": float(max(1, task.spec.nodes))}
