"""The leader's workflow rules on pending tasks: start times, dependencies, array limits
(coordinator/scheduler/workflow.py)."""

from __future__ import annotations

from collections.abc import Sequence

from common.pb.gptrm.v1 import types_pb2
from coordinator.scheduler.workflow import WorkflowGate

S = types_pb2
NOW = 1_800_000_000.0


def task(task_id: str, state: types_pb2.TaskState = S.TASK_STATE_PENDING, *,
         after: Sequence[tuple[types_pb2.DependencyKind, list[str]]] = (), array: str = "", index: int = 0,
         most: int = 0, begin: float = 0.0, keep: bool = False,
         restart: types_pb2.RestartPolicy = S.RESTART_POLICY_NEVER) -> types_pb2.Task:
    spec = S.TaskSpec(argv=["true"], after=[S.Dependency(kind=k, ids=ids) for k, ids in after], begin_unix_s=begin,
                      keep_unmet=keep, restart_policy=restart)
    if array:
        spec.array.CopyFrom(S.ArraySpec(first=0, last=99, max_running=most))
    return S.Task(id=task_id, state=state, spec=spec, array_id=array, array_index=index)


class Table:
    """A task table by id with an array index, as the leader state keeps them."""

    def __init__(self, *tasks: types_pb2.Task) -> None:
        self.tasks = {t.id: t for t in tasks}
        self.lookups = 0

    def find(self, task_id: str) -> types_pb2.Task | None:
        self.lookups += 1
        return self.tasks.get(task_id)

    def elements(self, array_id: str) -> list[types_pb2.Task]:
        return sorted((t for t in self.tasks.values() if t.array_id == array_id), key=lambda t: t.array_index)

    def gate(self) -> WorkflowGate:
        def will_restart(t: types_pb2.Task) -> bool:
            return t.state == S.TASK_STATE_FAILED and t.spec.restart_policy == S.RESTART_POLICY_ON_FAILURE

        return WorkflowGate(self.find, self.elements, will_restart)

    def pending(self) -> list[types_pb2.Task]:
        return [t for t in self.tasks.values() if t.state == S.TASK_STATE_PENDING]


OK, NOTOK, ANY = S.DEPENDENCY_KIND_OK, S.DEPENDENCY_KIND_NOTOK, S.DEPENDENCY_KIND_ANY


class TestBegin:
    def test_a_task_waits_for_its_start_time(self) -> None:
        t = Table(task("t-1", begin=NOW + 60))
        gated = t.gate().sort(t.pending(), NOW)
        assert not gated.ready and gated.held["t-1"] == "begins at 2027-01-15T08:01:00Z"
        assert [x.id for x in t.gate().sort(t.pending(), NOW + 60).ready] == ["t-1"]


