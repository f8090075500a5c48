"""Workflows end to end (docs/workflows.md): arrays, dependencies and start times, on a real etcd — in-process
for the submit path, with real coordinator and agent processes for what runs."""

from __future__ import annotations

import asyncio
import math
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from common.errors import ValidationError
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.api.admin import AdminService
from coordinator.app import App
from coordinator.ctl import render
from coordinator.etcd_embedded import EtcdCluster
from coordinator.qos.retention import TaskRetention
from coordinator.sync import Keys, connect
from tests.helpers.inproc import admin_stub, one_gpu_spec, run_leading
from tests.integration.harness import Cluster, wait_until

SMALL = ("--gpus", "0.25", "--gpu-mem-gib", "1", "--cpu", "0.1")
_FINAL = ("succeeded", "failed", "cancelled")


def _array_spec(n: int, most: int = 0) -> types_pb2.TaskSpec:
    spec = one_gpu_spec("sweep")
    spec.array.CopyFrom(types_pb2.ArraySpec(first=0, last=n - 1, max_running=most))
    return spec


class TestArraySubmit:
    def test_one_request_stores_every_element_in_few_transactions(self, etcd_server: EtcdCluster,
                                                                  etcd_prefix: str) -> None:
        """1,000 elements in one SubmitTask: etcd's revision moves by about one per 127 elements (not one per
        element); each element is an ordinary PENDING task with its index in its environment; a retry of the
        request returns the same array and writes nothing."""
        async def scenario(app: App) -> None:
            client = connect(etcd_server.endpoints, 2.0)
            keys = Keys(app.cfg.etcd_prefix)

            def revision() -> int:
                return client.range_prefix(keys.prefix + "no-such-key/")[1]

            try:
                async with admin_stub(AdminService(app)) as stub:
                    request = admin_pb2.SubmitTaskRequest(spec=_array_spec(1000, 64), request_id="sweep-1",
                                                          queue_unplaceable=True)
                    before = await asyncio.to_thread(revision)
                    first = await stub.SubmitTask(request, timeout=60)
                    written = await asyncio.to_thread(revision) - before
                    again = await stub.SubmitTask(request, timeout=60)
                    assert await asyncio.to_thread(revision) - before == written
            finally:
                client.close()
            assert first.array_id.startswith("a-") and first.id == f"{first.array_id}_0"
            assert again.id == first.id
            assert written <= 2 * math.ceil(1000 / 127) + 2, written   # one per batch, and the request key
            elements = app.tasks.array_elements(first.array_id)
            assert [t.array_index for t in elements] == list(range(1000))
            assert all(t.state == types_pb2.TASK_STATE_PENDING and t.queue == first.queue for t in elements)
            e = elements[417]
            assert e.id == f"{first.array_id}_417"
            assert dict(e.spec.env) == {"GPTRM_ARRAY_ID": first.array_id, "GPTRM_ARRAY_INDEX": "417",
                                        "SLURM_ARRAY_JOB_ID": first.array_id, "SLURM_ARRAY_TASK_ID": "417"}
            stored = await asyncio.to_thread(app.store.get_task, e.id)
            assert stored.array_id == first.array_id and stored.array_index == 417

        asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario))

    def test_refusals_name_the_field_and_cancel_takes_the_whole_array(self, etcd_server: EtcdCluster,
                                                                      etcd_prefix: str) -> None:
        """Too many elements, an unknown dependency and a dependency cycle are refused naming the field;
        CancelArray cancels every element that has not ended."""
        async def scenario(app: App) -> None:
            async with admin_stub(AdminService(app)) as stub:
                for spec, field in ((_array_spec(100_001), "spec.array:"), (_after("t-nope"), "spec.after[0].ids:")):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await stub.SubmitTask(admin_pb2.SubmitTaskRequest(spec=spec, queue_unplaceable=True),
                                              timeout=30)
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert (err.value.details() or "").startswith(field), err.value.details()
                await stub.SubmitTask(admin_pb2.SubmitTaskRequest(spec=one_gpu_spec("plain"), request_id="r-1",
                                                                  queue_unplaceable=True), timeout=30)
                with pytest.raises(grpc.aio.AioRpcError) as reused:   # a plain task's request id, for an array
                    await stub.SubmitTask(admin_pb2.SubmitTaskRequest(spec=_array_spec(5), request_id="r-1",
                                                                      queue_unplaceable=True), timeout=30)
                assert reused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                first = await stub.SubmitTask(admin_pb2.SubmitTaskRequest(spec=_array_spec(5),
                                                                          queue_unplaceable=True), timeout=30)
                # A task that (in etcd) waits for the id a new one would get: submitting that one is a cycle.
                waiting = await stub.SubmitTask(admin_pb2.SubmitTaskRequest(spec=_after(first.array_id),
                                                                            queue_unplaceable=True), timeout=30)
                with pytest.raises(ValidationError) as cycle:
                    app.tasks._check_targets(_after(waiting.id), first.array_id)
                assert cycle.value.field == "spec.after"
                await app.tasks.cancel(f"{first.array_id}_2")
                done = await stub.CancelArray(admin_pb2.ArrayRef(array_id=first.array_id), timeout=30)
                assert (done.cancelled, done.already_ended) == (4, 1)
                assert all(t.state == types_pb2.TASK_STATE_CANCELLED for t in app.tasks.array_elements(first.array_id))
                stored = await asyncio.to_thread(app.store.get_task, f"{first.array_id}_4")
                assert stored.state == types_pb2.TASK_STATE_CANCELLED and stored.reason == "cancelled by an admin"
                with pytest.raises(grpc.aio.AioRpcError) as missing:
                    await stub.CancelArray(admin_pb2.ArrayRef(array_id="a-000000000000"), timeout=30)
                assert missing.value.code() == grpc.StatusCode.NOT_FOUND

        asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario))


