"""The leader's task table: admission, state changes through etcd, and the admin's task operations.

Every state change is a fenced, compare-on-revision etcd transaction (``coordinator/sync``);
memory (:class:`~coordinator.state.LeaderState`) follows only what etcd accepted. When a task ends,
its reservations are released in the leader state, the profiler learns from what it used, and the scheduler is woken.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from common.errors import IllegalTransition, NotFound, ValidationError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.pbenum import pb_enum
from common.types import TERMINAL_STATES, NodeState, TaskState
from coordinator.batching import Batcher
from coordinator.events import EventBus
from coordinator.monitor.nodes import NodeRegistry
from coordinator.monitor.resources import ResourceMonitor
from coordinator.ports import AgentSignals, ScaleOut, WakeupSignal
from coordinator.profiler import Profiler, validate_profiled_demand, validate_spec
from coordinator.profiler.learning import learn_from_task, learn_run_time
from coordinator.profiler.workflow_spec import ARRAY_PREFIX, array_indices, dependency_targets, element_id, new_array_id
from coordinator.queues.limits import apply_queue_limits
from coordinator.state import LeaderState
from coordinator.sync.leadership import Leadership
from coordinator.sync.state_machine import Conflict
from coordinator.sync.store import Store, Transition

__all__ = ["CREATE_BATCH", "TRANSITION_BATCH", "TaskTable"]

_CANCELLED = "cancelled by an admin"
_CANCEL_ATTEMPTS = 3
"""A cancel that loses its compare to a write already on its way decides again on the task as it now is."""
_CATCH_UP_S = 2.0
"""How long a cancel that lost its compare waits for memory to follow the winning write before re-reading etcd."""
CREATE_BATCH = 50
"""Submits created in one etcd transaction at most (two keys each, within etcd's 128 operations)."""
TRANSITION_BATCH = 60
"""State changes written in one etcd transaction at most (a task and, for an end, the delete of its allocation:
two operations each, within etcd's 128)."""


class TaskTable:
    """Every task this replica knows, and the only way their state changes.

    Example::

        task = await tasks.submit(spec, request_id="r-1")      # validated, profiled, stored PENDING
        await tasks.transition(task.id, TaskState.CANCELLED, "cancelled by an admin", release=True)

    :param store: the fenced etcd store.
    :param leadership: leader check and fenced writes.
    :param state: the leader's state, which follows what etcd stored.
    :param registry: the node table (the GPU count check of a submit without an admission check).
    :param monitor: telemetry history the profiler learns from.
    :param profiler: the GPT Task Profiler.
    :param dispatcher: stop/pause/resume decisions to agents.
    :param scale_out: scale-out requests, forgotten when a task ends.
    :param events: the cluster event log.
    :param wakeup: the scheduler's wake-up signal.
    """

    def __init__(self, store: Store, leadership: Leadership, state: LeaderState, registry: NodeRegistry,
                 monitor: ResourceMonitor, profiler: Profiler, dispatcher: AgentSignals, scale_out: ScaleOut,
                 events: EventBus, wakeup: WakeupSignal) -> None:
        self._store, self._leadership, self._state, self._registry = store, leadership, state, registry
        self._monitor, self._profiler, self._dispatcher = monitor, profiler, dispatcher
        self._scale_out, self._events, self._wakeup = scale_out, events, wakeup
        self._log = get_logger("coordinator")
        # Submits arriving together are created in one etcd transaction (Store.create_submits): at a thousand
        # submits a second, one round trip each would queue them behind each other.
        self._creates: Batcher[tuple[types_pb2.Task, str], types_pb2.Task] = Batcher(
            lambda items: self._leadership.write(self._store.create_submits, items), max_batch=CREATE_BATCH)
        # So are state changes arriving together (agents' reports of starts and ends). Batches share no key (a
        # node's reservation is not stored: each end deletes only its own allocation), so a backlog's full
        # batches go several at once.
        self._transitions: Batcher[Transition, types_pb2.Task] = Batcher(
            lambda items: self._leadership.write(self._store.transitions, items), max_batch=TRANSITION_BATCH,
            max_in_flight=4)
        self.releasing: Callable[[types_pb2.Task], None] = lambda task: None
        """Told of a task that gives up its GPUs (a transition with ``release``), before the change is applied:
        the team queues count its usage up to then (``LeaderQueues.releasing``)."""

    # ---- reads (the leader state's view) -------------------------------------------------------------

    @property
    def tasks(self) -> Mapping[str, types_pb2.Task]:
        """Every task by id: a read-only, live view (changes go through this table's methods)."""
        return self._state.tasks

    def view(self) -> Mapping[str, types_pb2.Task]:
        """:attr:`tasks`, for readers that are handed a callable."""
        return self._state.tasks

    def finished_count(self) -> int:
        """How many finished tasks are kept."""
        return self._state.finished_count

    def ended_in_order(self) -> Iterator[types_pb2.Task]:
        """Every finished task, the one that ended first first (:meth:`LeaderState.ended_in_order
        <coordinator.state.LeaderState.ended_in_order>`)."""
        return self._state.ended_in_order()

    def since(self, since: float, also: Iterable[str] = ()) -> list[types_pb2.Task]:
        """The tasks a pass over ``since`` onwards reads: every unfinished task, every finished one that ended at or
        after ``since``, and the tasks named in ``also`` (those known); not the other finished tasks retained."""
        out = [*self._state.live.values(), *self._state.ended_since(since)]
        ids = {t.id for t in out}
        out += [t for tid in also if tid not in ids and (t := self._state.tasks.get(tid)) is not None]
        return out

    def live_view(self) -> Mapping[str, types_pb2.Task]:
        """The unfinished tasks by id (read-only and live), for readers that are handed a callable and walk them
        often: their cost follows the work in flight, not the finished tasks retained."""
        return self._state.live

    def live(self) -> list[types_pb2.Task]:
        """The tasks not in a final state, as a list taken now (its cost follows the work in flight, not the
        finished tasks retained)."""
        return list(self._state.live.values())

    def pending(self) -> list[types_pb2.Task]:
        """The PENDING tasks, as a list taken now (its cost follows the queue, not the tasks running)."""
        return list(self._state.pending.values())

    @property
    def changes(self) -> int:
        """Rises with every stored task change followed (:attr:`LeaderState.changes
        <coordinator.state.LeaderState.changes>`): equal counts, the same tasks in the same states."""
        return self._state.changes

    def live_elastic(self) -> list[types_pb2.Task]:
        """The unfinished elastic tasks, as a list taken now."""
        return list(self._state.live_elastic.values())

    def in_submit_order(self, after: tuple | None = None) -> Iterator[types_pb2.Task]:
        """Every task in (submit time, id) order after the key ``after`` (None: from the first), read lazily
        (:meth:`LeaderState.in_submit_order <coordinator.state.LeaderState.in_submit_order>`)."""
        return self._state.in_submit_order(after)

    def get(self, task_id: str) -> types_pb2.Task:
        """:raises NotFound: no such task."""
        task = self._state.tasks.get(task_id)
        if task is None:
            raise NotFound(f"task {task_id!r} not found")
        return task

    def find(self, task_id: str) -> types_pb2.Task | None:
        """The task, or None when there is no such task."""
        return self._state.tasks.get(task_id)

    def values(self) -> list[types_pb2.Task]:
        """Every task, as a list taken now."""
        return list(self._state.tasks.values())

    def array_elements(self, array_id: str) -> list[types_pb2.Task]:
        """The elements of an array, by index (empty: no such array)."""
        return self._state.array_elements(array_id)

    def counts(self) -> dict[str, int]:
        """Tasks by state label."""
        return self._state.counts()

    def count_in(self, state: TaskState) -> int:
        """How many tasks are in ``state`` now (walks no task)."""
        return self._state.count_in(state)

    def forget(self, task_id: str) -> None:
        """Drop a finished task removed from etcd (retention)."""
        self._state.forget(task_id)

    def placed(self, stored: types_pb2.Task) -> None:
        """Follow a placement etcd committed (the task as stored, its allocation reserved on its nodes)."""
        self._state.apply_placement(stored)

    def note_reason(self, task_id: str, reason: str) -> None:
        """Show why a task waits, in memory only (not worth an etcd write per scheduling cycle)."""
        self._state.note_reason(task_id, reason)

    async def refresh(self, task_id: str) -> None:
        """Re-read one task from etcd after a lost compare (memory follows etcd)."""
        try:
            self._state.apply_task(await asyncio.to_thread(self._store.get_task, task_id))
        except NotFound:
            self._state.forget(task_id)

    # ---- admission and state changes ------------------------------------------------------------

    async def submit(self, spec: types_pb2.TaskSpec, request_id: str, *, service_id: str = "",
                     replica_index: int = 0, admit: Callable[[types_pb2.Task], None] | None = None,
                     queue: str = "", submitted_by: str = "") -> types_pb2.Task:
        """Validate, profile and persist a new PENDING task (idempotent per ``request_id``).

        ``service_id`` and ``replica_index`` mark a service's replica (``coordinator/adaptor/services.py``).
        ``admit`` decides whether the profiled task could ever be placed (raising ``PlacementError`` when
        not); without it only the GPU count per node is checked against the largest known node.
        ``queue`` is the team queue it runs in, resolved by the caller (default: the spec's);
        ``submitted_by`` the submitter's identity. The queue's run-time defaults (time limit, protected run
        time, checkpoint grace) are stored in the task's spec where the spec gives none.

        :raises ValidationError: naming the spec field that is wrong (a time limit above the queue's maximum).
        :raises PlacementError: ``admit`` refused it.
        :raises NotLeader: on a standby.
        """
        self._leadership.require_leader()
        max_gpus = 0 if admit is not None else max(
            (len(e.inventory.gpus) for e in self._registry if e.state != NodeState.LOST), default=0)
        data = validate_spec(spec, max_gpus_per_node=max_gpus)
        spec = self._with_queue_limits(spec, queue)   # run-time limits only: nothing the profile reads
        task_id = f"t-{uuid.uuid4().hex[:10]}"
        self._check_targets(spec, task_id)
        profile = self._profiler.profile(data)
        validate_profiled_demand(profile.demand)
        task = types_pb2.Task(spec=spec, state=pb_enum(types_pb2.TaskState, TaskState.PENDING),
                              demand=profile.to_proto(), reason="waiting for the scheduler",
                              id=task_id,
                              submit_unix_s=time.time(), service_id=service_id, replica_index=replica_index,
                              queue=queue or spec.queue, submitted_by=submitted_by[:256])
        if admit is not None:
            admit(task)
        stored = await self._creates.call((task, request_id))
        self._state.apply_task(stored)
        if stored.id == task.id:
            self._log.info("task_submitted", task_id=stored.id, name=spec.name)
            self._events.publish("task_state", f"task {stored.id} submitted", task_id=stored.id, state="pending")
        self._wakeup.set()
        return stored

    def _with_queue_limits(self, spec: types_pb2.TaskSpec, queue: str) -> types_pb2.TaskSpec:
        """The spec with its queue's run-time defaults where it gives none (``coordinator/queues/limits.py``).

        :raises ValidationError: a time limit above the queue's maximum (``spec.time_limit_s``)."""
        queues, name = self._state.queues, queue or spec.queue
        return apply_queue_limits(spec, queues.get(name) if name in queues else None)

    async def submit_array(self, spec: types_pb2.TaskSpec, request_id: str, *,
                           admit: Callable[[types_pb2.Task], None] | None = None, queue: str = "",
                           submitted_by: str = "") -> types_pb2.Task:
        """Validate, profile and persist every element of an array spec as a PENDING task, in few etcd
        transactions (``Store.create_tasks``); returns its first element.

        Element ``i`` is task ``ARRAY_i`` (:func:`~coordinator.profiler.workflow_spec.element_id`) with
        ``array_id``/``array_index`` set and ``GPTRM_ARRAY_ID``, ``GPTRM_ARRAY_INDEX``, ``SLURM_ARRAY_JOB_ID`` and
        ``SLURM_ARRAY_TASK_ID`` in its environment; otherwise an ordinary task. The spec is validated, profiled
        and admitted once, for all of them. A retried submit (same ``request_id``) returns the same array,
        first creating the elements an interrupted first call did not store.

        :raises ValidationError: naming the spec field that is wrong.
        :raises PlacementError: ``admit`` refused it.
        :raises Conflict: the request id made an array of another spec.
        """
        self._leadership.require_leader()
        max_gpus = 0 if admit is not None else max(
            (len(e.inventory.gpus) for e in self._registry if e.state != NodeState.LOST), default=0)
        validate_spec(spec, max_gpus_per_node=max_gpus)
        spec = self._with_queue_limits(spec, queue)
        array_id = new_array_id()
        self._check_targets(spec, array_id)
        profile = self._profiler.profile(spec)
        validate_profiled_demand(profile.demand)
        demand = profile.to_proto()
        now = time.time()
        base = types_pb2.Task(spec=spec, state=pb_enum(types_pb2.TaskState, TaskState.PENDING), demand=demand,
                              reason="waiting for the scheduler", submit_unix_s=now, queue=queue or spec.queue,
                              submitted_by=submitted_by[:256])
        if admit is not None:
            admit(base)
        if request_id:
            array_id = await self._leadership.write(self._store.claim_request, request_id, array_id)
            if not array_id.startswith(ARRAY_PREFIX):
                raise Conflict(f"request id {request_id!r} was used for task {array_id}, not an array; "
                               "use a new request id for a new array")
        known = {t.array_index: t for t in self._state.array_elements(array_id)}
        if known and _without_array_env(next(iter(known.values())).spec) != spec:
            raise Conflict(f"request id {request_id!r} was used for array {array_id} with a different spec; "
                           "use a new request id for a new array")
        elements = []
        for index in array_indices(spec.array):
            if index in known:
                continue
            element = types_pb2.Task()
            element.CopyFrom(base)
            element.id, element.array_id, element.array_index = element_id(array_id, index), array_id, index
            element.spec.env.update({"GPTRM_ARRAY_ID": array_id, "GPTRM_ARRAY_INDEX": str(index),
                                     "SLURM_ARRAY_JOB_ID": array_id, "SLURM_ARRAY_TASK_ID": str(index)})
            elements.append(element)
        stored = await self._leadership.write(self._store.create_tasks, elements)
        for task in stored:
            self._state.apply_task(task)
        if stored:
            self._log.info("array_submitted", array_id=array_id, name=spec.name, elements=len(stored))
            self._events.publish("task_state", f"array {array_id} submitted: {len(stored)} element(s)",
                                 task_id=stored[0].id, state="pending")
        self._wakeup.set()
        first = self._state.array_elements(array_id)
        if not first:
            raise NotFound(f"array {array_id} has no elements")
        return first[0]

    def _check_targets(self, spec: types_pb2.TaskSpec, own_id: str) -> None:
        """Every task or array ``spec.after`` names is known, and waiting for them makes no cycle back to
        ``own_id`` (the new task or array).

        :raises ValidationError: on ``spec.after[i].ids``, naming the unknown id, or on ``spec.after`` for a cycle.
        """
        for i, dep in enumerate(spec.after):
            for target in dep.ids:
                if target not in self._state.tasks and not self._state.has_array(target):
                    raise ValidationError(f"spec.after[{i}].ids", f"no task or array {target!r}")
        seen: set[str] = set()
        todo = dependency_targets(spec.after)
        while todo:
            target = todo.pop()
            if target == own_id:
                raise ValidationError("spec.after", f"waiting for {target} would make a dependency cycle")
            if target in seen:
                continue
            seen.add(target)
            found = self._state.tasks.get(target)
            waits = [found] if found is not None else self._state.array_elements(target)[:1]
            for task in waits:
                todo.extend(dependency_targets(task.spec.after))
                if task.array_id:
                    todo.append(task.array_id)

    async def transition(self, task_id: str, state: TaskState, reason: str = "", **updates: object) -> types_pb2.Task:
        """Persist a state change of a task (compare-on-revision) and update memory. Besides the task's fields,
        ``release`` (delete its allocation) and ``via`` (a state passed through on the way, in the same write:
        :meth:`Store.transition <coordinator.sync.store.Store.transition>`) may be given.

        A final state also stores the energy the task drew (``energy_j``, the agents' shares
        summed over its nodes, added to what earlier runs of it drew).

        :raises IllegalTransition: the state machine forbids it, or the task changed meanwhile.
        """
        task = self.get(task_id)
        release = bool(updates.pop("release", False))
        via = updates.pop("via", None)
        energy = self._monitor.task_energy
        if state in TERMINAL_STATES and "energy_j" not in updates:
            # The agents' shares since it (last) started, on top of what earlier runs stored.
            updates["energy_j"] = task.energy_j + energy.current(task_id)
        stored = await self._transitions.call(Transition(
            task_id, task.revision, state, reason, release=release, known=task, updates=updates,
            via=TaskState(via) if isinstance(via, int) else None))
        self._applied(task, stored, reason, release)
        return stored

    async def transition_together(self, changes: Sequence[tuple[str, Mapping[str, object]]], state: TaskState,
                                  reason: str) -> list[types_pb2.Task]:
        """Persist the same state change of several tasks in one etcd transaction: all of them change, or none
        does (a preemption's victims). ``changes`` pairs each task id with its field updates; a final state is
        not supported here (no energy is stored).

        :raises IllegalTransition: the state machine forbids one change, or a task changed meanwhile (Conflict);
            nothing was written.
        """
        if state in TERMINAL_STATES:
            raise IllegalTransition(f"→ {state.name}: end tasks one by one (transition)")
        tasks = [self.get(task_id) for task_id, _ in changes]
        items = [Transition(t.id, t.revision, state, reason, known=t, updates=dict(updates))
                 for t, (_, updates) in zip(tasks, changes, strict=True)]
        stored = await self._leadership.write(self._store.transitions_together, items)
        for task, new in zip(tasks, stored, strict=True):
            self._applied(task, new, reason, False)
        return stored

    def _applied(self, task: types_pb2.Task, stored: types_pb2.Task, reason: str, release: bool) -> None:
        """Memory follows a stored state change of ``task`` (as it was before) to ``stored``."""
        state, task_id = TaskState(stored.state), task.id
        if release and task.allocation.nodes:
            self.releasing(task)   # as it was until now: still holding
        self._state.apply_task(stored)
        if state in TERMINAL_STATES:
            self._monitor.task_energy.finish(task_id, stored.spec.kind)
        self._events.publish("task_state", f"task {task_id} {TaskState(task.state).label} → {state.label}"
                             + (f": {reason}" if reason else ""), task_id=task_id, state=state.label)
        if release:
            self._release(task)   # etcd freed the reservations in the same transaction
        if state in TERMINAL_STATES:
            self._finished(stored)

    def _release(self, task: types_pb2.Task) -> None:
        self._state.apply_release(task)
        self._wakeup.set()

    def _finished(self, task: types_pb2.Task) -> None:
        first = task.allocation.nodes[0].node_id if task.allocation.nodes else ""
        learn_from_task(self._profiler, task, self._monitor.history(first) if first else None)
        learn_run_time(self._profiler, task)
        self._scale_out.forget(task.id)
        self._wakeup.set()

    # ---- admin operations ---------------------------------------------------------------------

    async def cancel(self, task_id: str) -> types_pb2.Task:
        """Cancel a task: at once when nothing runs yet, else by stopping it on its agents (the
        agents' final status ends it).

        A write of the task already on its way to etcd (an agent's report of its start, batched with others)
        makes the cancel's compare-on-revision lose: the cancel then waits for memory to follow that write (or
        re-reads the task) and decides again on the task as it now is, so a user's cancel never fails for it.

        :raises IllegalTransition: the task already ended.
        """
        self._leadership.require_leader()
        for attempt in range(_CANCEL_ATTEMPTS):
            seen = self.get(task_id).revision
            try:
                return await self._cancel_once(task_id)
            except Conflict:
                if attempt == _CANCEL_ATTEMPTS - 1:
                    raise
                await self._caught_up(task_id, seen)
        raise AssertionError("unreachable")

    async def _caught_up(self, task_id: str, seen: int) -> None:
        """Wait until memory holds a newer copy of the task than revision ``seen`` (the write that won lands
        when its batch's answer comes), at most ``_CATCH_UP_S``; then re-read it from etcd."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CATCH_UP_S
        while loop.time() < deadline:
            task = self.find(task_id)
            if task is None or task.revision != seen:
                return
            await asyncio.sleep(0.01)
        await self.refresh(task_id)

    async def _cancel_once(self, task_id: str) -> types_pb2.Task:
        task = self.get(task_id)
        if task.state in TERMINAL_STATES:
            raise IllegalTransition(f"task {task_id}: already {TaskState(task.state).label}")
        if task.state == TaskState.PENDING or not task.allocation.nodes:
            return await self.transition(task_id, TaskState.CANCELLED, _CANCELLED, release=True)
        if task.state == TaskState.SCHEDULED:
            self._dispatcher.stop(task, _CANCELLED)
            return await self.transition(task_id, TaskState.CANCELLED, _CANCELLED, release=True)
        # Record the intent first (durable, survives a leader change): however the task ends
        # now, it ends CANCELLED and its restart policy is not applied.
        if not task.cancel_requested:
            task = await self.update(task_id, cancel_requested=True)
        if not self._dispatcher.stop(task, _CANCELLED):
            return await self.transition(task_id, TaskState.CANCELLED, _CANCELLED, release=True)
        self._state.note_reason(task_id, "cancelling: stop sent to the agent")
        return self.get(task_id)

    async def cancel_array(self, array_id: str) -> tuple[int, int]:
        """Cancel every element of an array that has not ended (as :meth:`cancel`).

        :returns: (elements cancelled or being stopped, elements that had already ended).
        :raises NotFound: no such array.
        """
        self._leadership.require_leader()
        elements = self._state.array_elements(array_id)
        if not elements:
            raise NotFound(f"array {array_id!r} not found")
        ended = sum(1 for t in elements if t.state in TERMINAL_STATES)
        # Waiting elements that hold nothing end in few transactions; the rest (and any that changed meanwhile)
        # one by one, as cancel() does.
        stored = await self.cancel_unplaced([t for t in elements if t.state == TaskState.PENDING
                                             and not t.allocation.nodes], _CANCELLED)
        cancelled = len(stored)
        if stored:
            self._events.publish("task_state", f"array {array_id}: {len(stored)} waiting element(s) cancelled",
                                 task_id=stored[0].id, state="cancelled")
        done = {t.id for t in stored}
        for task in elements:
            if task.state in TERMINAL_STATES or task.id in done:
                continue
            try:
                await self.cancel(task.id)
                cancelled += 1
            except IllegalTransition:   # it ended meanwhile
                ended += 1
        self._log.info("array_cancelled", array_id=array_id, cancelled=cancelled, already_ended=ended)
        return cancelled, ended

    async def cancel_unplaced(self, tasks: list[types_pb2.Task], reason: str) -> list[types_pb2.Task]:
        """End PENDING tasks that hold nothing CANCELLED with ``reason``, in few etcd transactions
        (``Store.cancel_unplaced``); returns those it ended (one that changed meanwhile is left as it is).

        :raises IllegalTransition: a task given is not PENDING or holds an allocation.
        """
        if not tasks:
            return []
        stored = await self._leadership.write(self._store.cancel_unplaced, tasks, reason)
        for task in stored:
            self._state.apply_task(task)
            self._monitor.task_energy.finish(task.id, task.spec.kind)
            self._finished(task)
        return stored

    async def update(self, task_id: str, **updates: object) -> types_pb2.Task:
        """Persist field changes without a state change (compare-on-revision) and update memory."""
        task = self.get(task_id)
        stored = await self._leadership.write(self._store.update_task, task_id, task.revision, **updates)
        self._state.apply_task(stored)
        return stored

    async def pause(self, task_id: str) -> types_pb2.Task:
        """SIGSTOP a RUNNING task on its agents (the agents report PAUSED)."""
        return self._signal(task_id, "pause", TaskState.RUNNING)

    async def resume(self, task_id: str) -> types_pb2.Task:
        """SIGCONT a PAUSED task on its agents (the agents report RUNNING)."""
        return self._signal(task_id, "resume", TaskState.PAUSED)

    def _signal(self, task_id: str, kind: str, allowed: TaskState) -> types_pb2.Task:
        self._leadership.require_leader()
        task = self.get(task_id)
        if task.state != allowed:
            raise IllegalTransition(f"task {task_id}: cannot {kind} a {TaskState(task.state).label} task")
        missing = self._dispatcher.pause(task) if kind == "pause" else self._dispatcher.resume(task)
        if missing:
            raise IllegalTransition(f"task {task_id}: node {missing[0]} is not connected")
        return task


_ARRAY_ENV = ("GPTRM_ARRAY_ID", "GPTRM_ARRAY_INDEX", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID")


def _without_array_env(spec: types_pb2.TaskSpec) -> types_pb2.TaskSpec:
    """An element's spec as submitted: without the environment its array index added."""
    out = types_pb2.TaskSpec()
    out.CopyFrom(spec)
    for key in _ARRAY_ENV:
        out.env.pop(key, None)
    return out