class TestDependencies:
    def test_ok_waits_then_runs_after_success(self) -> None:
        t = Table(task("t-a", S.TASK_STATE_RUNNING), task("t-b", after=[(OK, ["t-a"])]))
        gated = t.gate().sort(t.pending(), NOW)
        assert gated.held == {"t-b": "waiting for t-a to succeed"}
        t.tasks["t-a"].state = S.TASK_STATE_SUCCEEDED
        assert [x.id for x in t.gate().sort(t.pending(), NOW).ready] == ["t-b"]

    def test_ok_after_a_failure_ends_the_task_with_its_reason(self) -> None:
        t = Table(task("t-a", S.TASK_STATE_FAILED), task("t-b", after=[(OK, ["t-a"])]))
        gated = t.gate().sort(t.pending(), NOW)
        assert [(x.id, why) for x, why in gated.unmet] == [("t-b", "dependency t-a failed: never satisfied")]

    def test_keep_unmet_leaves_it_pending_with_the_reason(self) -> None:
        t = Table(task("t-a", S.TASK_STATE_CANCELLED), task("t-b", after=[(OK, ["t-a"])], keep=True))
        gated = t.gate().sort(t.pending(), NOW)
        assert not gated.unmet and gated.held["t-b"] == "dependency t-a cancelled: never satisfied"

    def test_a_failure_about_to_be_restarted_is_still_awaited(self) -> None:
        t = Table(task("t-a", S.TASK_STATE_FAILED, restart=S.RESTART_POLICY_ON_FAILURE),
                  task("t-b", after=[(OK, ["t-a"])]))
        gated = t.gate().sort(t.pending(), NOW)
        assert not gated.unmet and gated.held["t-b"] == "waiting for t-a to succeed"

    def test_notok_and_any(self) -> None:
        t = Table(task("t-ok", S.TASK_STATE_SUCCEEDED), task("t-bad", S.TASK_STATE_FAILED),
                  task("t-n1", after=[(NOTOK, ["t-bad"])]), task("t-n2", after=[(NOTOK, ["t-ok"])]),
                  task("t-y1", after=[(ANY, ["t-ok"])]), task("t-y2", after=[(ANY, ["t-bad"])]))
        gated = t.gate().sort(t.pending(), NOW)
        assert sorted(x.id for x in gated.ready) == ["t-n1", "t-y1", "t-y2"]
        assert [(x.id, why) for x, why in gated.unmet] == [("t-n2", "dependency t-ok succeeded: never satisfied")]

    def test_every_dependency_and_every_id_must_hold(self) -> None:
        t = Table(task("t-a", S.TASK_STATE_SUCCEEDED), task("t-b", S.TASK_STATE_RUNNING),
                  task("t-c", after=[(OK, ["t-a", "t-b"])]), task("t-d", after=[(OK, ["t-a"]), (ANY, ["t-b"])]))
        gated = t.gate().sort(t.pending(), NOW)
        assert gated.held == {"t-c": "waiting for t-b to succeed", "t-d": "waiting for t-b to end"}

    def test_ok_on_an_array_needs_every_element(self) -> None:
        elements = [task(f"a-1_{i}", S.TASK_STATE_SUCCEEDED, array="a-1", index=i) for i in range(3)]
        elements[1].state = S.TASK_STATE_RUNNING
        t = Table(*elements, task("t-b", after=[(OK, ["a-1"])]))
        assert t.gate().sort(t.pending(), NOW).held == {"t-b": "waiting for a-1 to succeed"}
        t.tasks["a-1_1"].state = S.TASK_STATE_FAILED
        gated = t.gate().sort(t.pending(), NOW)
        assert [why for _x, why in gated.unmet] == ["dependency a-1 element 1 failed: never satisfied"]
        t.tasks["a-1_1"].state = S.TASK_STATE_SUCCEEDED
        assert [x.id for x in t.gate().sort(t.pending(), NOW).ready] == ["t-b"]

    def test_a_forgotten_dependency_ends_it(self) -> None:
        t = Table(task("t-b", after=[(OK, ["t-gone"])]))
        assert [why for _x, why in t.gate().sort(t.pending(), NOW).unmet] == [
            "dependency t-gone is no longer known: never satisfied"]

    def test_the_check_looks_up_only_what_each_task_names(self) -> None:
        """Cheap: one lookup per named target per pending dependent, however many tasks the table holds."""
        others = [task(f"t-x{i}", S.TASK_STATE_SUCCEEDED) for i in range(1000)]
        t = Table(*others, task("t-a", S.TASK_STATE_RUNNING), task("t-b", after=[(OK, ["t-a"])]))
        t.gate().sort([t.tasks["t-b"]], NOW)
        assert t.lookups == 1


class TestArrayLimit:
    def test_at_most_max_running_placed_or_running_lowest_indices_first(self) -> None:
        states = [S.TASK_STATE_RUNNING, S.TASK_STATE_SCHEDULED, S.TASK_STATE_SUCCEEDED] + [S.TASK_STATE_PENDING] * 5
        t = Table(*(task(f"a-1_{i}", s, array="a-1", index=i, most=4) for i, s in enumerate(states)))
        gated = t.gate().sort(reversed(t.pending()), NOW)
        assert [x.id for x in gated.ready] == ["a-1_3", "a-1_4"]
        assert gated.held["a-1_5"] == "array a-1: 4 elements placed or running already (%4)"

    def test_no_limit_lets_every_element_through(self) -> None:
        t = Table(*(task(f"a-1_{i}", array="a-1", index=i) for i in range(10)))
        assert len(t.gate().sort(t.pending(), NOW).ready) == 10

    def test_a_full_array_places_none(self) -> None:
        t = Table(task("a-1_0", S.TASK_STATE_RUNNING, array="a-1", most=1),
                  task("a-1_1", array="a-1", index=1, most=1))
        assert not t.gate().sort(t.pending(), NOW).ready
