"""Store against a real etcd: fencing, the task state machine, idempotent submit, nodes, policy, recovery."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from common.errors import Fenced, IllegalTransition, NotFound, NotLeader, ValidationError
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.sync import LEGAL_TRANSITIONS, Conflict, Election, EtcdClient, Keys, Store
from coordinator.sync.store import Transition
from tests.helpers.holdings import held_gpus

MakeElection = Callable[..., Election]
S = TaskState

# How to bring a fresh task to each state (SCHEDULED is reached through commit_placements).
PATHS: dict[TaskState, list[TaskState]] = {
    S.PENDING: [],
    S.SCHEDULED: [S.SCHEDULED],
    S.STARTING: [S.SCHEDULED, S.STARTING],
    S.RUNNING: [S.SCHEDULED, S.STARTING, S.RUNNING],
    S.PAUSED: [S.SCHEDULED, S.STARTING, S.RUNNING, S.PAUSED],
    S.PREEMPTED: [S.SCHEDULED, S.STARTING, S.RUNNING, S.PREEMPTED],
    S.FAILED: [S.SCHEDULED, S.STARTING, S.RUNNING, S.FAILED],
    S.SUCCEEDED: [S.SCHEDULED, S.STARTING, S.RUNNING, S.SUCCEEDED],
    S.CANCELLED: [S.CANCELLED],
}
LEGAL_EDGES = sorted((src, dst) for src, dsts in LEGAL_TRANSITIONS.items() for dst in dsts if dst is not S.SCHEDULED)


def drive(store: Store, task: types_pb2.Task, path: list[TaskState], alloc: types_pb2.Allocation) -> types_pb2.Task:
    """Move a stored task along ``path``, committing ``alloc`` for the step to SCHEDULED."""
    for state in path:
        if state is S.SCHEDULED:
            result = store.commit_placements([(task, task.revision, alloc)])
            assert task.id in result.committed, result.rejected
            task = store.get_task(task.id)
        else:
            task = store.transition(task.id, task.revision, state, f"to {state.name}")
    return task


@pytest.fixture
def node(store: Store, make_node: Callable[..., types_pb2.NodeRecord]) -> types_pb2.NodeRecord:
    """One stored node, n1."""
    return store.put_node(make_node("n1"))


class TestFencing:
    """Fencing: a deposed leader's writes fail with Fenced and it steps down."""

    def test_deposed_leader_writes_are_fenced(
        self,
        make_election: MakeElection,
        sync_client: EtcdClient,
        client_factory: Callable[[], EtcdClient],
        keys: Keys,
        make_task: Callable[..., types_pb2.Task],
    ) -> None:
        """After A's lease is revoked and B leads, A's write raises Fenced, A steps down, B writes fine."""
        reasons: list[str] = []
        # A long TTL: A's own refresh would notice the revoke only after ~3 s, so A still believes it leads.
        a = make_election("coord-a", ttl_s=10.0, on_lost=reasons.append)
        assert a.acquire(timeout=5.0)
        store_a = Store(sync_client, keys, a)
        task = store_a.create_task(make_task(), request_id="r-1")
        client_factory().revoke_lease(a.lease_id)  # type: ignore[arg-type]  # as if A's lease expired
        b = make_election("coord-b", client=client_factory())
        assert b.wait_for_leadership(timeout=0.1) is False
        b.start()
        assert b.wait_for_leadership(timeout=3.0)
        assert a.is_leader  # A has not noticed yet: only fencing stands between it and the data
        with pytest.raises(Fenced, match="our epoch is"):
            store_a.transition(task.id, task.revision, S.CANCELLED, "stale leader")
        assert not a.is_leader
        assert reasons and reasons[0].startswith("fenced")
        with pytest.raises(NotLeader):
            store_a.put_policy(types_pb2.Policy(name="load-balancing"))
        store_b = Store(sync_client, keys, b)
        assert store_b.get_task(task.id).state == S.PENDING
        store_b.transition(task.id, task.revision, S.CANCELLED, "new leader")

    def test_every_write_needs_leadership(
        self, make_election: MakeElection, sync_client: EtcdClient, keys: Keys, make_node: Callable
    ) -> None:
        """A store whose election never won refuses writes with NotLeader but serves reads."""
        standby = Store(sync_client, keys, make_election("coord-z"))
        with pytest.raises(NotLeader):
            standby.put_node(make_node("n1"))
        with pytest.raises(NotLeader):
            standby.put_policy(types_pb2.Policy(name="max-utilization"))
        assert standby.list_nodes() == []


