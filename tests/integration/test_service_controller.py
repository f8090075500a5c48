"""The leader's replica controller (coordinator/adaptor/services.py) on real etcd and the real object graph:
replicas follow the stored count, pins and unpins, dead replicas are replaced, a new leader continues."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from common.errors import IllegalTransition, ValidationError
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TERMINAL_STATES
from coordinator.adaptor.services import ServiceController, ServiceMetrics
from coordinator.app import App
from coordinator.etcd_embedded import EtcdCluster
from coordinator.sync import connect
from coordinator.sync.client import EtcdClient, op_put
from coordinator.sync.keys import Keys
from coordinator.sync.services import ServiceStore
from tests.helpers.inproc import inventory, run_leading, until


def service_spec(lo: int = 1, hi: int = 3, **service: float) -> types_pb2.TaskSpec:
    """A one-GPU inference service scaled on GPU utilization unless told otherwise."""
    spec = types_pb2.TaskSpec(name="llm", argv=["true"], kind=types_pb2.TASK_KIND_INFERENCE, has_demand=True,
                              demand=types_pb2.ResourceVector(gpus=1, cpu_cores=1), metrics_port=9100)
    spec.service.min_replicas, spec.service.max_replicas = lo, hi
    spec.service.target_util = service.get("target_util", 0.6)
    return spec


def live(app: App, service_id: str) -> dict[int, types_pb2.Task]:
    """The service's unfinished replicas by index."""
    return {t.replica_index: t for t in app.tasks.tasks.values()
            if t.service_id == service_id and t.state not in TERMINAL_STATES}


def services_passes_done(app: App) -> bool:
    """Whether the leader's replica controller has completed a pass since its duty started."""
    return next(d for d in app.supervisor.views() if d.name == "services").last_pass_age_s is not None


Scenario = Callable[[App], Awaitable[None]]


@pytest.fixture
def lead(etcd_server: EtcdCluster, etcd_prefix: str) -> Callable[[Scenario], None]:
    """Runs scenarios, one after another, each on a fresh replica that leads (same etcd prefix) with node n1."""

    async def with_n1(scenario: Scenario, app: App) -> None:
        await app.nodes.connected(agent_pb2.Register(inventory=inventory("n1")), asyncio.Queue())
        await scenario(app)

    return lambda scenario: asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix,
                                                    lambda app: with_n1(scenario, app)))


class TestReplicaController:
    def test_replicas_follow_pins_and_a_new_leader_continues(self, lead: Callable[[Scenario], None]) -> None:
        """MIN replicas at creation; a pin to 3 adds indices 1 and 2 with their own port and env; a pin to 2
        cancels index 2; a dead replica is replaced; a new leader keeps the pinned count from etcd; a cancelled
        service stops its replicas and cannot be scaled again."""
        ids: list[str] = []

        async def first(app: App) -> None:
            svc = await app.services.create(service_spec(1, 3))
            ids.append(svc.id)
            await until(lambda: set(live(app, svc.id)) == {0})
            await app.services.scale(svc.id, 3)
            await until(lambda: set(live(app, svc.id)) == {0, 1, 2})
            r2 = live(app, svc.id)[2]
            assert r2.spec.env["GPTRM_REPLICA"] == "2" and r2.spec.env["GPTRM_PORT_OFFSET"] == "2"
            assert r2.spec.metrics_port == 9102 and r2.spec.env["GPTRM_METRICS_PORT"] == "9102"
            await app.services.scale(svc.id, 2)
            await until(lambda: set(live(app, svc.id)) == {0, 1})
            dead = live(app, svc.id)[1]
            await app.tasks.cancel(dead.id)
            await until(lambda: 1 in live(app, svc.id) and live(app, svc.id)[1].id != dead.id)
            view = app.services.view(svc.id)
            assert view.service.pinned and view.service.desired == 2
            assert [d.to_replicas for d in view.service.decisions][:2] == [2, 3]

        async def second(app: App) -> None:
            await until(lambda: ids[0] in app.services.services)
            svc = app.services.services[ids[0]]
            assert svc.pinned and svc.desired == 2
            await until(lambda: services_passes_done(app))   # this leader's first pass: recovery, then a tick
            assert set(live(app, svc.id)) == {0, 1}      # continued: nothing re-created
            unpinned = await app.services.scale(svc.id, None)
            assert not unpinned.pinned
            ever = {t.id for t in app.tasks.tasks.values() if t.service_id == svc.id}
            cancelled = await app.services.cancel(svc.id)
            assert cancelled.stopped and cancelled.desired == 0
            await until(lambda: not live(app, svc.id))   # never started (no agent): cancelled at once
            await app.services.tick()                     # a pass of the controller after the cancel
            assert {t.id for t in app.tasks.tasks.values() if t.service_id == svc.id} == ever   # none created
            with pytest.raises(IllegalTransition):
                await app.services.scale(svc.id, 2)

        lead(first)
        lead(second)

    def test_bad_services_are_refused_naming_the_field(self, lead: Callable[[Scenario], None]) -> None:
        """MIN > MAX, MAX beyond the cluster, a target out of range, no signal, a pin out of range: refused."""

        async def scenario(app: App) -> None:
            cases = [(service_spec(3, 2), "spec.service.max_replicas"),
                     (service_spec(1, 5), "spec.service.max_replicas"),       # 5 GPUs > the node's 4
                     (service_spec(1, 2, target_util=1.5), "spec.service.target_util"),
                     (service_spec(0, 2), "spec.service.min_replicas")]
            no_signal = service_spec(1, 2)
            no_signal.service.target_util = 0
            cases.append((no_signal, "spec.service"))
            no_port = service_spec(1, 2, target_util=0)
            no_port.service.target_util = 0
            no_port.qos.max_latency_ms = 200
            no_port.metrics_port = 0
            cases.append((no_port, "spec.metrics_port"))
            for spec, field in cases:
                with pytest.raises(ValidationError) as e:
                    await app.services.create(spec)
                assert e.value.field == field, (field, str(e.value))
            assert not app.services.services
            svc = await app.services.create(service_spec(1, 2))
            with pytest.raises(ValidationError, match="outside"):
                await app.services.scale(svc.id, 3)

        lead(scenario)

    def test_a_retried_create_with_its_request_id_makes_one_service(self, lead: Callable[[Scenario], None]) -> None:
        """The same request id twice (a retry across a leader change) returns the one service; the same id with
        another spec is refused naming request_id."""

        async def first(app: App) -> None:
            svc = await app.services.create(service_spec(1, 2), "req-1")
            again = await app.services.create(service_spec(1, 2), "req-1")
            assert again.id == svc.id and len(app.services.services) == 1
            with pytest.raises(ValidationError) as e:
                await app.services.create(service_spec(1, 3), "req-1")
            assert e.value.field == "request_id"

        async def second(app: App) -> None:   # a new leader: the stored service answers the retry
            again = await app.services.create(service_spec(1, 2), "req-1")
            assert list(app.services.services) == [again.id]

        lead(first)
        lead(second)


