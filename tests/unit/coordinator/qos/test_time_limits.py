"""Time limits and protected run time, the pure parts: parsing, queue defaults and maxima, the final state,
when a run started, and the queue settings' round trips (API, CLI, plain data)."""

from __future__ import annotations

import argparse

import pytest

from common.errors import ValidationError
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from common.types import TaskState
from common.types import TaskState as S
from coordinator.ctl.main import build_parser
from coordinator.ctl.queues import queue_dict, queue_update
from coordinator.ctl.spec import spec_from_args
from coordinator.ctl.transport import CtlError
from coordinator.ctl.wait import exit_code_of
from coordinator.profiler.qos_spec import parse_time_limit
from coordinator.profiler.taskspec import spec_from_mapping
from coordinator.queues import Queue, QueueConfig
from coordinator.queues.admin import queue_from_proto, queue_to_proto
from coordinator.queues.limits import apply_queue_limits
from coordinator.run_limits import end_of, fmt_s, protected, run_started_s


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90.0), ("4h", 14400.0), ("2h30m", 9000.0), ("1d", 86400.0),
    ("1:30:00", 5400.0), ("30", 1800.0), ("5:30", 330.0), ("2-12", 2 * 86400.0 + 12 * 3600.0),
    ("1-0:30:15", 86400.0 + 1815.0), (45, 45.0), (2.5, 2.5),
])
def test_time_limit_forms(text: str | float, seconds: float) -> None:
    """A duration, Slurm's clock forms (a bare number is minutes), or a number of seconds."""
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "1:2:3:4", "-5", "400d", "nan", True, -1.0, float("inf")])
def test_time_limit_refusals(text: object) -> None:
    with pytest.raises(ValueError):
        parse_time_limit(text)  # type: ignore[arg-type]


def test_spec_file_takes_durations_and_names_a_bad_one() -> None:
    spec = spec_from_mapping({"argv": ["true"], "time_limit": "1:30:00", "min_runtime": "10m"})
    assert (spec.time_limit_s, spec.min_runtime_s) == (5400.0, 600.0)
    assert spec_from_mapping({"argv": ["true"], "time_limit_s": 60}).time_limit_s == 60.0
    with pytest.raises(ValidationError) as e:
        spec_from_mapping({"argv": ["true"], "time_limit": "later"})
    assert e.value.field == "spec.time_limit"
    with pytest.raises(ValidationError) as e:
        spec_from_mapping({"argv": ["true"], "min_runtime": "1m", "min_runtime_s": 60})
    assert e.value.field == "spec.min_runtime"


def test_submit_flags() -> None:
    args = build_parser().parse_args(["submit", "--time", "4h", "--min-runtime", "90s", "--", "true"])
    spec = spec_from_args(args)
    assert (spec.time_limit_s, spec.min_runtime_s) == (14400.0, 90.0)


def _queue(**limits: float) -> Queue:
    return Queue("team", gpus={"*": 1}, **limits)  # type: ignore[arg-type]


def test_queue_defaults_fill_what_the_spec_leaves_out() -> None:
    q = _queue(default_time_limit_s=3600.0, max_time_limit_s=7200.0, default_min_runtime_s=600.0, grace_s=60.0)
    out = apply_queue_limits(types_pb2.TaskSpec(), q)
    assert (out.time_limit_s, out.min_runtime_s, out.stop_grace_s) == (3600.0, 600.0, 60.0)
    own = apply_queue_limits(types_pb2.TaskSpec(time_limit_s=7200.0, min_runtime_s=1.0, stop_grace_s=2.0), q)
    assert (own.time_limit_s, own.min_runtime_s, own.stop_grace_s) == (7200.0, 1.0, 2.0)
    # Without a default the maximum is the limit; without either there is none.
    assert apply_queue_limits(types_pb2.TaskSpec(), _queue(max_time_limit_s=60.0)).time_limit_s == 60.0
    assert apply_queue_limits(types_pb2.TaskSpec(), _queue()).time_limit_s == 0.0


def test_a_time_limit_above_the_queue_maximum_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as e:
        apply_queue_limits(types_pb2.TaskSpec(time_limit_s=7201.0), _queue(max_time_limit_s=7200.0))
    assert e.value.field == "spec.time_limit_s"
    assert "queue team" in str(e.value) and "2h" in str(e.value)