class TestTransitions:
    """transition(): the state machine, compare-on-revision, history and updates."""

    @pytest.mark.parametrize(("src", "dst"), LEGAL_EDGES, ids=lambda s: s.name)
    def test_legal_transition_commits(
        self,
        store: Store,
        node: types_pb2.NodeRecord,
        make_task: Callable,
        make_allocation: Callable,
        src: TaskState,
        dst: TaskState,
    ) -> None:
        """Each legal transition (other than into SCHEDULED) commits and is recorded in the history."""
        task = drive(store, store.create_task(make_task()), PATHS[src], make_allocation("n1", []))
        assert task.state == src
        moved = store.transition(task.id, task.revision, dst, "because")
        assert moved.state == dst and moved.reason == "because"
        assert moved.revision > task.revision
        stored = store.get_task(task.id)
        assert stored == moved
        assert [h.state for h in stored.history] == [S.PENDING, *PATHS[src], dst]

    @pytest.mark.parametrize(
        ("src", "dst"),
        [(S.RUNNING, S.PENDING), (S.SUCCEEDED, S.RUNNING), (S.PENDING, S.RUNNING), (S.CANCELLED, S.PENDING),
         (S.FAILED, S.CANCELLED), (S.PAUSED, S.SUCCEEDED), (S.PREEMPTED, S.RUNNING)],
        ids=lambda s: s.name,
    )  # fmt: skip
    def test_illegal_transition_is_refused(
        self,
        store: Store,
        node: types_pb2.NodeRecord,
        make_task: Callable,
        make_allocation: Callable,
        src: TaskState,
        dst: TaskState,
    ) -> None:
        """An illegal transition raises IllegalTransition naming the task and both states, and writes nothing."""
        task = drive(store, store.create_task(make_task()), PATHS[src], make_allocation("n1", []))
        with pytest.raises(IllegalTransition, match=f"task {task.id}: {src.name} → {dst.name} is not allowed"):
            store.transition(task.id, task.revision, dst, "nope")
        assert store.get_task(task.id).revision == task.revision

    def test_scheduled_only_through_commit_placements(self, store: Store, make_task: Callable) -> None:
        """transition() refuses SCHEDULED, which must come with an allocation."""
        task = store.create_task(make_task())
        with pytest.raises(IllegalTransition, match="commit_placements"):
            store.transition(task.id, task.revision, S.SCHEDULED, "no allocation")

    def test_lost_revision_race_raises_conflict(self, store: Store, make_task: Callable) -> None:
        """Of two writers holding the same revision, the second gets Conflict saying the task changed."""
        task = store.create_task(make_task())
        store.transition(task.id, task.revision, S.CANCELLED, "first")
        with pytest.raises(Conflict, match=f"task {task.id} changed: expected revision {task.revision}"):
            store.transition(task.id, task.revision, S.CANCELLED, "second")

    def test_known_copy_writes_without_a_read_and_still_compares(self, store: Store, make_task: Callable) -> None:
        """A transition from the caller's copy at the expected revision writes that copy's change; a copy of a
        revision etcd no longer holds writes nothing and raises Conflict, like a read would have."""
        task = store.create_task(make_task())
        moved = store.transition(task.id, task.revision, S.CANCELLED, "from the copy", known=task)
        assert store.get_task(task.id) == moved and moved.reason == "from the copy"
        with pytest.raises(Conflict, match=f"task {task.id} changed"):
            store.transition(task.id, task.revision, S.CANCELLED, "stale copy", known=task)
        assert store.get_task(task.id).reason == "from the copy"

    def test_concurrent_writers_exactly_one_wins(self, store: Store, make_task: Callable) -> None:
        """Eight threads racing to cancel the same revision: exactly one succeeds."""
        task = store.create_task(make_task())

        def cancel(i: int) -> bool:
            try:
                store.transition(task.id, task.revision, S.CANCELLED, f"writer {i}")
            except Conflict:
                return False
            return True

        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(cancel, range(8)))
        assert outcomes.count(True) == 1

    def test_updates_are_written_with_the_state(
        self, store: Store, node: types_pb2.NodeRecord, make_task: Callable, make_allocation: Callable
    ) -> None:
        """Field updates land in the same write; exit_code sets has_exit_code; bad fields are refused."""
        task = drive(store, store.create_task(make_task()), PATHS[S.RUNNING], make_allocation("n1", []))
        task = store.update_task(task.id, task.revision, pids=[101, 102], log_tail="step 10")
        assert list(task.pids) == [101, 102]
        failed = store.transition(task.id, task.revision, S.FAILED, "exit 3", exit_code=3, log_tail="boom")
        stored = store.get_task(task.id)
        assert (stored.exit_code, stored.has_exit_code, stored.log_tail) == (3, True, "boom")
        assert stored.revision == failed.revision
        with pytest.raises(ValidationError, match=r"task\.state"):
            store.update_task(task.id, stored.revision, state=S.RUNNING)
        requeued = store.transition(task.id, stored.revision, S.PENDING, "restart policy", restarts=1)
        assert requeued.restarts == 1

    def test_release_frees_the_allocation_with_the_transition(
        self, store: Store, node: types_pb2.NodeRecord, make_task: Callable, make_allocation: Callable,
        sync_client: EtcdClient,
    ) -> None:
        """transition(release=True) deletes the allocation (what the task held) in the same write."""
        task = drive(store, store.create_task(make_task()), PATHS[S.RUNNING], make_allocation("n1", [2, 3]))
        assert held_gpus(store) == {"n1": [2, 3]}
        before = sync_client.get(store.keys.node("n1"))
        store.transition(task.id, task.revision, S.SUCCEEDED, "exit 0", release=True, exit_code=0)
        assert store.get_allocation(task.id) is None and held_gpus(store) == {}
        after = sync_client.get(store.keys.node("n1"))
        assert before is not None and after is not None and after.mod_revision == before.mod_revision   # untouched

    def test_batched_ends_free_reservations_in_one_write(
        self, store: Store, node: types_pb2.NodeRecord, make_task: Callable, make_allocation: Callable
    ) -> None:
        """Three tasks on one node ending together: one transaction (one revision) stores each end and deletes each
        allocation; the node holds nothing after."""
        tasks = [drive(store, store.create_task(make_task(f"e{i}")), PATHS[S.RUNNING], make_allocation("n1", [i]))
                 for i in range(3)]
        assert held_gpus(store) == {"n1": [0, 1, 2]}
        out = store.transitions([Transition(t.id, t.revision, S.SUCCEEDED, "exit 0", release=True, known=t,
                                            updates={"exit_code": 0}) for t in tasks])
        assert all(isinstance(t, types_pb2.Task) for t in out)
        assert len({t.revision for t in out}) == 1   # type: ignore[union-attr]
        assert all(store.get_task(t.id).state == S.SUCCEEDED and store.get_allocation(t.id) is None for t in tasks)
        assert held_gpus(store) == {}

    def test_a_state_passed_through_is_stored_in_the_same_write(
        self, store: Store, node: types_pb2.NodeRecord, make_task: Callable, make_allocation: Callable
    ) -> None:
        """``via``: SCHEDULED → STARTING → RUNNING in one write (one revision), each step in the history; alone and
        in a batch; a step the state machine forbids writes nothing."""
        a, b, c = (drive(store, store.create_task(make_task(f"v{i}")), PATHS[S.SCHEDULED], make_allocation("n1", [i]))
                   for i in range(3))
        one = store.transition(a.id, a.revision, S.RUNNING, "running", via=S.STARTING, known=a)
        assert [h.state for h in one.history][-3:] == [S.SCHEDULED, S.STARTING, S.RUNNING]
        assert store.get_task(a.id).revision == one.revision and one.state == S.RUNNING
        out = store.transitions([Transition(t.id, t.revision, S.RUNNING, "", known=t, via=S.STARTING) for t in (b, c)])
        assert all(isinstance(t, types_pb2.Task) and [h.state for h in t.history][-2:] == [S.STARTING, S.RUNNING]
                   for t in out)
        assert len({t.revision for t in out}) == 1   # type: ignore[union-attr]
        with pytest.raises(IllegalTransition):
            store.transition(a.id, one.revision, S.RUNNING, "", via=S.PENDING)
        assert store.get_task(a.id).revision == one.revision

    def test_a_batch_with_a_changed_task_goes_one_by_one(
        self, store: Store, node: types_pb2.NodeRecord, make_task: Callable, make_allocation: Callable
    ) -> None:
        """One task of the batch changed meanwhile: it alone gets Conflict (nothing of it written), the others'
        changes are stored and their allocations deleted; an illegal change gets its IllegalTransition."""
        a, b = (drive(store, store.create_task(make_task(f"c{i}")), PATHS[S.RUNNING], make_allocation("n1", [i]))
                for i in range(2))
        moved = store.update_task(b.id, b.revision, log_tail="changed")
        pending = store.create_task(make_task("p"))
        out = store.transitions([Transition(a.id, a.revision, S.SUCCEEDED, "", release=True, known=a),
                                 Transition(b.id, b.revision, S.SUCCEEDED, "", release=True, known=b),
                                 Transition(pending.id, pending.revision, S.RUNNING, "", known=pending)])
        assert isinstance(out[0], types_pb2.Task) and out[0].state == S.SUCCEEDED
        assert isinstance(out[1], Conflict) and store.get_task(b.id).revision == moved.revision
        assert isinstance(out[2], IllegalTransition) and not isinstance(out[2], Conflict)
        assert held_gpus(store) == {"n1": [1]}

    def test_together_writes_all_or_nothing(
        self, store: Store, node: types_pb2.NodeRecord, make_task: Callable, make_allocation: Callable
    ) -> None:
        """transitions_together: with one task changed meanwhile it raises Conflict and writes nothing (the other
        task keeps its state); with both as known, both change at one revision."""
        a, b = (drive(store, store.create_task(make_task(f"g{i}")), PATHS[S.RUNNING], make_allocation("n1", [i]))
                for i in range(2))
        moved = store.update_task(b.id, b.revision, log_tail="changed")
        with pytest.raises(Conflict):
            store.transitions_together([Transition(t.id, t.revision, S.PREEMPTED, "p", known=t,
                                                   updates={"preemptions": 1}) for t in (a, b)])
        assert store.get_task(a.id).revision == a.revision and store.get_task(a.id).state == S.RUNNING
        out = store.transitions_together([Transition(a.id, a.revision, S.PREEMPTED, "p", known=a),
                                          Transition(b.id, moved.revision, S.PREEMPTED, "p", known=moved)])
        assert [t.state for t in out] == [S.PREEMPTED, S.PREEMPTED] and out[0].revision == out[1].revision
        assert all(store.get_task(t.id).revision == t.revision for t in out)
        assert held_gpus(store) == {"n1": [0, 1]}   # PREEMPTED keeps the allocations

    def test_missing_task_is_not_found(self, store: Store) -> None:
        """Transitions of an unknown task raise NotFound."""
        with pytest.raises(NotFound, match="t-missing"):
            store.transition("t-missing", 1, S.CANCELLED, "x")