class TestSpread:
    @pytest.mark.parametrize("pack", [False, True])
    def test_replicas_go_to_separate_nodes_unless_packed(self, lead: Callable[[Scenario], None], pack: bool) -> None:
        """Under max-utilization (which packs), a service's two replicas still land on two nodes; with
        pack_replicas they share one."""

        async def scenario(app: App) -> None:
            await app.nodes.connected(agent_pb2.Register(inventory=inventory("n2")), asyncio.Queue())

            async def heartbeats() -> None:   # the agents' side: both nodes stay ready
                while True:
                    for e in app.registry:
                        app.registry.heartbeat(e)
                    await asyncio.sleep(0.2)

            beating = asyncio.create_task(heartbeats())
            spec = service_spec(2, 2)
            spec.service.pack_replicas = pack
            svc = await app.services.create(spec)

            def nodes() -> list[str]:
                return [t.allocation.nodes[0].node_id for t in live(app, svc.id).values() if t.allocation.nodes]

            await until(lambda: len(nodes()) == 2, timeout_s=20)
            beating.cancel()
            assert len(set(nodes())) == (1 if pack else 2), nodes()
            second = live(app, svc.id)[1]
            assert list(second.spec.constraints.avoid_nodes) == ([] if pack else [nodes()[0]])

        lead(scenario)


def util_sample(node_id: str, util: float) -> types_pb2.TelemetrySample:
    """A telemetry sample with every GPU of the node at ``util``."""
    return types_pb2.TelemetrySample(
        gpus=[types_pb2.GpuSample(index=i, util_gpu=util) for i in range(4)])


class TestReactiveScaling:
    def test_high_utilization_scales_up_and_missing_metrics_freeze(self, lead: Callable[[Scenario], None]) -> None:
        """A running replica at 100 % GPU against a 60 % target becomes two (HPA: ceil(1 * 1.0 / 0.6));
        when the telemetry disappears the count stays and an event says it is frozen."""

        async def scenario(app: App) -> None:
            entry = app.registry.get("n1")
            assert entry is not None
            svc = await app.services.create(service_spec(1, 3))
            await until(lambda: 0 in live(app, svc.id) and live(app, svc.id)[0].allocation.nodes)
            r0 = live(app, svc.id)[0]
            await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(task_id=r0.id, state=4))   # RUNNING
            app.monitor.latest["n1"] = util_sample("n1", 1.0)
            await until(lambda: app.services.services[svc.id].desired == 2)
            stored = app.services.services[svc.id]
            assert "GPU utilization 1 vs target 0.6" in stored.reason and "1 → 2" in stored.reason
            await until(lambda: set(live(app, svc.id)) == {0, 1})
            view = app.services.view(svc.id).service
            assert view.signal == 1.0 and view.lead_time_s > 0
            del app.monitor.latest["n1"]
            for t in live(app, svc.id).values():
                if t.state != 4:
                    await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(task_id=t.id, state=4))
            await until(lambda: any("frozen" in e.message for e in app.events.recent(50)))
            assert app.services.services[svc.id].desired == 2

        lead(scenario)



