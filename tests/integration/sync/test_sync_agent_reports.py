"""Which agent reports the leader applies, ignores quietly or refuses, judged on task records as etcd stores them:
a node's late report about a task it held earlier is stale (logged at debug level, not audited); one about a
task never placed on it is refused and audited."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from structlog.testing import capture_logs

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TaskState
from coordinator.api.agent_guard import AgentGuard, NodeStanding, node_standing
from coordinator.monitor.nodes import NodeEntry, NodeRegistry
from coordinator.state import LeaderState
from coordinator.sync import Election, EtcdClient, Keys, Store
from coordinator.tasks import TaskTable
from tests.helpers.audit import RecordingAudit

S = TaskState


class _Security:
    """What the guard uses of the server's Security when it refuses: the audit log."""

    def __init__(self) -> None:
        self.audit = RecordingAudit()


class _Leader:
    """The leader's view of what ``store`` holds: its task table, node entries and the guard over them."""

    def __init__(self, store: Store) -> None:
        loaded = store.load_all()
        self.registry = NodeRegistry(heartbeat_interval_s=1.0, lost_grace_s=10.0)
        state = LeaderState(self.registry)
        state.adopt(loaded.tasks, loaded.nodes)
        self.security = _Security()
        self.guard = AgentGuard(self.registry, TaskTable(None, None, state, *[None] * 7),  # type: ignore[arg-type]
                                self.security)  # type: ignore[arg-type]

    def entry(self, node_id: str) -> NodeEntry:
        entry = self.registry.get(node_id)
        assert entry is not None
        return entry

    def status(self, node_id: str, task_id: str) -> bool:
        status = agent_pb2.TaskStatus(task_id=task_id, state=types_pb2.TASK_STATE_CANCELLED, event_seq=1)
        return self.guard.status_allowed(self.entry(node_id), status)

    def ack(self, node_id: str, task_id: str) -> bool:
        ack = agent_pb2.DecisionAck(decision_id="d-1", ok=True, task_id=task_id,
                                    resulting_state=types_pb2.TASK_STATE_CANCELLED)
        return self.guard.ack_allowed(self.entry(node_id), ack)

    @property
    def refused(self) -> list[tuple[str, str, str]]:
        return [(r["principal"], r["method"], r["target"]) for r in self.security.audit.records
                if r["outcome"] == "refused"]


def _moved(store: Store, make_task: Callable, make_allocation: Callable, first: types_pb2.Allocation,
           then: types_pb2.Allocation) -> types_pb2.Task:
    """A task placed by ``first``, handed back to the queue (a drain), then placed by ``then``."""
    task = store.create_task(make_task())
    rev = store.commit_placements([(task, task.revision, first)]).committed[task.id]
    drained = store.transition(task.id, rev, S.PREEMPTED, "node draining: back to the queue", release=True)
    back = store.transition(task.id, drained.revision, S.PENDING, "back in the queue")
    assert not back.allocation.nodes and not back.parts   # the record no longer names its first nodes
    store.commit_placements([(back, back.revision, then)])
    return store.get_task(task.id)


@pytest.fixture
def nodes(store: Store, make_node: Callable) -> None:
    for node_id in ("n1", "n2", "n3"):
        store.put_node(make_node(node_id))


@pytest.mark.usefixtures("nodes")
class TestReportsAboutMovedTasks:
    def test_late_report_from_the_earlier_node_is_stale_not_refused(
        self, store: Store, make_task: Callable, make_allocation: Callable
    ) -> None:
        """A requeued task placed on n2: n1's late ack and status are ignored, logged as agent_ack_stale at
        debug level and not audited; n2's pass; n3, which never held it, is refused and audited."""
        task = _moved(store, make_task, make_allocation, make_allocation("n1", [0]), make_allocation("n2", [0]))
        leader = _Leader(store)
        with capture_logs() as logs:
            assert leader.ack("n1", task.id) is False
            assert leader.status("n1", task.id) is False
        assert [(e["event"], e["log_level"], e["node_id"], e["method"]) for e in logs] == [
            ("agent_ack_stale", "debug", "n1", "DecisionAck"), ("agent_ack_stale", "debug", "n1", "TaskStatus")]
        assert leader.refused == []
        assert leader.ack("n2", task.id) is True and leader.status("n2", task.id) is True
        with capture_logs() as logs:
            assert leader.ack("n3", task.id) is False
            assert leader.status("n3", task.id) is False
        assert [(e["event"], e["log_level"]) for e in logs] == [("decision_ack_refused", "warning"),
                                                                ("task_status_refused", "warning")]
        assert leader.refused == [("n3", "DecisionAck", task.id), ("n3", "TaskStatus", task.id)]
        assert "not placed on it" in leader.security.audit.records[0]["reason"]

    def test_every_node_of_an_earlier_gang_placement_held_it(
        self, store: Store, make_task: Callable, make_allocation: Callable
    ) -> None:
        """A 2-node task re-placed on n3: both n1 and n2 held it earlier (one SCHEDULED entry names both)."""
        gang = make_allocation("n1", [0])
        gang.nodes.extend(make_allocation("n2", [0]).nodes)
        task = _moved(store, make_task, make_allocation, gang, make_allocation("n3", [1]))
        assert [node_standing(task, n) for n in ("n1", "n2", "n3", "n9")] == [
            NodeStanding.EARLIER, NodeStanding.EARLIER, NodeStanding.NOW, NodeStanding.NEVER]
        leader = _Leader(store)
        assert leader.status("n2", task.id) is False and leader.refused == []

    def test_a_task_that_ended_stays_held_by_its_node(
        self, store: Store, make_task: Callable, make_allocation: Callable
    ) -> None:
        """A task that ended keeps its allocation in its record: its node's late reports still pass, as before."""
        task = store.create_task(make_task())
        rev = store.commit_placements([(task, task.revision, make_allocation("n1", [0]))]).committed[task.id]
        store.transition(task.id, rev, S.CANCELLED, "cancelled before it started", release=True)
        leader = _Leader(store)
        assert leader.ack("n1", task.id) is True
        assert leader.status("n2", task.id) is False and leader.refused == [("n2", "TaskStatus", task.id)]

    def test_unknown_task_passes_as_before(self, store: Store) -> None:
        """A report about a task the leader does not know is not judged here (the scheduler stops such a task)."""
        leader = _Leader(store)
        assert leader.status("n1", "t-gone") is True and leader.ack("n1", "t-gone") is True
        assert leader.refused == []

    def test_history_cut_short_counts_as_moved_on(
        self, sync_client: EtcdClient, keys: Keys, leader: Election, make_task: Callable, make_allocation: Callable
    ) -> None:
        """When the kept history no longer reaches back to the submission, whether a node never held the task
        cannot be told: its report counts as stale, not as a refusal."""
        short = Store(sync_client, keys, leader, history_limit=2)
        task = _moved(short, make_task, make_allocation, make_allocation("n1", [0]), make_allocation("n2", [0]))
        assert [S(c.state) for c in task.history] == [S.PENDING, S.SCHEDULED]   # the submission is gone
        assert node_standing(task, "n3") is NodeStanding.EARLIER
        view = _Leader(short)
        assert view.ack("n3", task.id) is False and view.ack("n1", task.id) is False
        assert view.refused == []