class TestCreateTask:
    """create_task(): ids, PENDING, idempotency per request id."""

    def test_new_task_is_pending_with_generated_id(self, store: Store, make_task: Callable) -> None:
        """A submitted task gets a t- id, PENDING state, a submit time and one history entry."""
        task = store.create_task(make_task())
        assert task.id.startswith("t-") and task.state == S.PENDING
        assert task.submit_unix_s > 0 and [h.state for h in task.history] == [S.PENDING]
        assert store.get_task(task.id) == task

    def test_retried_submit_returns_the_same_task(self, store: Store, make_task: Callable) -> None:
        """The same request id twice yields one task; another request id yields another."""
        first = store.create_task(make_task("a"), request_id="req-1")
        again = store.create_task(make_task("a"), request_id="req-1")
        other = store.create_task(make_task("a"), request_id="req-2")
        assert again == first
        assert other.id != first.id
        assert len(store.list_tasks()) == 2

    def test_request_id_with_another_spec_is_refused(self, store: Store, make_task: Callable) -> None:
        """Reusing a request id for a different spec is a Conflict, not a silent return of the first task."""
        first = store.create_task(make_task("a"), request_id="req-1")
        with pytest.raises(Conflict, match="different spec"):
            store.create_task(make_task("b"), request_id="req-1")
        assert [t.id for t in store.list_tasks()] == [first.id]

    def test_concurrent_retries_create_one_task(self, store: Store, make_task: Callable) -> None:
        """Eight threads submitting with one request id all get the same single task."""
        barrier = threading.Barrier(8)

        def submit(_i: int) -> str:
            barrier.wait()
            return store.create_task(make_task("x"), request_id="req-race").id

        with ThreadPoolExecutor(8) as pool:
            ids = set(pool.map(submit, range(8)))
        assert len(ids) == 1
        assert [t.id for t in store.list_tasks()] == list(ids)

    def test_many_creates_in_one_transaction(self, store: Store, make_task: Callable) -> None:
        """New tasks created together share one etcd revision (one transaction), each stored PENDING with its
        request id remembered: a retry of one of them returns its task."""
        created = store.create_submits([(make_task(f"b{i}"), f"req-b{i}") for i in range(5)])
        assert all(isinstance(t, types_pb2.Task) for t in created)
        assert len({t.revision for t in created}) == 1   # type: ignore[union-attr]
        assert {t.id for t in store.list_tasks()} == {t.id for t in created}  # type: ignore[union-attr]
        assert store.create_task(make_task("b3"), request_id="req-b3").id == created[3].id  # type: ignore[union-attr]

    def test_a_batch_with_a_known_request_id_keeps_idempotency(self, store: Store, make_task: Callable) -> None:
        """A batch holding a retried submit (its request id known), the same request twice, and a request id
        reused for another spec: each gets what create_task gives it (the first task; a Conflict), the rest are
        created, nothing twice."""
        first = store.create_task(make_task("r"), request_id="req-r")
        out = store.create_submits([(make_task("new"), "req-new"), (make_task("r"), "req-r"),
                                  (make_task("other"), "req-r"), (make_task("dup"), "req-dup"),
                                  (make_task("dup"), "req-dup")])
        assert isinstance(out[0], types_pb2.Task) and out[1] == first
        assert isinstance(out[2], Conflict)
        assert isinstance(out[3], types_pb2.Task) and out[4] == out[3]
        assert len(store.list_tasks()) == 3

    def test_explicit_duplicate_id_conflicts(self, store: Store, make_task: Callable) -> None:
        """Creating a task whose id exists (under a new request id) raises Conflict."""
        task = make_task()
        task.id = "t-fixed"
        store.create_task(task, request_id="req-a")
        with pytest.raises(Conflict, match="t-fixed"):
            store.create_task(task, request_id="req-b")

    def test_non_pending_task_is_refused(self, store: Store, make_task: Callable) -> None:
        """A task submitted in another state than PENDING is refused."""
        task = make_task()
        task.state = S.RUNNING
        with pytest.raises(IllegalTransition, match="must be PENDING"):
            store.create_task(task)


