"""The usage duty and its etcd records (coordinator/usage/duty.py, coordinator/sync/usage.py) on real etcd and the
real object graph, on an injected clock: hours stored once, a new leader continuing from the stored marks, a lost
write answer, and stored values that do not validate moved under quarantine/."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

import grpc
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from common.pb.gptrm.v1 import admin_pb2, agent_pb2, types_pb2
from common.types import TaskState
from coordinator.api.admin import AdminService
from coordinator.app import App
from coordinator.etcd_embedded import EtcdCluster
from coordinator.queues import Queue
from coordinator.sync import connect
from coordinator.sync.client import op_put
from coordinator.sync.keys import Keys
from coordinator.sync.state_machine import Conflict
from coordinator.sync.usage import UsageStore
from coordinator.usage import duty as duty_module
from coordinator.usage.duty import UsageDuty, UsageMetrics, bucket_rows
from coordinator.usage.ledger import HOUR_S, hour_of
from tests.helpers.inproc import admin_stub, inventory, run_leading, until

S = TaskState
Scenario = Callable[[App, UsageStore], Awaitable[None]]


def running(task_id: str, start: float, gpus: int, *, queue: str = "", user: str = "ann") -> types_pb2.Task:
    t = types_pb2.Task(id=task_id, state=int(S.RUNNING), queue=queue, submitted_by=user)
    t.history.add(state=int(S.PENDING), time_unix_s=start - 5)
    t.history.add(state=int(S.SCHEDULED), time_unix_s=start)
    t.history.add(state=int(S.RUNNING), time_unix_s=start + 1)
    t.allocation.nodes.add(node_id="n1", gpu_indices=list(range(gpus)), gpu_share=1.0,
                           demand=types_pb2.ResourceVector(gpus=gpus, cpu_cores=2.0))
    return t


def end(t: types_pb2.Task, when: float, energy_j: float) -> None:
    t.history.add(state=int(S.SUCCEEDED), time_unix_s=when)
    t.state, t.energy_j = int(S.SUCCEEDED), energy_j


def stored_totals(store: UsageStore, hours: list[int]) -> dict[str, float]:
    out = {"gpu_s": 0.0, "cpu_core_s": 0.0, "energy_j": 0.0, "tasks": 0.0}
    for bucket, _rev in store.get_hours(hours).values():
        for usage in bucket_rows(bucket).values():
            for name in out:
                out[name] += getattr(usage, name)
    return out


@pytest.fixture
def lead(etcd_server: EtcdCluster, etcd_prefix: str) -> Callable[[Scenario], None]:
    """Runs a scenario on a replica that leads (node n1 connected) with its own usage duty stopped, so that the
    scenario's duties, on their own clocks, are the only writers."""
    def run(scenario: Scenario) -> None:
        client = connect(etcd_server.endpoints, 2.0)
        keys = Keys(etcd_prefix)

        async def wrapped(app: App) -> None:
            await until(lambda: client.get(keys.usage_marks) is not None)   # the app's own first pass
            app.supervisor.stop()
            await app.nodes.connected(agent_pb2.Register(inventory=inventory("n1")), asyncio.Queue())
            await scenario(app, UsageStore(client, keys, app.leadership.election))

        try:
            asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, wrapped, usage_interval_s=3600.0))
        finally:
            client.close()
    return run