def test_queue_settings_are_validated_and_round_trip() -> None:
    q = _queue(default_time_limit_s=60.0, max_time_limit_s=120.0, default_min_runtime_s=30.0, grace_s=5.0)
    assert Queue.from_dict(q.to_dict()) == q
    assert queue_from_proto(queue_to_proto(q)) == q
    assert QueueConfig.from_dict(QueueConfig(queues=(q,)).to_dict()).get("team") == q
    with pytest.raises(ValidationError) as e:
        QueueConfig(queues=(_queue(default_time_limit_s=121.0, max_time_limit_s=120.0),))
    assert e.value.field == "queue[0].default_time_limit_s"
    with pytest.raises(ValidationError) as e:
        Queue.from_dict({"name": "team", "grace_s": -1})
    assert e.value.field == "queue.grace_s"


def test_queues_set_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(["queues", "set", "team", "--gpus", "1", "--default-time", "1h", "--max-time", "1-0",
                              "--default-min-runtime", "10m", "--grace", "30s"])
    q = queue_update(None, "team", args)
    assert (q.default_time_limit_s, q.max_time_limit_s, q.default_min_runtime_s, q.grace_s) == (3600, 86400, 600, 30)
    d = queue_dict(admin_pb2.QueueView(queue=q))
    assert (d["default_time_limit_s"], d["max_time_limit_s"], d["grace_s"]) == (3600, 86400, 30)
    cleared = queue_update(q, "team", parser.parse_args(["queues", "set", "team", "--max-time", "none"]))
    assert cleared.max_time_limit_s == 0 and queue_dict(admin_pb2.QueueView(queue=cleared))["max_time_limit_s"] is None
    with pytest.raises(CtlError, match="--grace: not a duration"):
        parser.parse_args(["queues", "set", "team", "--grace", "whenever"])


def _task(*states: tuple[TaskState, float], **spec: float) -> types_pb2.Task:
    t = types_pb2.Task(id="t-1", spec=types_pb2.TaskSpec(**spec))  # type: ignore[arg-type]
    for state, at in states:
        t.history.add(state=int(state), time_unix_s=at)
    return t


def test_the_run_clock_starts_at_the_first_running_of_the_current_placement() -> None:
    t = _task((S.PENDING, 0), (S.SCHEDULED, 1), (S.RUNNING, 2), (S.PREEMPTED, 5), (S.PENDING, 6), (S.SCHEDULED, 7),
              (S.STARTING, 8), (S.RUNNING, 10), (S.PAUSED, 12), (S.RUNNING, 20), min_runtime_s=15.0)
    assert run_started_s(t) == 10   # the resume at 20 does not restart it; the earlier run at 2 is another run
    assert protected(t, 24.9) and not protected(t, 25.0)
    assert run_started_s(_task((S.PENDING, 0), (S.SCHEDULED, 1))) is None
    assert protected(_task((S.SCHEDULED, 1), min_runtime_s=5.0), 100.0)   # not running yet: nothing to take
    assert not protected(_task((S.RUNNING, 1)), 1.0)                       # no protected run time


def test_a_timed_out_task_ends_timeout_unless_cancelled() -> None:
    t = _task(time_limit_s=3.0)
    assert end_of(t, TaskState.CANCELLED, "stopped") == (TaskState.CANCELLED, "stopped")   # not timed out
    t.timed_out = True
    assert end_of(t, TaskState.CANCELLED, "stopped by the coordinator") == (TaskState.TIMEOUT,
                                                                              "time limit of 3s reached")
    state, reason = end_of(t, TaskState.FAILED, "exit code 1")
    assert state == TaskState.TIMEOUT and reason.endswith("(it ended: exit code 1)")
    assert end_of(t, TaskState.RUNNING, "")[0] == TaskState.RUNNING   # only an end is changed
    t.cancel_requested = True
    assert end_of(t, TaskState.CANCELLED, "x")[0] == TaskState.CANCELLED


def test_fmt_and_exit_code() -> None:
    assert (fmt_s(3), fmt_s(5400), fmt_s(90061), fmt_s(0.5)) == ("3s", "1h30m", "1d1h1m1s", "0.5s")
    # A task stopped at its time limit never reads as a success to scripts.
    assert exit_code_of({"state": "timeout", "exit_code": 0}) == 1
    assert exit_code_of({"state": "timeout", "exit_code": None}) == 1
    assert exit_code_of({"state": "timeout", "exit_code": -15}) == 143


def test_argparse_namespace_without_limit_flags() -> None:
    """Callers that build a submit namespace by hand (older flag sets) still get a spec."""
    ns = build_parser().parse_args(["submit", "--", "true"])
    delattr(ns, "time")
    assert spec_from_args(argparse.Namespace(**vars(ns))).time_limit_s == 0.0


