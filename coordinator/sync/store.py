"""The leader's view of etcd: nodes, tasks, allocations and policy, every write fenced."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from common.errors import IllegalTransition, NotFound, ValidationError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.types import DEFAULT_THRESHOLD_MODE, TaskState
from coordinator.sync import _records as rec
from coordinator.sync._fenced import FencedWriter
from coordinator.sync._kv import KV
from coordinator.sync._placements import ATTEMPTS, CommitResult, Held, PlacementCommit, Placements
from coordinator.sync.client import (
    Compare,
    EtcdClient,
    Op,
    cmp_create,
    cmp_exists,
    cmp_mod,
    op_delete,
    op_get,
    op_put,
)
from coordinator.sync.election import Election
from coordinator.sync.keys import Keys
from coordinator.sync.quarantine import Quarantine
from coordinator.sync.state_machine import Conflict, check_transition

__all__ = ["CommitResult", "Held", "PlacementCommit", "Store", "StoredState", "Transition"]

_M = TypeVar("_M")

CREATE_MAX_BYTES = 1024 * 1024
"""Task records created in one etcd transaction at most, in bytes (within etcd's request size limit)."""


@dataclass(frozen=True, slots=True)
class StoredState:
    """Everything a new leader recovers from, read at one etcd revision."""

    nodes: dict[str, types_pb2.NodeRecord]
    tasks: dict[str, types_pb2.Task]
    allocations: dict[str, types_pb2.Allocation]
    policy: types_pb2.Policy | None
    revision: int
    quarantined: tuple[str, ...] = ()
    """Keys whose values this read refused (they did not parse or validate) and moved under ``quarantine/``
    (original bytes kept), unless a key changed meanwhile."""


@dataclass(frozen=True, slots=True)
class Transition:
    """One state change for :meth:`Store.transitions` (the arguments of :meth:`Store.transition`)."""

    task_id: str
    expected_revision: int
    new_state: TaskState
    reason: str
    release: bool = False
    known: types_pb2.Task | None = None
    updates: Mapping[str, object] = field(default_factory=dict)
    via: TaskState | None = None


class Store:
    """Reads and fenced writes of the gptrm key space, safe to call from many threads.

    Example::

        store = Store(client, keys, election)
        task = store.create_task(types_pb2.Task(spec=spec), request_id="req-42")   # PENDING
        result = store.commit_placements([(task, task.revision, allocation)], held)   # SCHEDULED
        task = store.transition(task.id, result.committed[task.id], TaskState.STARTING, "agent ack")

    Every write goes through one helper (``FencedWriter.write``), which adds
    ``leader create_revision == epoch`` to the transaction, so a deposed leader can write
    nothing: its write raises ``Fenced`` and makes ``election`` step down. Writes made
    without leadership raise ``NotLeader``. Reads need no leadership. etcd errors surface as
    ``EtcdUnavailable`` (no member answered) or ``CoordinationError``.

    :param client: the etcd client.
    :param keys: key names.
    :param election: supplies the fencing epoch and is told to step down when fenced.
    :param wall: wall clock for history and allocation timestamps.
    :param max_txn_ops: etcd's ``--max-txn-ops`` (default 128).
    :param max_txn_bytes: value bytes per placement batch (etcd's ``--max-request-bytes`` is 1.5 MiB).
    :param max_txns_in_flight: placement transactions sent to etcd at once by one ``commit_placements``.
    :param history_limit: state changes kept per task (oldest dropped first).
    :param request_ttl_s: how long a submit's request id is remembered for idempotency.
    :param id_factory: makes task ids.
    :param quarantine: where every value read that does not parse or validate goes (see
        :class:`~coordinator.sync.quarantine.Quarantine`); by default one of its own.
    :param policy_check: validates a stored policy (raises ``ValidationError``); a refused one is quarantined.
    """

    def __init__(
        self,
        client: EtcdClient,
        keys: Keys,
        election: Election,
        *,
        wall: Callable[[], float] = time.time,
        max_txn_ops: int = 128,
        max_txn_bytes: int = 1024 * 1024,
        max_txns_in_flight: int = 4,
        history_limit: int = 100,
        request_ttl_s: float = 24 * 3600.0,
        id_factory: Callable[[], str] = rec.new_task_id,
        quarantine: Quarantine | None = None,
        policy_check: Callable[[types_pb2.Policy], None] | None = None,
    ) -> None:
        if max_txn_ops < 5:
            raise ValueError(f"max_txn_ops {max_txn_ops} cannot hold one placement")
        self._client, self._keys, self._election = client, keys, election
        self._wall = wall
        self._history_limit, self._request_ttl_s, self._new_id = history_limit, request_ttl_s, id_factory
        self._quarantine = quarantine or Quarantine(client, keys, election)
        self._policy_check = policy_check
        self._writer = FencedWriter(client, keys, election, max_txn_ops, self._quarantine)
        self._max_txn_ops = max_txn_ops
        self._placements = Placements(
            client,
            keys,
            self._writer,
            election,
            wall=wall,
            max_txn_ops=max_txn_ops,
            max_txn_bytes=max_txn_bytes,
            history_limit=history_limit,
            max_in_flight=max_txns_in_flight,
        )
        self._request_lease = (0, 0.0)
        self._request_lease_lock = threading.Lock()
        self._log = get_logger("sync")

    @property
    def keys(self) -> Keys:
        """The key names this store reads and writes."""
        return self._keys

    @property
    def quarantined_keys(self) -> list[str]:
        """The newest keys this replica moved under ``quarantine/`` (from any read, not only take-over)."""
        return self._quarantine.keys

    # -- nodes -------------------------------------------------------------------------------

    def put_node(self, record: types_pb2.NodeRecord) -> types_pb2.NodeRecord:
        """Create or replace ``nodes/<record.inventory.node_id>`` (without reservation fields: a node's
        reservation is derived from the allocations, never stored; see ``coordinator/sync/_placements.py``).

        :returns: the record as stored.
        :raises ValidationError: the record has no node id.
        :raises Conflict: the node kept changing under us.
        """
        node_id = record.inventory.node_id
        if not node_id:
            raise ValidationError("node.inventory.node_id", "is empty")
        key = self._keys.node(node_id)
        new = types_pb2.NodeRecord()
        new.CopyFrom(record)
        rec.clear_reservation(new)
        data = new.SerializeToString()
        for _attempt in range(ATTEMPTS):
            kv = self._client.get(key)
            stored = None if kv is None else self._writer.parse(kv, lambda v: rec.parse_node(node_id, v))
            if stored is None:
                kv = None   # none, or refused and moved aside: this record replaces it
            guard = cmp_mod(key, kv.mod_revision) if kv is not None else cmp_create(key, 0)
            if self._writer.write([guard], [op_put(key, data)]).succeeded:
                self._log.debug("node_stored", node_id=node_id)
                return new
        raise Conflict(f"node {node_id}: record kept changing ({ATTEMPTS} attempts)")

    def put_nodes(self, records: Sequence[types_pb2.NodeRecord]) -> list[types_pb2.NodeRecord]:
        """:meth:`put_node` for many records in few fenced transactions (many agents registering at once, as
        after a leader change): each chunk reads its nodes' revisions in one round trip and writes them in one
        transaction, every node compared on the revision read. A chunk whose compare failed (a node changed
        meanwhile) is written node by node with :meth:`put_node`.

        :returns: the records as stored, in the order given (one per node id; the last record given wins).
        """
        by_id = {r.inventory.node_id: r for r in records}
        for node_id in by_id:
            if not node_id:
                raise ValidationError("node.inventory.node_id", "is empty")
        ids = list(by_id)
        stored: dict[str, types_pb2.NodeRecord] = {}
        chunk = max(1, self._max_txn_ops - 1)   # one compare each, besides the fencing compare
        for i in range(0, len(ids), chunk):
            part = ids[i : i + chunk]
            current = self._writer.read_nodes(part)
            compares, puts, new = [], [], {}
            for node_id in part:
                record = types_pb2.NodeRecord()
                record.CopyFrom(by_id[node_id])
                rec.clear_reservation(record)
                key = self._keys.node(node_id)
                if node_id in current:
                    compares.append(cmp_mod(key, current[node_id][1]))
                else:
                    compares.append(cmp_create(key, 0))
                puts.append(op_put(key, record.SerializeToString()))
                new[node_id] = record
            if self._writer.write(compares, puts).succeeded:
                stored.update(new)
                self._log.debug("nodes_stored", nodes=len(part))
            else:
                for node_id in part:
                    stored[node_id] = self.put_node(by_id[node_id])
        return [stored[r.inventory.node_id] for r in records]

    def get_node(self, node_id: str) -> types_pb2.NodeRecord:
        """The stored node. :raises NotFound: no such node."""
        kv = self._client.get(self._keys.node(node_id))
        node = None if kv is None else self._writer.parse(kv, lambda v: rec.parse_node(node_id, v))
        if node is None:
            raise NotFound(f"node {node_id!r} not found")
        return node

    def list_nodes(self) -> list[types_pb2.NodeRecord]:
        """Every stored node, by node id (a record refused is moved aside and left out)."""
        kvs, _rev = self._client.range_prefix(self._keys.nodes_prefix)
        parse = _by_name(self._keys, self._keys.nodes_prefix, rec.parse_node)
        return [n for n in (self._writer.parse(kv, parse) for kv in kvs) if n is not None]

    def delete_node(self, node_id: str) -> bool:
        """Delete a node record (scale-in; the caller moves its tasks first); True when it existed."""
        key = self._keys.node(node_id)
        deleted = self._writer.write([cmp_exists(key)], [op_delete(key)]).succeeded
        if deleted:
            self._log.info("node_deleted", node_id=node_id)
        return deleted

    # -- tasks -------------------------------------------------------------------------------

    def delete_task(self, task_id: str, expected_revision: int) -> bool:
        """Remove a finished task (and any allocation left) if it is still at ``expected_revision``;
        False when it changed or is gone."""
        key = self._keys.task(task_id)
        result = self._writer.write([cmp_mod(key, expected_revision)],
                                    [op_delete(key), op_delete(self._keys.allocation(task_id))])
        if result.succeeded:
            self._log.info("task_deleted", task_id=task_id)
        return result.succeeded

    def create_submits(self, items: Sequence[tuple[types_pb2.Task, str]], *,
                       max_bytes: int = CREATE_MAX_BYTES) -> list[types_pb2.Task | Exception]:
        """:meth:`create_task` for many tasks, in one transaction when none of their ids and request ids exists
        yet (the common case: new submits arriving together) and they fit in one (etcd's operation limit,
        ``max_bytes`` of values); otherwise each is created on its own, so a retried submit still gets the task
        its first try created. Returns, per item in order, the stored task or the exception :meth:`create_task`
        would raise for it.

        :raises NotLeader, Fenced, EtcdUnavailable: as :meth:`create_task`, for the whole batch.
        """
        request_ids = [r for _t, r in items if r]
        task_ids = [t.id for t, _r in items if t.id]
        if len(items) > 1 and len(items) * 2 <= self._max_txn_ops - 1 \
                and len(set(request_ids)) == len(request_ids) and len(set(task_ids)) == len(task_ids):
            # (A key twice in one transaction is refused by etcd: such a batch goes one by one.)
            try:
                batch = [(new, request_id, new.SerializeToString())
                         for new, request_id in ((self._new_task(t), r) for t, r in items)]
            except IllegalTransition:
                batch = []   # that one's error comes from create_task below
            if batch and sum(len(data) for _t, _r, data in batch) <= max_bytes and self._create_batch(batch):
                for new, request_id, _data in batch:
                    self._log.info("task_created", task_id=new.id, revision=new.revision, request_id=request_id)
                return [new for new, _r, _d in batch]
        out: list[types_pb2.Task | Exception] = []
        for task, request_id in items:
            try:
                out.append(self.create_task(task, request_id))
            except (IllegalTransition, NotFound) as e:   # Conflict is an IllegalTransition
                out.append(e)
        return out

    def _new_task(self, task: types_pb2.Task, *, copy: bool = True) -> types_pb2.Task:
        """The record a new task is stored as (a fresh id when it has none, PENDING, its first history entry):
        a copy of ``task``, or ``task`` itself completed in place (``copy=False``).

        :raises IllegalTransition: the task carries a state other than PENDING.
        """
        if copy:
            new = types_pb2.Task()
            new.CopyFrom(task)
        else:
            new = task
        new.id = new.id or self._new_id()
        if new.state not in (0, TaskState.PENDING):
            raise IllegalTransition(f"task {new.id}: a new task must be PENDING, not {TaskState(new.state).name}")
        new.revision = 0
        new.submit_unix_s = new.submit_unix_s or self._wall()
        rec.append_history(new, TaskState.PENDING, new.reason or "submitted", new.submit_unix_s, self._history_limit)
        return new

    def create_task(self, task: types_pb2.Task, request_id: str = "") -> types_pb2.Task:
        """Store a new PENDING task; idempotent per ``request_id``.

        A retried submit (same ``request_id`` within ``request_ttl_s``) returns the task the first
        one created instead of creating another. An empty ``task.id`` gets a fresh one.

        :returns: the stored task with ``revision`` set.
        :raises IllegalTransition: the task carries a state other than PENDING.
        :raises Conflict: a task with that id already exists.
        :raises NotFound: the request id is known but its task was deleted since.
        :raises Conflict: the request id is known for a task with a different spec.
        """
        new = self._new_task(task)
        key, data = self._keys.task(new.id), new.SerializeToString()
        compare, success, failure = [cmp_create(key, 0)], [op_put(key, data)], [op_get(key)]
        if request_id:
            rkey = self._keys.request(request_id)
            compare.append(cmp_create(rkey, 0))
            success.append(op_put(rkey, new.id.encode(), self._request_lease_id()))
            failure.append(op_get(rkey))
        result = self._writer.write(compare, success, failure)
        found_request = result.responses[1] if request_id and not result.succeeded else None
        existing = self._writer.parse(found_request[0], rec.parse_request) if found_request else None
        if found_request and existing is None:   # refused and moved aside: the request id is free again
            result = self._writer.write(compare, success, failure)
            found_request = result.responses[1] if request_id and not result.succeeded else None
            existing = self._writer.parse(found_request[0], rec.parse_request) if found_request else None
        if result.succeeded:
            new.revision = result.revision
            self._log.info("task_created", task_id=new.id, revision=new.revision, request_id=request_id)
            return new
        found_task = result.responses[0]
        if existing is not None:
            try:
                first = self.get_task(existing)
            except NotFound:
                raise NotFound(f"request {request_id!r} created task {existing!r}, which no longer exists") from None
            if first.spec != new.spec:
                raise Conflict(f"request id {request_id!r} was used for task {existing} with a different spec; "
                               "use a new request id for a new task")
            self._log.info("task_submit_deduplicated", task_id=existing, request_id=request_id)
            return first
        revision = found_task[0].mod_revision if found_task else 0
        raise Conflict(f"task {new.id}: already exists (revision {revision})")

    def claim_request(self, request_id: str, value: str) -> str:
        """Remember ``request_id`` as having made ``value`` (an array id), unless it is already known.

        :returns: what the request made: ``value`` when this call claimed it, else what the first call stored.
        """
        rkey = self._keys.request(request_id)
        for _ in range(2):   # a refused stored value is moved aside: the request id is free again
            result = self._writer.write([cmp_create(rkey, 0)], [op_put(rkey, value.encode(), self._request_lease_id())],
                                        [op_get(rkey)])
            if result.succeeded:
                return value
            found = result.responses[0]
            existing = self._writer.parse(found[0], rec.parse_request) if found else None
            if existing is not None:
                return existing
        raise Conflict(f"request id {request_id!r}: its stored value was refused twice")

    def create_tasks(self, tasks: Sequence[types_pb2.Task], *,
                     max_bytes: int = CREATE_MAX_BYTES) -> list[types_pb2.Task]:
        """Store many new PENDING tasks (an array's elements) in few transactions: as many per transaction as
        etcd's operation limit and ``max_bytes`` of values allow, each put only if its key is new.

        The tasks are completed in place (history, submit time, revision) and returned. Transactions that went
        through stay (each holds whole tasks); a retry of the same ids creates only those
        not yet stored (the caller leaves out the ones it knows).

        :returns: the stored tasks, ``revision`` set, in order.
        :raises Conflict: a task of a batch already exists (nothing of that batch was written).
        """
        stored: list[types_pb2.Task] = []
        batch: list[tuple[types_pb2.Task, str, bytes]] = []
        size = 0

        def flush() -> None:
            if not self._create_batch(batch):
                raise Conflict(f"tasks {batch[0][0].id}..{batch[-1][0].id}: one of them already exists")
            self._log.info("tasks_created", first=batch[0][0].id, count=len(batch), revision=batch[0][0].revision)
            stored.extend(t for t, _r, _d in batch)

        for task in tasks:   # completed in place (no copy: an array's elements are made for this call)
            new = self._new_task(task, copy=False)
            data = new.SerializeToString()
            if batch and (len(batch) + 1 >= self._max_txn_ops or size + len(data) > max_bytes):
                flush()
                batch, size = [], 0
            batch.append((new, "", data))
            size += len(data)
        if batch:
            flush()
        return stored

    def _create_batch(self, batch: Sequence[tuple[types_pb2.Task, str, bytes]]) -> bool:
        """Put each new task of ``batch`` (task, its request id or "", its record) and its request id, only if
        none of their keys exists, in one transaction; returns whether it went through (the tasks then carry
        its revision)."""
        compare: list[Compare] = []
        success: list[Op] = []
        for task, request_id, data in batch:
            key = self._keys.task(task.id)
            compare.append(cmp_create(key, 0))
            success.append(op_put(key, data))
            if request_id:
                rkey = self._keys.request(request_id)
                compare.append(cmp_create(rkey, 0))
                success.append(op_put(rkey, task.id.encode(), self._request_lease_id()))
        result = self._writer.write(compare, success)
        if not result.succeeded:
            return False
        for task, _r, _d in batch:
            task.revision = result.revision
        return True

    def _request_lease_id(self) -> int:
        # One lease per ~1/24 of the TTL carries every request key made meanwhile, so each key
        # is remembered between 23/24 and all of request_ttl_s without a keep-alive per key.
        with self._request_lease_lock:
            lease_id, granted_at = self._request_lease
            now = time.monotonic()
            if not lease_id or now - granted_at > self._request_ttl_s / 24:
                lease_id, _ttl = self._client.grant_lease(max(int(self._request_ttl_s), 1))
                self._request_lease = (lease_id, now)
            return lease_id

    def get_task(self, task_id: str) -> types_pb2.Task:
        """The stored task with ``revision`` = its mod revision. :raises NotFound: no such task."""
        kv = self._client.get(self._keys.task(task_id))
        task = None if kv is None else self._writer.parse(kv, lambda v: rec.parse_task(task_id, v))
        if task is None:
            raise NotFound(f"task {task_id!r} not found")
        return task

    def list_tasks(self, states: Iterable[TaskState] | None = None) -> list[types_pb2.Task]:
        """Every stored task (optionally only those in ``states``), by task id (a value refused is moved
        aside and left out)."""
        wanted = None if states is None else {int(s) for s in states}
        kvs, _rev = self._client.range_prefix(self._keys.tasks_prefix)
        parse = _by_name(self._keys, self._keys.tasks_prefix, rec.parse_task)
        tasks = (self._writer.parse(kv, parse) for kv in kvs)
        return [t for t in tasks if t is not None and (wanted is None or t.state in wanted)]

    def get_allocation(self, task_id: str) -> types_pb2.Allocation | None:
        """The task's committed allocation, or None."""
        kv = self._client.get(self._keys.allocation(task_id))
        return None if kv is None else self._writer.parse(kv, lambda v: rec.parse_allocation(task_id, v))

    def transition(
        self,
        task_id: str,
        expected_revision: int,
        new_state: TaskState,
        reason: str,
        *,
        release: bool = False,
        known: types_pb2.Task | None = None,
        via: TaskState | None = None,
        **updates: object,
    ) -> types_pb2.Task:
        """Change a task's state if it is still at ``expected_revision`` and the state machine allows it.

        Appends a ``TaskStateChange`` to the history and sets the given ``Task`` fields
        (``exit_code=1, log_tail="..."``) in the same write.

        :param release: also delete the task's allocation (what it holds on its nodes), atomically.
        :param via: a state passed through on the way, stored in the same write (its own history entry, each step
            checked by the state machine): an agent's start and its running, reported together.
        :param known: the task as etcd stored it at ``expected_revision`` (the leader's copy), to write from
            without reading it first: the write still compares the revision, so a copy that is not etcd's
            value at that revision is never written (the read and the retry follow). Its reason may differ
            (a waiting reason kept in memory only): a transition sets the reason anyway.
        :returns: the task as stored, with its new ``revision``.
        :raises NotFound: no such task.
        :raises Conflict: the task changed since ``expected_revision`` (``IllegalTransition`` subclass).
        :raises IllegalTransition: the state machine forbids the change; SCHEDULED only comes from
            :meth:`commit_placements`, which writes the allocation with it.
        :raises ValidationError: an update names a field that cannot be set.
        """
        new_state = TaskState(new_state)
        if new_state is TaskState.SCHEDULED:
            raise IllegalTransition(f"task {task_id}: → SCHEDULED only through commit_placements (with an allocation)")

        def mutate(task: types_pb2.Task) -> None:
            rec.apply_updates(task, updates)
            self._steps(task, new_state, reason, via)
            if new_state is TaskState.PENDING:
                # Back in the queue (restart, preemption, drain): it holds nothing until placed again.
                task.ClearField("allocation")
                task.ClearField("parts")

        return self._rewrite_task(task_id, expected_revision, mutate, release, "task_transitioned", known)

    def _steps(self, task: types_pb2.Task, new_state: TaskState, reason: str, via: TaskState | None) -> None:
        """Move ``task`` (a copy being written) to ``new_state``, through ``via`` first when given: each step checked
        by the state machine and recorded in the history, at the same time.

        :raises IllegalTransition: a step the state machine forbids."""
        now = self._wall()
        for state, why in (((via, ""),) if via is not None else ()) + ((new_state, reason),):
            check_transition(task.id, TaskState(task.state), state)
            rec.append_history(task, state, why, now, self._history_limit)

    def transitions(self, items: Sequence[Transition]) -> list[types_pb2.Task | Exception]:
        """:meth:`transition` for many tasks, in one transaction when they are ready to go together (agents'
        reports arriving at once: starts, and ends that delete their allocations). Each is checked as
        :meth:`transition` checks it (state machine, compare on its revision; no read: the leader's copy is
        written). When the transaction fails (one task changed meanwhile) each is written on its own, with
        :meth:`transition`'s reads and retries. Returns, per item in order, the stored task or the exception
        :meth:`transition` would raise for it.

        :raises NotLeader, Fenced, EtcdUnavailable: for the whole batch.
        """
        ids = [t.task_id for t in items]
        if 1 < len(items) <= (self._max_txn_ops - 1) // 2 and len(set(ids)) == len(ids) \
                and all(t.known is not None and t.known.revision == t.expected_revision for t in items):
            batch = self._batch_transitions(items)
            if batch is not None:
                return batch
        out: list[types_pb2.Task | Exception] = []
        for t in items:
            try:
                out.append(self.transition(t.task_id, t.expected_revision, t.new_state, t.reason, release=t.release,
                                           known=t.known, via=t.via, **t.updates))
            except (IllegalTransition, NotFound, ValidationError) as e:   # Conflict is an IllegalTransition
                out.append(e)
        return out

    def _batch_transitions(self, items: Sequence[Transition]) -> list[types_pb2.Task | Exception] | None:
        """The one-transaction path of :meth:`transitions`; None when it does not apply (the caller goes one by
        one)."""
        try:
            return list(self._write_together(items))
        except (IllegalTransition, ValidationError):
            return None   # that one's error comes from transition()

    def transitions_together(self, items: Sequence[Transition]) -> list[types_pb2.Task]:
        """:meth:`transition` for several tasks in one transaction: all are stored, or none is. Each is written
        from its ``known`` copy, compared on its ``expected_revision`` (no read). What a preemption's victims
        need: a leader that stops between two separate writes would leave some victims preempted and the
        others running, which a new leader, without the preemptor's claim, cannot tell from a finished
        preemption.

        :returns: the tasks as stored, in the order given.
        :raises Conflict: a task changed since its expected revision (or has no known copy at it): nothing
            was written.
        :raises IllegalTransition: the state machine forbids one of the changes (nothing was written).
        :raises ValidationError: the changes do not fit one transaction, or an update names a field that cannot
            be set.
        :raises NotLeader, Fenced, EtcdUnavailable: as for :meth:`transition`.
        """
        if len(items) == 1:
            t = items[0]
            return [self.transition(t.task_id, t.expected_revision, t.new_state, t.reason, release=t.release,
                                    known=t.known, via=t.via, **t.updates)]
        return self._write_together(items)

    def _write_together(self, items: Sequence[Transition]) -> list[types_pb2.Task]:
        """Write ``items`` in one transaction from their known copies (see :meth:`transitions_together`)."""
        ids = [t.task_id for t in items]
        if len(set(ids)) != len(ids):
            raise ValidationError("task_id", "a task may appear once in a transaction")
        compare: list[Compare] = []
        success: list[Op] = []
        news: list[types_pb2.Task] = []
        for t in items:
            if t.known is None or t.known.revision != t.expected_revision or t.known.id != t.task_id:
                raise Conflict(f"task {t.task_id}: no copy at revision {t.expected_revision} to write from")
            new = types_pb2.Task()
            new.CopyFrom(t.known)
            new.revision = 0
            if t.new_state is TaskState.SCHEDULED:
                raise IllegalTransition(f"task {t.task_id}: → SCHEDULED only through commit_placements "
                                        "(with an allocation)")
            rec.apply_updates(new, t.updates)
            self._steps(new, t.new_state, t.reason, t.via)
            if t.new_state is TaskState.PENDING:
                new.ClearField("allocation")
                new.ClearField("parts")
            key = self._keys.task(t.task_id)
            compare.append(cmp_mod(key, t.expected_revision))
            success.append(op_put(key, new.SerializeToString()))
            if t.release:
                more_compare, more_success = self._placements.release_ops(t.task_id)
                compare += more_compare
                success += more_success
            news.append(new)
        if len(compare) + 1 > self._max_txn_ops or len(success) > self._max_txn_ops:
            raise ValidationError("transitions", f"{len(items)} changes do not fit one transaction "
                                  f"({self._max_txn_ops} operations at most)")
        result = self._writer.write(compare, success)
        if not result.succeeded:
            raise Conflict(f"tasks {', '.join(ids)}: one changed since the revision expected; nothing written")
        for new in news:
            new.revision = result.revision
            self._log.info("task_transitioned", task_id=new.id, state=TaskState(new.state).name, revision=new.revision)
        return news

    def cancel_unplaced(self, tasks: Sequence[types_pb2.Task], reason: str) -> list[types_pb2.Task]:
        """End many PENDING tasks that hold nothing (an array's waiting elements) CANCELLED, in few transactions:
        each record is rewritten from the copy given, compared on its revision, as many per transaction as
        etcd's operation limit allows.

        A transaction whose compare fails (one of its tasks changed meanwhile) writes nothing; its tasks are
        left out of the answer (the caller cancels those one by one).

        :returns: the tasks as stored, with their new ``revision``.
        :raises IllegalTransition: a task given is not PENDING or holds an allocation.
        """
        stored: list[types_pb2.Task] = []
        now = self._wall()
        step = self._max_txn_ops - 1
        for i in range(0, len(tasks), step):
            batch: list[tuple[int, types_pb2.Task, str]] = []
            for task in tasks[i : i + step]:
                if task.state != TaskState.PENDING or task.allocation.nodes:
                    raise IllegalTransition(f"task {task.id}: only a PENDING task that holds nothing is cancelled "
                                            "in bulk")
                new = types_pb2.Task()
                new.CopyFrom(task)
                new.revision = 0
                rec.append_history(new, TaskState.CANCELLED, reason, now, self._history_limit)
                batch.append((task.revision, new, self._keys.task(task.id)))
            result = self._writer.write([cmp_mod(key, rev) for rev, _n, key in batch],
                                        [op_put(key, new.SerializeToString()) for _r, new, key in batch])
            if not result.succeeded:
                continue
            for _rev, new, _key in batch:
                new.revision = result.revision
                stored.append(new)
            self._log.info("tasks_cancelled", first=batch[0][1].id, count=len(batch), revision=result.revision)
        return stored

    def update_task(self, task_id: str, expected_revision: int, **updates: object) -> types_pb2.Task:
        """Set ``Task`` fields (pids, log_tail, ...) without a state change, compare-on-revision.

        :raises NotFound, Conflict, ValidationError: as :meth:`transition`.
        """
        return self._rewrite_task(
            task_id, expected_revision, lambda t: rec.apply_updates(t, updates), False, "task_updated"
        )

    def _rewrite_task(
        self, task_id: str, expected: int, mutate: Callable[[types_pb2.Task], None], release: bool, event: str,
        known: types_pb2.Task | None = None,
    ) -> types_pb2.Task:
        key = self._keys.task(task_id)
        for attempt in range(ATTEMPTS):
            # The first attempt may start from the caller's copy at the expected revision (one etcd round
            # trip instead of two); a retry always reads.
            current = known if attempt == 0 and known is not None and known.revision == expected \
                and known.id == task_id else self.get_task(task_id)
            if current.revision != expected:
                raise Conflict(f"task {task_id} changed: expected revision {expected}, found {current.revision}")
            new = types_pb2.Task()
            new.CopyFrom(current)
            new.revision = 0
            mutate(new)
            data = new.SerializeToString()
            compare, success = [cmp_mod(key, expected)], [op_put(key, data)]
            if release:
                more_compare, more_success = self._placements.release_ops(task_id)
                compare += more_compare
                success += more_success
            result = self._writer.write(compare, success, [op_get(key)])
            found = result.responses[0] if not result.succeeded else None
            if result.succeeded or (found and found[0].value == data):  # the latter: our write, answer lost
                new.revision = result.revision if result.succeeded or not found else found[0].mod_revision
                self._log.info(event, task_id=task_id, state=TaskState(new.state).name, revision=new.revision)
                return new
            if not found:
                raise NotFound(f"task {task_id!r} not found")
            if found[0].mod_revision != expected:
                raise Conflict(f"task {task_id} changed: expected revision {expected}, found {found[0].mod_revision}")
        raise Conflict(f"task {task_id}: kept changing ({ATTEMPTS} attempts)")

    # -- allocations ----------------------------------------------------------------------------

    def commit_placements(self, placements: Sequence[PlacementCommit], held: Held | None = None) -> CommitResult:
        """Commit placements: each task → SCHEDULED with its ``allocations/<task>``, in one transaction each.

        Placements are batched into as few transactions as etcd's limits allow (``max_txn_ops``
        compares/ops and ``max_txn_bytes`` per transaction), all-or-nothing per batch. When a
        batch's compares fail (a task changed, or already has an allocation), its placements are
        retried one per transaction, so one stale task does not hold back the others. No node
        record is written: a node's reservation is the sum of its allocations, derived by the
        leader (``held``); a whole-GPU allocation of a GPU held already, by ``held`` or an earlier
        placement of the call, is refused before anything is sent (why no GPU is ever booked twice,
        also across leader changes: ``coordinator/sync/_placements.py``).

        :param held: node id → what it holds now (the leader's holdings); None: nothing held.
        :returns: which placements committed (task id → new revision) and why the others did not.
        :raises NotLeader, Fenced: we do not lead (nothing was committed by this call after that).
        """
        return self._placements.commit(placements, held)

    def release_allocation(self, task_id: str) -> bool:
        """Delete ``allocations/<task_id>`` in one fenced transaction.

        :returns: False when the task has no allocation.
        :raises Conflict: the allocation kept changing under us.
        """
        return self._placements.release(task_id)

    # -- policy and recovery -------------------------------------------------------------------

    def get_policy(self) -> types_pb2.Policy | None:
        """The stored placement policy, or None when none was ever set (or the one stored was refused and
        moved aside)."""
        kv = self._client.get(self._keys.policy)
        return None if kv is None else self._writer.parse(kv, self._parse_policy)

    def _parse_policy(self, kv: KV) -> types_pb2.Policy:
        policy = rec.decode(types_pb2.Policy, kv)
        if self._policy_check is not None:
            self._policy_check(policy)
        return policy

    def put_policy(self, policy: types_pb2.Policy) -> None:
        """Store the placement policy (fenced)."""
        self._writer.write([], [op_put(self._keys.policy, policy.SerializeToString())])
        self._log.info("policy_stored", policy=policy.name, threshold=policy.threshold,
                       threshold_mode=policy.threshold_mode or DEFAULT_THRESHOLD_MODE)

    def load_all(self) -> StoredState:
        """Nodes, tasks (with revisions), allocations and policy, all read at one revision.

        A value that does not parse, or parses into something impossible (an unknown task
        state, a record whose id differs from its key, a policy ``policy_check`` refuses), is
        left out and moved aside by the quarantine, so one corrupt key never stops a leader
        from leading.
        """
        k = self._keys
        nodes, revision = self._client.range_prefix(k.nodes_prefix)
        tasks, _ = self._client.range_prefix(k.tasks_prefix, revision=revision)
        allocs, _ = self._client.range_prefix(k.allocations_prefix, revision=revision)
        policy_kvs = [kv for kv in self._client.range_prefix(k.policy, revision=revision)[0] if kv.key == k.policy]
        moved: list[str] = []
        node_map = self._parse_all(nodes, k.nodes_prefix, rec.parse_node, moved)
        task_map = self._parse_all(tasks, k.tasks_prefix, rec.parse_task, moved)
        alloc_map = self._parse_all(allocs, k.allocations_prefix, rec.parse_allocation, moved)
        policy = None
        for kv in policy_kvs:
            policy = self._writer.parse(kv, self._parse_policy)
            if policy is None:
                moved.append(kv.key)
        return StoredState(nodes=node_map, tasks=task_map, allocations=alloc_map, policy=policy, revision=revision,
                           quarantined=tuple(moved))

    def quarantine(self, kv: KV, reason: str) -> bool:
        """Move a value that cannot be used to ``quarantine/<key>@<revision>`` (original bytes), fenced,
        in one transaction with the delete of the original; False when the key changed meanwhile."""
        return self._quarantine.move(kv, reason)

    def _parse_all(self, kvs: list[KV], prefix: str, parse: Callable[[str, KV], _M], moved: list[str]) -> dict[str, _M]:
        out: dict[str, _M] = {}
        by_name = _by_name(self._keys, prefix, parse)
        for kv in kvs:
            value = self._writer.parse(kv, by_name)
            if value is None:
                moved.append(kv.key)
            else:
                out[self._keys.name_of(kv.key, prefix)] = value
        return out


def _by_name(keys: Keys, prefix: str, parse: Callable[[str, KV], _M]) -> Callable[[KV], _M]:
    """``parse(name, kv)`` with the name taken from the key (``ValueError``: not directly in ``prefix``)."""
    return lambda kv: parse(keys.name_of(kv.key, prefix), kv)