class TestRetention:
    def test_a_finished_task_stays_while_a_task_waits_for_it(self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """Retention (here: nothing finished is kept) leaves a finished task, and a finished array's elements, that
        an unfinished task still names in ``after``; once that task ends they go."""
        async def scenario(app: App) -> None:
            retention = TaskRetention(app.tasks, app.store, app.leadership, retain_s=0.0, retain_count=0)
            async with admin_stub(AdminService(app)) as stub:
                def submit(spec: types_pb2.TaskSpec) -> Any:
                    return stub.SubmitTask(admin_pb2.SubmitTaskRequest(spec=spec, queue_unplaceable=True), timeout=30)

                first = await submit(one_gpu_spec("first"))
                array = await submit(_array_spec(2))
                other = await submit(one_gpu_spec("other"))
                for tid in (first.id, other.id, f"{array.array_id}_0", f"{array.array_id}_1"):
                    await app.tasks.cancel(tid)
                waiting = await submit(_after(first.id, types_pb2.DEPENDENCY_KIND_ANY))
                waiting_too = await submit(_after(array.array_id, types_pb2.DEPENDENCY_KIND_NOTOK))
                await app.tasks.cancel(waiting_too.id)   # ends before it was placed: its array may go now
                await retention.collect()
                assert app.tasks.find(first.id) is not None and app.tasks.find(other.id) is None
                assert app.tasks.array_elements(array.array_id) == []
                await app.tasks.cancel(waiting.id)
                await retention.collect()
                assert app.tasks.find(first.id) is None

        asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario))


def _after(target: str, kind: int = types_pb2.DEPENDENCY_KIND_OK) -> types_pb2.TaskSpec:
    spec = one_gpu_spec("after")
    spec.after.add(kind=kind, ids=[target])
    return spec


def _doc(c: Cluster, task_id: str, coordinator: str = "c1") -> dict[str, Any]:
    """``gptrmctl tasks TASK -o json``'s document, read over gRPC (quicker to poll than a gptrmctl process)."""
    return render.task_dict(c.admin(coordinator).GetTask(admin_pb2.GetTaskRequest(task_id=task_id), timeout=5))