class TestDrainMovesReplicas:
    def test_replica_on_a_draining_node_is_replaced_before_it_stops(self, lead: Callable[[Scenario], None]) -> None:
        """Draining the node of a running replica starts a replacement with the same index on another node;
        only once it runs is the drained one stopped."""

        async def heartbeats(app: App) -> None:
            while True:       # the agents' heartbeats: both nodes stay ready
                for e in app.registry:
                    app.registry.heartbeat(e)
                await asyncio.sleep(0.2)

        async def scenario(app: App) -> None:
            await app.nodes.connected(agent_pb2.Register(inventory=inventory("n2")), asyncio.Queue())
            beating = asyncio.create_task(heartbeats(app))
            try:
                await drain_scenario(app)
            finally:
                beating.cancel()

        async def drain_scenario(app: App) -> None:
            svc = await app.services.create(service_spec(1, 2))
            await until(lambda: 0 in live(app, svc.id) and live(app, svc.id)[0].allocation.nodes)
            old = live(app, svc.id)[0]
            here = old.allocation.nodes[0].node_id
            there = "n2" if here == "n1" else "n1"
            entry = app.registry.get(here)
            assert entry is not None and entry.outbox is not None
            await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(task_id=old.id, state=4))
            await app.nodes.set_admin_state(here, cordoned=True, draining=True)

            def replacement() -> types_pb2.Task | None:
                return next((t for t in app.tasks.tasks.values() if t.service_id == svc.id and t.id != old.id
                             and t.allocation.nodes), None)

            await until(lambda: replacement() is not None)
            new = replacement()
            assert new is not None and new.replica_index == 0 and new.allocation.nodes[0].node_id == there
            await app.services.tick()                                 # a pass while the replacement is not running
            assert not _stops(entry.outbox, old.id)                   # still serving until the replacement runs
            other = app.registry.get(there)
            assert other is not None
            await app.reconciler.on_task_status(other, agent_pb2.TaskStatus(task_id=new.id, state=4))
            await until(lambda: old.id in app.services._rt[svc.id].cancelling)
            assert _stops(entry.outbox, old.id)

        lead(scenario)


def _stops(outbox: asyncio.Queue, task_id: str) -> bool:
    """Whether a stop decision for ``task_id`` is in the node's outbox (drained from it)."""
    found = False
    while not outbox.empty():
        m = outbox.get_nowait()
        if m is not None and m.decision.HasField("stop") and m.decision.stop.task_id == task_id:
            found = True
    return found


HOUR = 3600.0
START = 1_700_000_000 // 3600 * 3600.0
"""A Unix time at the start of an hour bucket."""


def hourly_controller(app: App, client: EtcdClient, prefix: str, wall: list[float]) -> ServiceController:
    """A controller on the app's parts with hourly history buckets (a day is 24), saved every 5, on ``wall``."""
    return ServiceController(ServiceStore(client, Keys(prefix), app.leadership.election), app.leadership, app.state,
                             app.tasks, app.monitor, app.registry, app.profiler, app.events,
                             ServiceMetrics(CollectorRegistry()), history_bucket_s=HOUR, history_save_buckets=5,
                             wall=lambda: wall[0])


async def recovered_view(ctl: ServiceController, service_id: str) -> types_pb2.Service:
    """Run ``ctl`` as a new leader until its first tick has forecast ``service_id``; its view then."""
    running = asyncio.create_task(ctl.run(lambda: True))
    try:
        await until(lambda: service_id in ctl.services and ctl.view(service_id).service.forecast_model)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    return ctl.view(service_id).service


