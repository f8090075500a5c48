"""Committing placements (each task and its allocation together) and releasing them.

A node's reservation is not stored: it is the sum of the allocations placed on it (``allocations/<task>``),
which the leader derives in memory (:class:`coordinator.state.NodeHoldings`). So a placement's transaction
compares only its own task (at the revision read, and no allocation yet) and the leader's fence, and an
end deletes only its own allocation: placements and ends on one node no longer serialize on a shared record.

Why a GPU is still never booked twice, within one leader and across leader changes:

1. Every write is fenced (``FencedWriter``): its transaction also compares the leader key's create revision
   with the writer's epoch. A new leader's epoch *E* is the create revision of its own leader key, so every
   transaction of an earlier leader that etcd applies after *E* fails its fence and writes nothing: every
   allocation an earlier leader stored has a revision below *E*.
2. A new leader reads the whole view at one revision *R* (``Store.load_all``) after it won (*R* ≥ *E*, etcd
   reads being linearizable) and derives every node's holdings from the allocations of that read, before its
   first scheduling cycle. So it starts from every allocation any leader ever stored and not yet released;
   node records written by the older layout, with totals of their own, are read without them
   (:func:`~coordinator.sync._records.parse_node`), and the allocations they summed are what counts.
3. After *R* only this leader writes allocations. Its placements come from one scheduling cycle at a time,
   each planned on the holdings after the previous cycle's commits were applied, and :meth:`Placements.commit`
   checks every placement against the holdings it is given (``held``) and the placements before it in the
   same call, so a whole GPU held already is refused before anything is sent. (So ``commit`` has one caller
   at a time, the scheduling cycle: two callers at once would not see each other's placements.)
4. An allocation is deleted only in the transaction that ends or requeues its task (compared on the task's
   revision), and the holdings let go of it only once that transaction is stored: a GPU is offered again
   only after etcd says it is free. A placement's compare on ``allocations/<task>`` being absent keeps one
   allocation per task.
5. A placement whose answer was lost (etcd did not answer in time) may still be applied later. Until it is
   settled, its whole GPUs count as held for every later placement of this leader (``Placements.unsettled``),
   and every commit first settles it: a transaction that rewrites the task as it was read, compared on the
   revision the placement expected, makes the lost one fail for ever if it has not been applied; if the
   task changed instead, it is read back, and when it is the placement's own record the placement committed
   and is handed to the caller (``CommitResult.recovered``) to follow.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from common.errors import EtcdUnavailable, Fenced, GptrmError, NotFound, NotLeader
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from coordinator.allocator.reservations import NodeReservation
from coordinator.sync import _records as rec
from coordinator.sync._fenced import FencedWriter
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

__all__ = ["ATTEMPTS", "CommitResult", "Held", "PlacementCommit", "Placements"]

PlacementCommit = tuple[types_pb2.Task, int, types_pb2.Allocation]
"""(the PENDING task as read, its expected mod revision, the allocation to commit)."""

Held = Callable[[str], NodeReservation]
"""Node id → what the allocations placed there hold now (the leader's derived holdings)."""

ATTEMPTS = 5
"""Tries of a write whose compare failed for a reason that may pass (a lost answer read back)."""


@dataclass(slots=True)
class CommitResult:
    """Outcome of ``Store.commit_placements``.

    :ivar committed: task id → the task's new mod revision, for each placement that committed.
    :ivar rejected: task id → why it did not commit: ``Conflict`` (the task changed, already has
        an allocation, or a whole GPU is held), ``IllegalTransition`` (not PENDING), ``NotFound``
        (task missing), ``ValidationError``, or ``EtcdUnavailable`` (outcome unknown: read the task again).
    :ivar transactions: etcd transactions that committed placements.
    :ivar stored: task id → the SCHEDULED task exactly as stored (``revision`` set), for each commit.
    :ivar recovered: task id → the SCHEDULED task as stored, for a placement of an earlier call whose answer was
        lost and that this call found committed (the caller follows it as it follows ``stored``).
    """

    committed: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, GptrmError] = field(default_factory=dict)
    transactions: int = 0
    stored: dict[str, types_pb2.Task] = field(default_factory=dict)
    recovered: dict[str, types_pb2.Task] = field(default_factory=dict)

    def add(self, p: rec.Prepared, revision: int) -> None:
        """Record one committed placement."""
        p.task.revision = revision   # the prepared task is this commit's own message: handed out as stored
        self.committed[p.task_id] = revision
        self.stored[p.task_id] = p.task


