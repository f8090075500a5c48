"""Committing placements (task, allocation and node reservations together) and releasing them."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from common.errors import EtcdUnavailable, Fenced, GptrmError, NotFound, NotLeader
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from coordinator.sync import _records as rec
from coordinator.sync._fenced import FencedWriter, Nodes
from coordinator.sync.client import (
    Compare,
    EtcdClient,
    Op,
    TxnResult,
    cmp_create,
    cmp_mod,
    op_delete,
    op_get,
    op_put,
)
from coordinator.sync.election import Election
from coordinator.sync.keys import Keys
from coordinator.sync.state_machine import Conflict

__all__ = ["ATTEMPTS", "CommitResult", "PlacementCommit", "Placements"]

PlacementCommit = tuple[types_pb2.Task, int, types_pb2.Allocation]
"""(the PENDING task as read, its expected mod revision, the allocation to commit)."""

ATTEMPTS = 5
"""Tries when only node records (not the task itself) changed under a write, e.g. a heartbeat."""


@dataclass(slots=True)
class CommitResult:
    """Outcome of ``Store.commit_placements``.

    :ivar committed: task id → the task's new mod revision, for each placement that committed.
    :ivar rejected: task id → why it did not commit: ``Conflict`` (the task changed, already has
        an allocation, or a whole GPU is taken), ``IllegalTransition`` (not PENDING), ``NotFound``
        (task or node missing), ``ValidationError``, or ``EtcdUnavailable`` (outcome unknown:
        read the task again).
    :ivar transactions: etcd transactions that committed placements.
    :ivar stored: task id → the SCHEDULED task exactly as stored (``revision`` set), for each commit.
    """

    committed: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, GptrmError] = field(default_factory=dict)
    transactions: int = 0
    stored: dict[str, types_pb2.Task] = field(default_factory=dict)

    def add(self, p: rec.Prepared, revision: int) -> None:
        """Record one committed placement."""
        p.task.revision = revision   # the prepared task is this commit's own message: handed out as stored
        self.committed[p.task_id] = revision
        self.stored[p.task_id] = p.task


@dataclass(frozen=True, slots=True)
class _InFlight:
    """A batch sent to etcd (or about to be), the nodes whose records it writes, and its outcome to come."""

    batch: list[rec.Prepared]
    nodes: frozenset[str]
    future: Future[tuple[TxnResult | None, Nodes]]


class Placements:
    """The allocation half of ``Store`` (which delegates to it); see ``Store.commit_placements``.

    Example::

        placements = Placements(client, keys, writer, election)
        result = placements.commit([(task, task.revision, allocation)])
        placements.release(task.id)
    """

    def __init__(
        self,
        client: EtcdClient,
        keys: Keys,
        writer: FencedWriter,
        election: Election,
        *,
        wall: Callable[[], float] = time.time,
        max_txn_ops: int = 128,
        max_txn_bytes: int = 1024 * 1024,
        history_limit: int = 100,
        max_in_flight: int = 4,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight {max_in_flight} must be at least 1")
        self._client, self._keys, self._writer, self._election = client, keys, writer, election
        self._wall, self._history_limit = wall, history_limit
        self._max_ops, self._max_bytes, self._max_in_flight = max_txn_ops, max_txn_bytes, max_in_flight
        self._log = get_logger("sync")

    def commit(self, placements: Sequence[PlacementCommit]) -> CommitResult:
        """Batch, commit (several node-disjoint batches in flight), and fall back to one placement per
        transaction for a batch that conflicts."""
        started = time.monotonic()
        result = CommitResult()
        epoch = self._election.require_epoch()
        prepared: list[rec.Prepared] = []
        for task, revision, alloc in placements:
            try:
                p = rec.prepare_placement(
                    task, revision, alloc, epoch=epoch, now_unix_s=self._wall(), history_limit=self._history_limit
                )
                prepared.append(p)
            except GptrmError as e:
                result.rejected[task.id] = e
            except ValueError as e:  # a state number outside TaskState
                result.rejected[task.id] = GptrmError(f"task {task.id}: {e}")
        # Placements on the same nodes next to each other (a stable sort: among them, the caller's order,
        # which decides who gets a whole GPU that two of them ask for), so that batches() writes each
        # node record once and most batches share no node.
        prepared.sort(key=lambda p: p.node_ids)
        batches = list(rec.batches(prepared, self._max_ops, self._max_bytes))
        if batches:
            self._commit_batches(batches, result)
        for task_id, error in result.rejected.items():
            self._log.info("placement_rejected", task_id=task_id, reason=str(error))
        self._log.info(
            "placements_committed",
            committed=len(result.committed),
            rejected=len(result.rejected),
            transactions=result.transactions,
            duration_s=round(time.monotonic() - started, 6),
        )
        return result

    def _commit_batches(self, batches: list[list[rec.Prepared]], result: CommitResult) -> None:
        """Commit ``batches`` with up to ``max_in_flight`` transactions in flight at once.

        The node records are read once, up front; after that this call keeps them as its own
        transactions wrote them (the record put and the transaction's revision), so a batch needs no
        read of its own. Every batch still compares each node's mod revision: a record changed by
        anyone else (a heartbeat, a release) fails the batch, whose placements then go one per
        transaction after a fresh read, exactly as when nothing is cached. Two batches in flight
        never share a node record: a batch that shares one with a batch in flight waits for it, so
        its reservation starts from what that batch stored. (Were it not so, the compare on the
        mod revision would still let only one of them commit: a node is never reserved twice.)
        etcd applies transactions one after another but takes new ones while it writes the last;
        meanwhile this process builds the next.
        """
        nodes = self._writer.read_nodes(n for batch in batches for p in batch for n in p.node_ids)
        stale: set[str] = set()   # nodes whose stored record is unknown since a batch failed
        window = self._max_in_flight if len(batches) > 1 else 1
        pool = ThreadPoolExecutor(window, thread_name_prefix="gptrm-commit") if window > 1 else None
        in_flight: deque[_InFlight] = deque()
        try:
            for batch in batches:
                batch_nodes = frozenset(n for p in batch for n in p.node_ids)
                while in_flight and (len(in_flight) >= window or any(batch_nodes & f.nodes for f in in_flight)):
                    self._settle(in_flight.popleft(), nodes, stale, result)
                if batch_nodes & stale:
                    reread = batch_nodes & stale
                    stale -= reread
                    for n in reread:
                        nodes.pop(n, None)
                    nodes.update(self._writer.read_nodes(reread))
                mine = {n: nodes[n] for n in batch_nodes if n in nodes}
                future: Future[tuple[TxnResult | None, Nodes]]
                if pool is None:
                    future = Future()
                    try:
                        future.set_result(self._write_batch(batch, mine))
                    except Exception as e:   # raised again by _settle, as a pooled batch's would be
                        future.set_exception(e)
                else:
                    future = pool.submit(self._write_batch, batch, mine)
                in_flight.append(_InFlight(batch, batch_nodes, future))
            while in_flight:
                self._settle(in_flight.popleft(), nodes, stale, result)
        finally:
            if pool is not None:   # after Fenced or NotLeader: what is still in flight finishes, unread
                pool.shutdown(wait=True, cancel_futures=True)

    def _write_batch(self, batch: list[rec.Prepared], nodes: Nodes) -> tuple[TxnResult | None, Nodes]:
        """Reserve the batch on copies of its node records and write it in one fenced transaction (in a
        worker thread when pipelined). None: a reservation failed before anything was sent."""
        work: Nodes = {}
        for node_id, (record, revision) in nodes.items():
            copy = types_pb2.NodeRecord()
            copy.CopyFrom(record)
            work[node_id] = (copy, revision)
        try:
            rec.add_reservations({n: r for n, (r, _rev) in work.items()},
                                 (na for p in batch for na in p.allocation.nodes))
        except (Conflict, NotFound):
            return None, work   # decided placement by placement
        return self._writer.write(*self._placement_ops(batch, work)), work

    def _settle(self, flight: _InFlight, nodes: Nodes, stale: set[str], result: CommitResult) -> None:
        """Record a batch's outcome; a batch that did not commit goes one placement per transaction."""
        batch = flight.batch
        try:
            outcome, written = flight.future.result()
        except EtcdUnavailable as e:   # outcome unknown: the task says, once read again
            stale |= flight.nodes
            result.rejected.update({p.task_id: e for p in batch})
            return
        if outcome is not None and outcome.succeeded:
            for p in batch:
                result.add(p, outcome.revision)
            result.transactions += 1
            nodes.update((n, (record, outcome.revision)) for n, (record, _old) in written.items())
            return
        stale |= flight.nodes
        if len(batch) > 1:
            self._log.info("placement_batch_conflicted", placements=len(batch))
        try:
            for p in batch:
                try:
                    result.add(p, self._commit_one(p))
                    result.transactions += 1
                except (Fenced, NotLeader, EtcdUnavailable):
                    raise
                except GptrmError as e:  # Conflict, NotFound, IllegalTransition, CoordinationError from etcd
                    result.rejected[p.task_id] = e
        except EtcdUnavailable as e:
            result.rejected.update({p.task_id: e for p in batch if p.task_id not in result.committed})

    @staticmethod
    def _reserve(p: rec.Prepared, nodes: Nodes) -> None:
        for na in p.allocation.nodes:
            if na.node_id not in nodes:
                raise NotFound(f"task {p.task_id}: node {na.node_id!r} has no record")
            rec.add_reservation(nodes[na.node_id][0], na)

    def _placement_ops(self, batch: list[rec.Prepared], nodes: Nodes) -> tuple[list[Compare], list[Op]]:
        compare: list[Compare] = []
        success: list[Op] = []
        for p in batch:
            tkey, akey = self._keys.task(p.task_id), self._keys.allocation(p.task_id)
            compare += [cmp_mod(tkey, p.expected_revision), cmp_create(akey, 0)]
            success += [op_put(tkey, p.task_bytes), op_put(akey, p.allocation_bytes)]
        node_compare, node_ops = self._writer.node_ops(nodes)
        return compare + node_compare, success + node_ops

    def _commit_one(self, p: rec.Prepared) -> int:
        tkey, akey = self._keys.task(p.task_id), self._keys.allocation(p.task_id)
        for _attempt in range(ATTEMPTS):
            nodes = self._writer.read_nodes(p.node_ids)
            self._reserve(p, nodes)
            compare, success = self._placement_ops([p], nodes)
            outcome = self._writer.write(compare, success, [op_get(tkey), op_get(akey)])
            if outcome.succeeded:
                return outcome.revision
            found_task, found_alloc = outcome.responses
            if not found_task:
                raise NotFound(f"task {p.task_id!r} not found")
            if found_task[0].value == p.task_bytes and found_alloc:
                return found_task[0].mod_revision  # our own write, whose answer was lost
            if found_task[0].mod_revision != p.expected_revision:
                got = found_task[0].mod_revision
                raise Conflict(f"task {p.task_id} changed: expected revision {p.expected_revision}, found {got}")
            if found_alloc:
                raise Conflict(f"task {p.task_id} already has an allocation")
        raise Conflict(f"task {p.task_id}: its nodes' records kept changing ({ATTEMPTS} attempts)")

    def release_ops(self, task_id: str, fallback: types_pb2.Allocation | None = None
                    ) -> tuple[list[Compare], list[Op]]:
        """Compares and ops that delete the task's allocation and subtract it from its nodes (none: no allocation).

        :param fallback: the allocation as the task itself records it, whose reservations are freed when the
            stored allocation was refused and moved aside.
        """
        akey = self._keys.allocation(task_id)
        kv = self._client.get(akey)
        alloc = None if kv is None else self._writer.parse(kv, lambda v: rec.parse_allocation(task_id, v))
        if alloc is None and kv is not None and fallback is not None and fallback.nodes:
            nodes = self._writer.read_nodes(na.node_id for na in fallback.nodes)
            for na in fallback.nodes:
                if na.node_id in nodes:
                    rec.remove_reservation(nodes[na.node_id][0], na)
            node_compare, node_ops = self._writer.node_ops(nodes)
            return [cmp_create(akey, 0), *node_compare], node_ops
        if alloc is None or kv is None:
            return [cmp_create(akey, 0)], []
        nodes = self._writer.read_nodes(na.node_id for na in alloc.nodes)
        for na in alloc.nodes:
            if na.node_id in nodes:  # a node deleted meanwhile has no reservation left to free
                rec.remove_reservation(nodes[na.node_id][0], na)
        node_compare, node_ops = self._writer.node_ops(nodes)
        return [cmp_mod(akey, kv.mod_revision), *node_compare], [op_delete(akey), *node_ops]

    def release(self, task_id: str) -> bool:
        """Delete the allocation and free its reservations in one fenced transaction; False if none."""
        for _attempt in range(ATTEMPTS):
            compare, success = self.release_ops(task_id)
            if not success:
                return False
            if self._writer.write(compare, success).succeeded:
                self._log.info("allocation_released", task_id=task_id)
                return True
        raise Conflict(f"task {task_id}: allocation kept changing while being released ({ATTEMPTS} attempts)")