class TestNodesPolicyRecovery:
    """Nodes, policy and load_all()."""

    def test_put_node_stores_no_reservation_and_leaves_what_is_held(
        self, store: Store, node: types_pb2.NodeRecord, make_task: Callable, make_allocation: Callable
    ) -> None:
        """A node update (heartbeat) stores the record without reservation fields (even one handed in with them,
        as an older layout kept them); what the node holds is its allocations', unchanged by it."""
        task = store.create_task(make_task())
        store.commit_placements([(task, task.revision, make_allocation("n1", [0]))])
        beat = types_pb2.NodeRecord()
        beat.CopyFrom(node)
        beat.last_seen_unix_s = 123.0
        beat.reserved_gpu_indices.extend([5, 6])
        beat.reserved.gpus = 2
        stored = store.put_node(beat)
        assert stored.last_seen_unix_s == 123.0 and not stored.reserved_gpu_indices and not stored.HasField("reserved")
        assert store.get_node("n1") == stored
        assert held_gpus(store) == {"n1": [0]}

    def test_put_nodes_in_batches_keeps_reservations(
        self, store: Store, node: types_pb2.NodeRecord, make_node: Callable, make_task: Callable,
        make_allocation: Callable, sync_client: EtcdClient, keys: Keys, make_election: MakeElection,
    ) -> None:
        """Many registrations in few transactions: every record stored, what n1 holds unchanged, chunks bounded by
        the transaction size; a standby's batch is refused."""
        task = store.create_task(make_task())
        store.commit_placements([(task, task.revision, make_allocation("n1", [0]))])
        small = Store(sync_client, keys, store._election, max_txn_ops=8)   # chunks of 7 nodes
        records = [make_node(f"n{i}") for i in range(1, 21)]
        for r in records:
            r.last_seen_unix_s = 7.0
        stored = small.put_nodes(records)
        assert [r.inventory.node_id for r in stored] == [f"n{i}" for i in range(1, 21)]
        assert held_gpus(store) == {"n1": [0]}
        assert all(store.get_node(f"n{i}").last_seen_unix_s == 7.0 for i in range(1, 21))
        with pytest.raises(NotLeader):
            Store(sync_client, keys, make_election("coord-z")).put_nodes(records[:2])

    def test_put_nodes_falls_back_per_node_when_one_changed(
        self, store: Store, make_node: Callable, sync_client: EtcdClient, keys: Keys
    ) -> None:
        """A node written after the batch read it (another writer) makes the chunk's compare fail: every record
        is then written on its own, nothing lost."""
        store.put_nodes([make_node("n1"), make_node("n2")])
        real_read = store._writer.read_nodes

        def read_then_race(ids):   # type: ignore[no-untyped-def]
            got = real_read(ids)
            other = make_node("n2")
            other.last_seen_unix_s = 99.0
            store.put_node(other)
            return got

        store._writer.read_nodes = read_then_race   # type: ignore[method-assign]
        a, b = make_node("n1"), make_node("n2")
        a.last_seen_unix_s = b.last_seen_unix_s = 5.0
        stored = store.put_nodes([a, b])
        assert [r.last_seen_unix_s for r in stored] == [5.0, 5.0]
        assert store.get_node("n2").last_seen_unix_s == 5.0

    def test_nodes_listed_and_deleted(self, store: Store, make_node: Callable) -> None:
        """Nodes list by id; delete removes one; a missing node is NotFound."""
        for node_id in ("n2", "n1", "n3"):
            store.put_node(make_node(node_id))
        assert [n.inventory.node_id for n in store.list_nodes()] == ["n1", "n2", "n3"]
        assert store.delete_node("n2") is True
        assert store.delete_node("n2") is False
        with pytest.raises(NotFound, match="'n2'"):
            store.get_node("n2")

    def test_policy_round_trip(self, store: Store) -> None:
        """The policy is None until set, then reads back as stored."""
        assert store.get_policy() is None
        store.put_policy(types_pb2.Policy(name="power-efficient", threshold=0.8))
        assert store.get_policy() == types_pb2.Policy(name="power-efficient", threshold=0.8)

    def test_load_all_reads_everything_at_one_revision(
        self, store: Store, node: types_pb2.NodeRecord, make_task: Callable, make_allocation: Callable
    ) -> None:
        """load_all returns nodes, tasks with revisions, allocations and the policy."""
        placed = store.create_task(make_task("placed"))
        waiting = store.create_task(make_task("waiting"))
        store.commit_placements([(placed, placed.revision, make_allocation("n1", [1]))])
        store.put_policy(types_pb2.Policy(name="load-balancing", threshold=0.9))
        state = store.load_all()
        assert set(state.nodes) == {"n1"} and set(state.tasks) == {placed.id, waiting.id}
        assert set(state.allocations) == {placed.id}
        assert state.tasks[placed.id].state == S.SCHEDULED
        assert state.tasks[placed.id].revision == store.get_task(placed.id).revision
        assert state.policy is not None and state.policy.name == "load-balancing"
        assert state.revision >= state.tasks[placed.id].revision