class TestLoadHistoryAcrossLeaders:
    def test_a_new_leader_continues_the_forecast_and_a_corrupt_history_starts_empty(
            self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """Leader A sees two days and eight hours of a daily load (Holt-Winters); leader B, reading the stored
        history, forecasts with Holt-Winters at once, the same load, MAPE and replica need; a corrupt stored
        history makes leader C start empty (model none) and log why, while it still runs the service."""
        wall = [START]
        ids: list[str] = []
        seen: dict[str, types_pb2.Service] = {}
        client = connect(etcd_server.endpoints, 2.0)
        keys = Keys(etcd_prefix)

        async def leader_a(app: App) -> None:
            await app.nodes.connected(agent_pb2.Register(inventory=inventory("n1")), asyncio.Queue())
            entry = app.registry.get("n1")
            assert entry is not None
            ctl = hourly_controller(app, client, etcd_prefix, wall)
            svc = await ctl.create(service_spec(1, 1))
            ids.append(svc.id)
            await ctl.tick()
            await until(lambda: 0 in live(app, svc.id) and live(app, svc.id)[0].allocation.nodes)
            await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(task_id=live(app, svc.id)[0].id,
                                                                            state=4))
            for hour in range(24 * 2 + 8):
                wall[0] = START + hour * HOUR
                util = 0.3 + 0.25 * math.sin(2 * math.pi * hour / 24)
                app.monitor.latest["n1"] = util_sample("n1", util)
                await ctl.tick()
            assert client.get(keys.service_history(svc.id)) is not None
            seen["a"] = ctl.view(svc.id).service

        async def leader_b(app: App) -> None:
            ctl = hourly_controller(app, client, etcd_prefix, wall)
            with capture_logs() as logs:
                seen["b"] = await recovered_view(ctl, ids[0])
            assert any(e["event"] == "service_history_restored" and e["service_id"] == ids[0] for e in logs)

        async def leader_c(app: App) -> None:
            client.txn([], [op_put(keys.service_history(ids[0]), b"\xff\x00 not a history")])
            ctl = hourly_controller(app, client, etcd_prefix, wall)
            with capture_logs() as logs:
                seen["c"] = await recovered_view(ctl, ids[0])
                await ctl.tick()
            moved = [e for e in logs if e["event"] == "etcd_value_quarantined"]
            assert moved and moved[0]["key"] == keys.service_history(ids[0])
            assert "ServiceLoadHistory" in moved[0]["reason"]
            assert client.get(keys.service_history(ids[0])) is None

        try:
            for scenario in (leader_a, leader_b, leader_c):
                asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario))
        finally:
            client.close()
        a, b, c = seen["a"], seen["b"], seen["c"]
        assert a.forecast_model == b.forecast_model == "holt-winters"
        assert b.forecast_load == pytest.approx(a.forecast_load, rel=1e-3)
        assert not math.isnan(a.forecast_mape) and b.forecast_mape == pytest.approx(a.forecast_mape, rel=1e-9)
        assert b.forecast_replicas == a.forecast_replicas >= 1            # the learned capacity came along
        assert c.forecast_model == "none" and c.forecast_replicas == 0 and math.isnan(c.forecast_mape)


class TestStoredHistoryLimits:
    def test_an_oversized_or_misnamed_history_is_refused_before_use(self, etcd_server: EtcdCluster,
                                                                     etcd_prefix: str) -> None:
        """A stored history above the byte cap is refused undecoded; one naming another service, with error
        times not paired with errors, or with a non-finite capacity is refused: each reads as None and is moved
        under quarantine/ (the reason logged); a missing one reads as None, and a well-formed one reads back
        as written."""
        client = connect(etcd_server.endpoints, 2.0)
        keys = Keys(etcd_prefix)

        async def scenario(app: App) -> None:
            store = ServiceStore(client, keys, app.leadership.election, max_history_bytes=64)
            assert store.get_history("s-none") is None
            good = types_pb2.ServiceLoadHistory(service_id="s-a", bucket_s=60.0, last_bucket=5, values=[1.0, 2.0])
            await app.leadership.write(store.put_history, good)
            assert store.get_history("s-a") == good
            with pytest.raises(ValidationError):
                store.put_history(types_pb2.ServiceLoadHistory(service_id="s-a", values=[1.0] * 64))
            unpaired = types_pb2.ServiceLoadHistory(service_id="s-d", errors=[0.1], error_times_unix_s=[])
            bad_capacity = types_pb2.ServiceLoadHistory(service_id="s-e", capacity=float("nan"))
            refused = {"s-b": (b"\x00" * 65, "65 bytes"), "s-c": (good.SerializeToString(), "s-a"),
                       "s-d": (unpaired.SerializeToString(), "0 error times for 1 errors"),
                       "s-e": (bad_capacity.SerializeToString(), "capacity nan")}
            for sid, (value, why) in refused.items():
                client.txn([], [op_put(keys.service_history(sid), value)])
                revision = client.get(keys.service_history(sid)).mod_revision
                with capture_logs() as logs:
                    assert store.get_history(sid) is None
                assert [e["reason"] for e in logs if e["event"] == "etcd_value_quarantined" and why in e["reason"]]
                assert client.get(keys.service_history(sid)) is None
                assert client.get(keys.quarantine(keys.service_history(sid), revision)).value == value

        try:
            asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario))
        finally:
            client.close()