def _ended(c: Cluster, task_id: str) -> dict[str, Any] | None:
    d = _doc(c, task_id)
    return d if d["state"] in _FINAL else None


def _registered(c: Cluster, coordinator: str = "c1") -> None:
    wait_until(lambda: len(c.admin(coordinator).ListNodes(admin_pb2.ListNodesRequest(), timeout=5).nodes) == 1,
               30, 0.2, "the agent to register")


def _placed_and_ended(task: dict[str, Any]) -> tuple[float, float]:
    """When a task was first placed (SCHEDULED) and when it last ended, from its history."""
    history = task["history"]
    placed = min(h["time_unix_s"] for h in history if h["state"] == "scheduled")
    ended = max(h["time_unix_s"] for h in history if h["state"] in _FINAL)
    return placed, ended


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one time (an end at the same instant as a start closes first)."""
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _t, step in points:
        now += step
        most = max(most, now)
    return most


def _leader(c: Cluster, names: list[str]) -> str:
    def lead() -> str | None:
        for n in names:
            try:
                if c.proc(n).alive and c.status(n).is_leader:
                    return n
            except grpc.RpcError:
                pass
        return None
    return str(wait_until(lead, 30, 0.1, "a leader"))


class TestArrayLimit:
    def test_20_elements_max_4_never_more_than_4_at_once_across_a_leader_kill(self, cluster: Cluster) -> None:
        """An array of 20 (%4) runs to the end on one agent with room for 16; from the elements' histories, never
        more than 4 were placed or running at once — also after the leader was killed half-way and the standby
        took over (it counts from the elements' states)."""
        names = ["c1", "c2"]
        for n in names:
            cluster.start_coordinator(n)
        leader = _leader(cluster, names)
        cluster.start_agent("n1")
        _registered(cluster, leader)
        doc = cluster.ctl_json("submit", "--name", "sweep", "--array", "0-19%4", *SMALL, "--", "sleep", "0.5")
        array_id = doc["array_id"]

        live = [leader]

        def elements() -> list[dict[str, Any]]:
            listed = cluster.admin(live[0]).ListTasks(admin_pb2.ListTasksRequest(page_size=1000), timeout=5).tasks
            return [render.task_dict(t) for t in listed if t.array_id == array_id]

        wait_until(lambda: sum(e["state"] == "succeeded" for e in elements()) >= 6, 60, 0.2, "6 elements done")
        cluster.proc(leader).kill()
        live[0] = _leader(cluster, [n for n in names if n != leader])
        def all_ended() -> list[dict[str, Any]] | None:
            es = elements()
            return es if all(e["state"] in _FINAL for e in es) else None

        done = wait_until(all_ended, 120, 0.3, "every element to end")
        assert done is not None
        assert [e["state"] for e in done] == ["succeeded"] * 20
        assert _most_at_once([_placed_and_ended(e) for e in done]) <= 4
        summary = cluster.ctl_json("tasks")["arrays"]
        assert summary == [{"array_id": array_id, "name": "sweep", "elements": 20, "max_running": 4,
                            "states": {"succeeded": 20}}]
        line = cluster.ctl("tasks").stdout
        assert array_id in line and "20 succeeded" in line and f"{array_id}_3" not in line
        out = cluster.ctl("logs", f"{array_id}:3")
        assert out.returncode == 0, out.stderr


class TestDependencies:
    def test_ok_any_and_an_unmet_dependency(self, cluster: Cluster) -> None:
        """``--after ok`` waits with its reason and runs after the success; after a failure it is ended CANCELLED
        with the reason; ``--after any`` runs either way; ``--after ok:ARRAY`` waits for every element; an unknown
        id is refused naming the field; ``--keep-unmet`` leaves it pending with the reason; ``cancel ARRAY:INDEX``
        cancels one element and ``cancel ARRAY`` the rest."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        _registered(cluster)
        release = Path(tempfile.gettempdir()) / f"gptrm-release-{uuid.uuid4().hex}"   # the task's uid can see /tmp
        first = cluster.submit("--name", "train", *SMALL, "--", "sh", "-c",
                               f"while [ ! -e {release} ]; do sleep 0.1; done")
        bad = cluster.submit("--name", "bad", *SMALL, "--", "sh", "-c", "sleep 1; exit 3")
        array = cluster.ctl_json("submit", "--array", "0-1", *SMALL, "--", "true")["array_id"]
        evaluate = cluster.submit("--name", "eval", "--after", f"ok:{first}", *SMALL, "--", "true")
        never = cluster.submit("--name", "never", "--after", f"ok:{bad}", *SMALL, "--", "true")
        kept = cluster.submit("--name", "kept", "--after", f"ok:{bad}", "--keep-unmet", *SMALL, "--", "true")
        cleanup = cluster.submit("--name", "cleanup", "--after", f"any:{bad}", "--after", f"any:{first}", *SMALL,
                                 "--", "true")
        gather = cluster.submit("--name", "gather", "--after", f"ok:{array}", *SMALL, "--", "true")
        waiting = wait_until(lambda: (t := _doc(cluster, evaluate))["reason"].startswith("waiting for ") and t, 30, 0.2,
                             "the dependent's pending reason")
        assert waiting["state"] == "pending" and waiting["reason"] == f"waiting for {first} to succeed", waiting
        assert f"after         ok:{first}" in cluster.ctl("tasks", evaluate).stdout
        release.touch()

        for tid in (evaluate, cleanup, gather):
            wait_until(partial(_ended, cluster, tid), 60, 0.2, f"{tid} to end")
        assert [_doc(cluster, t)["state"] for t in (evaluate, cleanup, gather)] == ["succeeded"] * 3
        assert _placed_and_ended(_doc(cluster, evaluate))[0] >= _placed_and_ended(_doc(cluster, first))[1]
        assert _placed_and_ended(_doc(cluster, cleanup))[0] >= _placed_and_ended(_doc(cluster, bad))[1]
        ended = wait_until(partial(_ended, cluster, never), 30, 0.2, "never to end")
        assert ended is not None
        assert ended["state"] == "cancelled" and ended["reason"] == f"dependency {bad} failed: never satisfied"
        held = wait_until(lambda: (t := _doc(cluster, kept))["reason"].startswith("dependency") and t, 30, 0.2,
                          "the kept task's reason")
        assert held["state"] == "pending" and held["reason"] == f"dependency {bad} failed: never satisfied", held

        release.unlink()
        held_array = cluster.ctl_json("submit", "--array", "0-3", "--after", f"ok:{bad}", "--keep-unmet", *SMALL, "--",
                                      "true")["array_id"]
        one = cluster.ctl("cancel", f"{held_array}:1")
        assert one.returncode == 0 and f"{held_array}_1" in one.stdout, one.stderr
        whole = cluster.ctl("cancel", held_array)
        assert whole.returncode == 0, whole.stderr
        assert "3 element(s) cancelled, 1 had already ended" in whole.stdout, whole.stdout
        assert {e["state"] for e in cluster.ctl_json("tasks", held_array)["tasks"]} == {"cancelled"}
        refused = cluster.ctl("submit", "--after", "ok:t-nope", *SMALL, "--", "true")
        assert refused.returncode != 0 and "spec.after[0].ids" in refused.stderr, refused.stderr


class TestBegin:
    def test_begin_in_5s_waits_with_its_reason(self, cluster: Cluster) -> None:
        """``--begin +5s``: pending with "begins at ..." until then, placed after it."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        _registered(cluster)
        submitted = time.time()
        tid = cluster.submit("--name", "later", "--begin", "+5s", *SMALL, "--", "true")
        task = wait_until(lambda: (t := _doc(cluster, tid))["reason"].startswith("begins at ") and t, 30, 0.2,
                          "the begin reason")
        begin = task["spec"]["begin_unix_s"]
        assert submitted + 4 <= begin <= time.time() + 5
        assert task["state"] == "pending", task
        done = wait_until(partial(_ended, cluster, tid), 60, 0.2, "the task to end")
        assert done is not None
        assert done["state"] == "succeeded"
        assert _placed_and_ended(done)[0] >= begin