class TestQuarantine:
    """load_all() moves values it cannot use aside instead of failing."""

    def test_corrupt_values_are_quarantined(self, store: Store, sync_client: EtcdClient, keys: Keys,
                                            make_task: Callable, node: types_pb2.NodeRecord) -> None:
        """Garbage bytes in a task and a node key, and a task stored under another id, are moved under
        quarantine/ with their original bytes; every good record still loads."""
        from coordinator.sync.client import op_put
        good = store.create_task(make_task("good"))
        garbage = b"\xff\xfe garbage \x00\x01"
        elsewhere = types_pb2.Task(id="t-other", state=int(TaskState.PENDING)).SerializeToString()
        sync_client.txn([], [op_put(keys.task("t-bad"), garbage), op_put(keys.node("n-bad"), garbage),
                             op_put(keys.task("t-moved"), elsewhere)])
        state = store.load_all()
        assert sorted(state.quarantined) == sorted([keys.task("t-bad"), keys.node("n-bad"), keys.task("t-moved")])
        assert list(state.tasks) == [good.id] and list(state.nodes) == ["n1"]
        assert sync_client.get(keys.task("t-bad")) is None and sync_client.get(keys.node("n-bad")) is None
        moved = {kv.key.rsplit("@", 1)[0]: kv.value for kv in sync_client.range_prefix(keys.quarantine_prefix)[0]}
        assert moved[keys.quarantine_prefix + "tasks/t-bad"] == garbage
        assert moved[keys.quarantine_prefix + "nodes/n-bad"] == garbage
        assert store.load_all().quarantined == ()