# ---- protected run time: preemption, reclaim and elastic shrinks never pick a task inside it --------------------


def test_a_victim_inside_its_protected_run_time_is_skipped_for_an_older_one() -> None:
    """Victim choice prefers the most recently started task, but not one inside its protected run time: the older
    one goes instead; with only protected tasks, nothing is preempted (the preemptor waits)."""
    from tests.unit.coordinator.qos.test_victim_choice import NOW, choose, task

    young = task("young", 0, 1, node="n1", indices=(0,), started=NOW - 5)
    old = task("old", 0, 1, node="n1", indices=(1,), started=NOW - 500)
    hi = task("hi", 10, 1, state=TaskState.PENDING)
    assert choose(hi, {"n1": 2}, [young, old]) == ["young"]          # unprotected: the newest goes
    young.spec.min_runtime_s = 60.0
    assert choose(hi, {"n1": 2}, [young, old]) == ["old"]
    old.spec.min_runtime_s = 600.0
    assert choose(hi, {"n1": 2}, [young, old]) is None
    young.spec.min_runtime_s = 5.0                                    # exactly at its end: no longer protected
    assert choose(hi, {"n1": 2}, [young, old]) == ["young"]


def test_reclaim_never_picks_a_borrowing_task_inside_its_protected_run_time() -> None:
    from coordinator.monitor.nodes import NodeRegistry
    from coordinator.queues import Demand, reclaim_victims
    from coordinator.queues.planning import holding_of

    def borrower(tid: str, started: float, min_runtime_s: float = 0.0) -> types_pb2.Task:
        t = types_pb2.Task(id=tid, queue="b", borrowed_gpus=1, spec=types_pb2.TaskSpec(min_runtime_s=min_runtime_s),
                           state=types_pb2.TASK_STATE_RUNNING)
        t.history.add(state=int(TaskState.RUNNING), time_unix_s=started)
        t.allocation.created_unix_s = started
        t.allocation.nodes.add(node_id="n1", gpu_indices=[0], demand=types_pb2.ResourceVector(gpus=1))
        return t

    config = QueueConfig(queues=(Queue("a", gpus={"*": 1}), Queue("b", gpus={"*": 0})))
    registry = NodeRegistry(1.0, 10.0)
    now = 1000.0
    want = [Demand("a", "*", 1)]
    fresh = holding_of(borrower("fresh", now - 10), registry, now)
    assert [v.task_id for v in reclaim_victims(config, [fresh], want)] == ["fresh"]
    kept = holding_of(borrower("kept", now - 10, min_runtime_s=60.0), registry, now)
    assert not kept.preemptible and reclaim_victims(config, [kept], want) == []
    done = holding_of(borrower("done", now - 60, min_runtime_s=60.0), registry, now)
    assert [v.task_id for v in reclaim_victims(config, [done], want)] == ["done"]


def test_an_elastic_job_inside_its_protected_run_time_is_not_shrunk() -> None:
    from dataclasses import replace

    from coordinator.elastic.rules import plan_give_back, plan_shrinks
    from tests.unit.coordinator.elastic.test_elastic_rules import NOW, SETTINGS, _job, _req

    job = _job("e", 4, hi=4)
    assert plan_shrinks([_req("w", 2)], [job], {"n1": 0}, NOW, SETTINGS)
    kept = replace(job, protected_until_s=NOW + 1)
    assert plan_shrinks([_req("w", 2)], [kept], {"n1": 0}, NOW, SETTINGS) == []
    assert plan_give_back("w", 0, 2, [kept], NOW, SETTINGS, "queue limit") == []
    assert plan_give_back("w", 0, 2, [job], NOW, SETTINGS, "queue limit")


def test_task_detail_shows_its_limits() -> None:
    from coordinator.ctl.human import task_detail
    from coordinator.ctl.render import task_dict
    from tests.helpers.ctl_schema import validate

    t = types_pb2.Task(id="t-1", spec=types_pb2.TaskSpec(name="x", time_limit_s=5400, min_runtime_s=600),
                       state=types_pb2.TASK_STATE_RUNNING, timed_out=True)
    d = task_dict(t)
    validate(d, "task")
    assert (d["time_limit_s"], d["min_runtime_s"], d["timed_out"]) == (5400, 600, True)
    text = task_detail(d)
    assert "time limit 1h30m, protected for its first 10m, reached: stopping" in text
    t.state = types_pb2.TASK_STATE_TIMEOUT
    d = task_dict(t)
    validate(d, "task")
    assert d["state"] == "timeout" and "reached: stopping" not in task_detail(d)