class Placements:
    """The allocation half of ``Store`` (which delegates to it); see ``Store.commit_placements``.

    Example::

        placements = Placements(client, keys, writer, election)
        result = placements.commit([(task, task.revision, allocation)], held=state.holdings.reservation_on)
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
        self._unsettled: dict[str, tuple[rec.Prepared, bytes]] = {}   # task id → (placement, task as read)
        self._log = get_logger("sync")

    @property
    def unsettled(self) -> list[str]:
        """The tasks of placements whose answer was lost and that are not settled yet (see the module docstring,
        5): their whole GPUs count as held by every commit until they are."""
        return list(self._unsettled)

    def commit(self, placements: Sequence[PlacementCommit], held: Held | None = None) -> CommitResult:
        """Check each placement against ``held`` and those before it, batch, commit (up to ``max_in_flight``
        transactions at once: they share no key), and fall back to one placement per transaction for a batch
        that conflicts.

        :param held: what each node holds now; None: nothing (a caller with no holdings of its own).
        """
        started = time.monotonic()
        result = CommitResult()
        epoch = self._election.require_epoch()
        self._settle_lost(result)
        prepared: list[rec.Prepared] = []
        sums: dict[str, NodeReservation] = {}
        # Placements whose answer was lost: still unknown, or found committed just now (the caller follows those
        # only after this call): their GPUs are taken for this call's placements.
        taken = [p.allocation for p, _read in self._unsettled.values()]
        taken += [t.allocation for t in result.recovered.values()]
        for allocation in taken:
            for na in allocation.nodes:
                current = sums.get(na.node_id) or (held or _nothing)(na.node_id)
                sums[na.node_id] = current.add(na.node_id, rec.node_demand(na.demand), na.gpu_indices,
                                               na.gpu_share, check=False)
        read: dict[str, types_pb2.Task] = {}
        for task, revision, alloc in placements:
            try:
                p = rec.prepare_placement(
                    task, revision, alloc, epoch=epoch, now_unix_s=self._wall(), history_limit=self._history_limit
                )
                rec.check_reservations(held or _nothing, sums, p.allocation.nodes)
                prepared.append(p)
                read[p.task_id] = task
            except GptrmError as e:
                result.rejected[task.id] = e
            except ValueError as e:  # a state number outside TaskState
                result.rejected[task.id] = GptrmError(f"task {task.id}: {e}")
        batches = list(rec.batches(prepared, self._max_ops, self._max_bytes))
        if len(batches) > 1 and self._max_in_flight > 1:
            with ThreadPoolExecutor(min(self._max_in_flight, len(batches)), thread_name_prefix="gptrm-commit") as pool:
                outcomes = list(pool.map(self._write_batch, batches))
        else:
            outcomes = [self._write_batch(b) for b in batches]
        for batch, outcome in zip(batches, outcomes, strict=True):
            self._settle(batch, outcome, result)
        for p in prepared:
            error = result.rejected.get(p.task_id)
            if isinstance(error, EtcdUnavailable):
                as_read = types_pb2.Task()
                as_read.CopyFrom(read[p.task_id])
                as_read.revision = 0   # as stored (the revision is the key's, set when read)
                self._unsettled[p.task_id] = (p, as_read.SerializeToString())
                self._log.warning("placement_outcome_unknown", task_id=p.task_id, reason=str(error))
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

    def _settle_lost(self, result: CommitResult) -> None:
        """Settle each placement whose answer was lost (module docstring, 5): one that committed goes into
        ``result.recovered``; one that did not is made to fail for ever and dropped; one etcd still does not
        answer for stays.

        :raises Fenced, NotLeader: we do not lead.
        """
        for task_id, (p, as_read) in list(self._unsettled.items()):
            tkey, akey = self._keys.task(task_id), self._keys.allocation(task_id)
            try:
                outcome = self._writer.write([cmp_mod(tkey, p.expected_revision), cmp_create(akey, 0)],
                                             [op_put(tkey, as_read)], [op_get(tkey), op_get(akey)])
            except EtcdUnavailable:
                continue
            del self._unsettled[task_id]
            if outcome.succeeded:   # rewritten as read: the lost placement can never apply now
                self._log.info("placement_outcome_settled", task_id=task_id, committed=False)
                continue
            found_task, found_alloc = outcome.responses
            if found_task and found_alloc and found_task[0].value == p.task_bytes:
                p.task.revision = found_task[0].mod_revision
                result.recovered[task_id] = p.task
                self._log.info("placement_outcome_settled", task_id=task_id, committed=True,
                               revision=p.task.revision)
            else:   # changed by another write (cancelled, say): not this placement's
                self._log.info("placement_outcome_settled", task_id=task_id, committed=False)

    def _write_batch(self, batch: list[rec.Prepared]) -> TxnResult | GptrmError:
        """One fenced transaction for the batch (in a worker thread when several are in flight); the error
        instead of raising, so that every batch's outcome is settled in order."""
        try:
            return self._writer.write(*self._placement_ops(batch))
        except GptrmError as e:
            return e

    def _settle(self, batch: list[rec.Prepared], outcome: TxnResult | GptrmError, result: CommitResult) -> None:
        """Record a batch's outcome; a batch that did not commit goes one placement per transaction."""
        if isinstance(outcome, (Fenced, NotLeader)):
            raise outcome
        if isinstance(outcome, EtcdUnavailable):   # outcome unknown: the task says, once read again
            result.rejected.update({p.task_id: outcome for p in batch})
            return
        if isinstance(outcome, GptrmError):
            result.rejected.update({p.task_id: outcome for p in batch})
            return
        if outcome.succeeded:
            for p in batch:
                result.add(p, outcome.revision)
            result.transactions += 1
            return
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

    def _placement_ops(self, batch: list[rec.Prepared]) -> tuple[list[Compare], list[Op]]:
        compare: list[Compare] = []
        success: list[Op] = []
        for p in batch:
            tkey, akey = self._keys.task(p.task_id), self._keys.allocation(p.task_id)
            compare += [cmp_mod(tkey, p.expected_revision), cmp_create(akey, 0)]
            success += [op_put(tkey, p.task_bytes), op_put(akey, p.allocation_bytes)]
        return compare, success

    def _commit_one(self, p: rec.Prepared) -> int:
        tkey, akey = self._keys.task(p.task_id), self._keys.allocation(p.task_id)
        compare, success = self._placement_ops([p])
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
        raise Conflict(f"task {p.task_id} already has an allocation")

    def release_ops(self, task_id: str) -> tuple[list[Compare], list[Op]]:
        """Compares and ops that delete the task's allocation, for the transaction that ends or requeues the task
        (which compares the task's revision: an allocation is written and deleted only with its task, so the
        task unchanged means the allocation unchanged). Deleting an absent key is a no-op."""
        return [], [op_delete(self._keys.allocation(task_id))]

    def release(self, task_id: str) -> bool:
        """Delete the allocation in one fenced transaction; False if there is none."""
        akey = self._keys.allocation(task_id)
        for _attempt in range(ATTEMPTS):
            kv = self._client.get(akey)
            if kv is None:
                return False
            if self._writer.write([cmp_mod(akey, kv.mod_revision)], [op_delete(akey)]).succeeded:
                self._log.info("allocation_released", task_id=task_id)
                return True
        raise Conflict(f"task {task_id}: allocation kept changing while being released ({ATTEMPTS} attempts)")


def _nothing(_node_id: str) -> NodeReservation:
    return NodeReservation()