class TestUsageDuty:
    def test_hours_are_stored_once_across_leaders_and_lost_answers(self, lead: Callable[..., None]) -> None:
        """Two tasks (2 GPUs and 1 GPU) over an hour boundary, accounted by one duty, then by a second one (a new
        leader) that continues from the stored marks; the first duty's stale write is refused (Conflict) and, once
        it reads the marks again, adds nothing twice. The stored hours hold exactly the GPU-seconds of the
        histories and the energy the tasks drew."""
        base = hour_of(time.time()) + 10 * HOUR_S    # later than the app's own marks
        clock = [base]
        readings: dict[str, float] = {}

        async def scenario(app: App, store: UsageStore) -> None:
            a, b = running("t-a", base + 600, 2, queue="research"), running("t-b", base + 3000, 1, user="bob")
            tasks = [a, b]

            def duty() -> UsageDuty:
                return UsageDuty(store, app.leadership, lambda: tasks, app.registry, lambda i: readings.get(i, 0.0),
                                 UsageMetrics(CollectorRegistry()), settle_s=0.0, now=lambda: clock[0])

            first = duty()
            clock[0] = base + 1800
            readings["t-a"] = 1000.0
            assert await first.flush()
            clock[0] = base + HOUR_S + 600
            readings.update({"t-a": 3000.0, "t-b": 500.0})
            assert await first.flush()
            # A new leader: nothing in memory, the marks from etcd.
            second = duty()
            end(a, base + HOUR_S + 900, 3600.0)
            readings["t-b"] = 800.0
            clock[0] = base + HOUR_S + 1200
            assert await second.flush()
            with pytest.raises(Conflict):   # the old leader's view is behind the stored marks
                await first.flush()
            first.forget()
            end(b, base + HOUR_S + 1500, 1000.0)
            clock[0] = base + 2 * HOUR_S + 60
            assert await first.flush()
            assert not await first.flush()   # nothing new at the same time

            hours = [base, base + HOUR_S, base + 2 * HOUR_S]
            totals = stored_totals(store, hours)
            gpu_s = 2 * (HOUR_S + 900 - 600) + 1 * (HOUR_S + 1500 - 3000)
            assert totals["gpu_s"] == pytest.approx(gpu_s)
            assert totals["cpu_core_s"] == pytest.approx(2.0 * (HOUR_S + 900 - 600) + 2.0 * (HOUR_S + 1500 - 3000))
            assert totals["energy_j"] == pytest.approx(3600.0 + 1000.0)
            assert totals["tasks"] == 2
            rows = bucket_rows(store.get_hours([base])[base][0])
            assert {(k.queue, k.user, k.gpu_model) for k in rows} == {("research", "ann", "NVIDIA H100 80GB HBM3"),
                                                                       ("", "bob", "NVIDIA H100 80GB HBM3")}
            first_hour = {k.user: u for k, u in rows.items()}
            assert first_hour["ann"].gpu_s == pytest.approx(2 * (HOUR_S - 600))
            assert first_hour["bob"].gpu_s == pytest.approx(HOUR_S - 3000)
            marks, _ = store.get_marks()
            assert marks is not None and marks.accounted_until_unix_s == clock[0] and dict(marks.task_energy_j) == {}

        lead(scenario)

    def test_a_pass_accounts_its_tasks_part_by_part(self, lead: Callable[..., None],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
        """With more tasks than one part holds, a pass accounts them part by part, the leader's loop serving other
        work between parts, and stores what accounting them all at once gives."""
        monkeypatch.setattr(duty_module, "ACCOUNT_PART", 3)
        base = hour_of(time.time()) + 20 * HOUR_S
        ticks: list[int] = [0]
        seen: list[int] = []   # the ticker's count at each part
        real = duty_module.account

        def counting(*args: object, **kwargs: object) -> object:
            seen.append(ticks[0])
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(duty_module, "account", counting)

        async def scenario(app: App, store: UsageStore) -> None:
            tasks = [running(f"t-{i}", base + 60 * i, 1) for i in range(10)]

            async def ticker() -> None:
                while True:
                    ticks[0] += 1
                    await asyncio.sleep(0)

            duty = UsageDuty(store, app.leadership, lambda: tasks, app.registry, lambda i: 0.0,
                             UsageMetrics(CollectorRegistry()), settle_s=0.0, now=lambda: base + 1800)
            ticking = asyncio.create_task(ticker())
            try:
                assert await duty.flush()
            finally:
                ticking.cancel()
            assert len(seen) == 4 and len(set(seen)) == 4   # four parts, the ticker ran between each two
            totals = stored_totals(store, [base])
            assert totals["gpu_s"] == pytest.approx(sum(1800 - 60 * i for i in range(10)))
            assert totals["cpu_core_s"] == pytest.approx(2.0 * sum(1800 - 60 * i for i in range(10)))

        lead(scenario)

    def test_unusable_stored_values_are_quarantined(self, lead: Callable[..., None], etcd_server: EtcdCluster,
                                                   etcd_prefix: str) -> None:
        """Stored hours that do not decode, name another hour, hold a non-finite or negative number or too
        many rows, and marks with a non-finite time, read as absent and are moved under quarantine/."""
        client = connect(etcd_server.endpoints, 2.0)
        keys = Keys(etcd_prefix)
        h = hour_of(time.time()) + 20 * HOUR_S

        def bucket(hour: int, **row: float) -> bytes:
            return types_pb2.UsageBucket(hour_unix_s=hour, rows=[types_pb2.UsageRow(queue="q", **row)]) \
                .SerializeToString()

        async def scenario(app: App, store: UsageStore) -> None:
            bad = {h: (b"\xff\x00 not a bucket", "UsageBucket"),
                   h + HOUR_S: (bucket(h, gpu_s=1.0), "holds the hour"),
                   h + 2 * HOUR_S: (bucket(h + 2 * HOUR_S, gpu_s=math.nan), "gpu_s nan"),
                   h + 3 * HOUR_S: (bucket(h + 3 * HOUR_S, energy_j=-1.0), "energy_j -1.0"),
                   h + 4 * HOUR_S: (types_pb2.UsageBucket(hour_unix_s=h + 4 * HOUR_S,
                                                          rows=[types_pb2.UsageRow()] * 3000).SerializeToString(),
                                    "3000 rows")}
            good = h + 5 * HOUR_S
            client.txn([], [op_put(keys.usage_hour(good), bucket(good, gpu_s=7.0, tasks=1))])
            for hour, (value, why) in bad.items():
                client.txn([], [op_put(keys.usage_hour(hour), value)])
                revision = client.get(keys.usage_hour(hour)).mod_revision
                with capture_logs() as logs:
                    assert store.get_hours([hour, good]).keys() == {good}
                assert [e for e in logs if e["event"] == "etcd_value_quarantined" and why in e["reason"]], logs
                assert client.get(keys.usage_hour(hour)) is None
                assert client.get(keys.quarantine(keys.usage_hour(hour), revision)).value == value
            marks = types_pb2.UsageMarks(accounted_until_unix_s=math.inf).SerializeToString()
            client.txn([], [op_put(keys.usage_marks, marks)])
            assert store.get_marks() == (None, 0)
            assert client.get(keys.usage_marks) is None
            # A duty without usable marks starts from now, and accounts from there.
            clock = [float(good)]
            duty = UsageDuty(store, app.leadership, list, app.registry, lambda i: 0.0,
                             UsageMetrics(CollectorRegistry()), settle_s=0.0, now=lambda: clock[0])
            assert not await duty.flush() and duty.accounted_until == good
            clock[0] += 60
            assert await duty.flush() and duty.accounted_until == good + 60
            assert keys.usage_hour(good).endswith(time.strftime("%Y-%m-%dT%H", time.gmtime(good)))

        try:
            lead(scenario)
        finally:
            client.close()


class TestBudgetsAsAccounted:
    def test_each_pass_sets_the_reading_and_announces_the_lines_it_crossed_once(self, lead: Callable[..., None]
                                                                                 ) -> None:
        """Queue a may use 1 GPU-hour a day; its 2-GPU task runs. The reading (and so the gate) follows each stored
        pass: 56 % after the first, 167 % after the second, which announces 80 % and 100 % together and holds a's
        new work at once; a new leader's passes (a second duty continuing from the stored marks) announce
        nothing again."""
        day = (math.floor(time.time() / 86400) + 2) * 86400   # later than the app's own passes
        clock = [float(day + HOUR_S)]

        def announced(app: App) -> list[str]:
            return [e.message for e in app.events.recent(1000) if e.kind == "queues" and "budget" in e.message]

        async def scenario(app: App, store: UsageStore) -> None:
            await app.queue_admin.set(Queue.from_dict({
                "name": "a", "gpus": {"*": 4}, "members": ["*"],
                "budget": {"kind": "gpu_hours", "amount": 1, "period": "day", "action": "hold"}}))
            tasks = [running("t-a", day + HOUR_S, 2, queue="a")]

            def duty() -> UsageDuty:
                return UsageDuty(store, app.leadership, lambda: tasks, app.registry, lambda i: 0.0,
                                 UsageMetrics(CollectorRegistry()), settle_s=0.0, now=lambda: clock[0],
                                 on_accounted=app.queue_admin.check_budgets)

            first = duty()
            await first.flush()                     # accounted up to the task's start
            clock[0] += 1000                        # 2 GPUs × 1000 s = 0.56 GPU-hours
            assert await first.flush()
            assert app.queues.budgets["a"].fraction == pytest.approx(2000 / 3600)
            assert announced(app) == []
            assert app.queue_admin.views("a").queues[0].budget_gate == "run"
            clock[0] += 2000                        # 6000 GPU-s: 167 %, past both lines in one pass
            assert await first.flush()
            assert app.queues.budgets["a"].fraction == pytest.approx(6000 / 3600)
            assert app.queue_admin.views("a").queues[0].budget_gate == "hold"
            after_first = announced(app)
            assert len(after_first) == 2, after_first
            assert "queue a is at 167% of its gpu_hours budget of 1 per day (past 80%)" in after_first
            assert any(m.startswith("queue a is past its gpu_hours budget") for m in after_first)
            second = duty()                         # a new leader: marks from etcd, nothing in memory
            app.queues.budgets = {}
            clock[0] += 600
            assert await second.flush()
            assert app.queues.budgets["a"].fraction == pytest.approx(7200 / 3600)
            clock[0] += 600
            assert await second.flush()
            assert announced(app) == after_first    # nothing announced twice

        lead(scenario)


    def test_a_lowered_budget_applies_and_is_announced_at_once(self, lead: Callable[..., None]) -> None:
        """Queue a used 0.56 of 10 GPU-hours (6 %); lowered to 0.6 GPU-hours it is at 93 % at once (80 % announced,
        new work still runs), to 0.5 at 111 % (100 % announced, new work held) — without waiting for a pass."""
        day = (math.floor(time.time() / 86400) + 4) * 86400
        clock = [float(day + HOUR_S)]

        def announced(app: App) -> list[str]:
            return [e.message for e in app.events.recent(1000) if e.kind == "queues" and "budget" in e.message]

        def queue(amount: float) -> Queue:
            return Queue.from_dict({"name": "a", "gpus": {"*": 4}, "members": ["*"],
                                    "budget": {"kind": "gpu_hours", "amount": amount, "period": "day"}})

        async def scenario(app: App, store: UsageStore) -> None:
            await app.queue_admin.set(queue(10))
            tasks = [running("t-a", day + HOUR_S, 2, queue="a")]
            duty = UsageDuty(store, app.leadership, lambda: tasks, app.registry, lambda i: 0.0,
                             UsageMetrics(CollectorRegistry()), settle_s=0.0, now=lambda: clock[0],
                             on_accounted=app.queue_admin.check_budgets)
            await duty.flush()
            clock[0] += 1000
            assert await duty.flush()
            assert app.queues.budgets["a"].fraction == pytest.approx(2000 / 3600 / 10)
            await app.queue_admin.set(queue(0.6))
            assert app.queues.budgets["a"].fraction == pytest.approx(2000 / 3600 / 0.6)
            assert [m.split(" (")[0] for m in announced(app)] == ["queue a is at 93% of its gpu_hours budget of 0.6 "
                                                                  "per day"]
            await app.queue_admin.set(queue(0.5))
            assert app.queue_admin.views("a").queues[0].budget_gate == "hold"
            assert len(announced(app)) == 2 and announced(app)[1].startswith("queue a is past its gpu_hours budget")
            await app.queue_admin.set(queue(0.4))      # already past both lines: nothing more
            assert len(announced(app)) == 2

        lead(scenario)


class TestGetUsage:
    def test_report_prices_and_refusals(self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """GetUsage sums the stored hours of the period per queue, user or model with the configured prices, and
        refuses an unknown grouping, an empty, endless or too long period, naming the field."""
        client = connect(etcd_server.endpoints, 2.0)
        keys = Keys(etcd_prefix)
        h = hour_of(time.time()) - 3 * HOUR_S
        rows = [types_pb2.UsageRow(queue="", user="ann", gpu_model="NVIDIA H100 80GB HBM3", gpu_s=7200.0,
                                   cpu_core_s=3600.0, energy_j=3.6e6, tasks=2),
                types_pb2.UsageRow(queue="research", user="bob", gpu_model="NVIDIA A100", gpu_s=1800.0)]

        async def scenario(app: App) -> None:
            await until(lambda: client.get(keys.usage_marks) is not None)
            client.txn([], [op_put(keys.usage_hour(h), types_pb2.UsageBucket(hour_unix_s=h, rows=rows)
                                   .SerializeToString())])
            async with admin_stub(AdminService(app)) as stub:
                report = await stub.GetUsage(admin_pb2.UsageRequest(since_unix_s=h - 86400), timeout=10)
                assert report.by == "queue" and report.since_unix_s == h - 86400
                assert report.accounted_until_unix_s >= h + HOUR_S
                assert dict(report.price_gpu_hour) == {"H100": 2.0} and report.price_kwh == 0.5
                by_key = {r.key: r for r in report.rows}
                assert list(by_key) == ["default", "research"]
                d = by_key["default"]
                assert (d.gpu_hours, d.cpu_core_hours, d.energy_kwh, d.tasks) == (2.0, 1.0, 1.0, 2)
                assert d.cost == pytest.approx(2 * 2.0 + 1.0 * 0.5) and by_key["research"].cost == 0
                by_model = await stub.GetUsage(admin_pb2.UsageRequest(since_unix_s=h, until_unix_s=h + 1,
                                                                      by="model"), timeout=10)
                assert [r.key for r in by_model.rows] == ["NVIDIA A100", "NVIDIA H100 80GB HBM3"]
                assert (by_model.since_unix_s, by_model.until_unix_s) == (h, h + HOUR_S)
                later = await stub.GetUsage(admin_pb2.UsageRequest(since_unix_s=h + HOUR_S, by="user"),
                                            timeout=10)
                assert not later.rows
                for request, field in [(admin_pb2.UsageRequest(by="node"), "by"),
                                       (admin_pb2.UsageRequest(since_unix_s=h, until_unix_s=h - 1),
                                        "since_unix_s"),
                                       (admin_pb2.UsageRequest(since_unix_s=math.nan), "since_unix_s"),
                                       (admin_pb2.UsageRequest(since_unix_s=h - 500 * 86400, until_unix_s=h),
                                        "until_unix_s")]:
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await stub.GetUsage(request, timeout=10)
                    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert info.value.details().startswith(field), info.value.details()

        try:
            asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario, price_gpu_hour={"H100": "2"},
                                    price_kwh=0.5))
        finally:
            client.close()
