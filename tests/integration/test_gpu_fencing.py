"""GPU fencing on a leading coordinator (coordinator/health): real components from ``coordinator.app.build`` on
the test session's etcd; the agent's side played through the app's own inputs (registration, telemetry
batches as the gateway hands them over, task statuses)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc.aio
import pytest
from prometheus_client import generate_latest

from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc, types_pb2
from common.types import NodeState, TaskState
from coordinator.api.admin import AdminService
from coordinator.api.gateway import AgentGatewayService
from coordinator.app import App, build
from coordinator.config import CoordinatorConfig
from coordinator.ctl.main import main as ctl_main
from coordinator.etcd_embedded import EtcdCluster
from coordinator.monitor.nodes import NodeEntry
from coordinator.sync import connect as connect_etcd
from tests.helpers.ctl_schema import validate
from tests.helpers.inproc import inventory, run_leading, until

Scenario = Callable[[App], Awaitable[None]]
U, D, H = types_pb2.GPU_HEALTH_STATE_UNHEALTHY, types_pb2.GPU_HEALTH_STATE_DEGRADED, types_pb2.GPU_HEALTH_STATE_HEALTHY
RESET, REPLACE = types_pb2.GPU_HEALTH_ACTION_RESET, types_pb2.GPU_HEALTH_ACTION_REPLACE


@pytest.fixture
def lead(etcd_server: EtcdCluster, etcd_prefix: str) -> Callable[..., None]:
    """Runs a scenario on a replica that leads (its own event loop)."""
    return lambda scenario, **cfg: asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario, **cfg))


def gpu_spec(name: str, gpus: int) -> types_pb2.TaskSpec:
    return types_pb2.TaskSpec(name=name, argv=["true"], kind=types_pb2.TASK_KIND_TRAINING, has_demand=True,
                              demand=types_pb2.ResourceVector(gpus=gpus, cpu_cores=1))


def report(app: App, entry: NodeEntry, gpus: int = 8, check: int = 0, check_message: str = "",
           **health: types_pb2.GpuHealth) -> None:
    """One telemetry batch from the node: every GPU healthy except those named ``g<index>``."""
    sample = types_pb2.TelemetrySample(time_unix_s=time.time(), health_check=types_pb2.NodeHealthCheck(
        state=check, message=check_message))
    for i in range(gpus):
        sample.gpus.append(types_pb2.GpuSample(index=i, healthy=True, mem_total_bytes=80 * 1024**3,
                                               health=health.get(f"g{i}", types_pb2.GpuHealth(state=H))))
    app.nodes.telemetry(entry, agent_pb2.TelemetryBatch(samples=[sample]))


def bad(action: int, reason: str, since: float | None = None) -> types_pb2.GpuHealth:
    return types_pb2.GpuHealth(state=U, action=action, reason=reason, evidence=reason.replace(" ", "="),
                               since_unix_s=time.time() if since is None else since)


async def stored(app: App, node_id: str = "n1") -> types_pb2.NodeRecord:
    return next(r for r in await asyncio.to_thread(app.store.list_nodes) if r.inventory.node_id == node_id)


async def connect(app: App, node_id: str = "n1", gpus: int = 8) -> NodeEntry:
    return await app.nodes.connected(agent_pb2.Register(inventory=inventory(node_id, gpus)), asyncio.Queue())


def health_events(app: App) -> list[tuple[str, dict[str, str]]]:
    return [(e.message, e.fields) for e in app.events.recent(200) if e.kind == "health"]


class TestFences:
    def test_unhealthy_report_fences_the_gpu_and_reset_lifts_itself(self, lead: Callable[..., None]) -> None:
        """An UNHEALTHY (RESET) report fences that GPU in etcd with history and an event; the node stays ready;
        the agent's HEALTHY report lifts the fence by itself, audited by "agent"."""
        lead(self._reset_fence)

    async def _reset_fence(self, app: App) -> None:
        entry = await connect(app)
        report(app, entry, g3=bad(RESET, "row remap pending"))
        await until(lambda: any(f.gpu_index == 3 for f in entry.record.gpu_fences))
        record = await stored(app)
        assert [(f.gpu_index, f.action, f.reason) for f in record.gpu_fences] == [(3, RESET, "row remap pending")]
        assert [(h.gpu_index, h.state, h.by) for h in record.gpu_health_history] == [(3, U, "agent")]
        assert entry.state == NodeState.READY and not record.health_drained
        message, fields = health_events(app)[-1]
        assert message.startswith("n1 GPU 3 unhealthy: row remap pending")
        assert fields["gpu"] == "3" and fields["state"] == "unhealthy" and fields["evidence"] == "row=remap=pending"
        scraped = generate_latest(app.metrics.registry).decode()
        assert 'gptrm_gpu_health{state="unhealthy"} 1.0' in scraped
        assert 'gptrm_gpu_health{state="healthy"} 7.0' in scraped

        report(app, entry)
        await until(lambda: not entry.record.gpu_fences)
        record = await stored(app)
        assert not record.gpu_fences and record.gpu_health_history[-1].state == H
        assert record.gpu_health_history[-1].by == "agent"
        assert "back in service" in health_events(app)[-1][0]

    def test_tasks_on_a_fenced_gpu_are_found(self, lead: Callable[..., None]) -> None:
        """A newly fenced GPU is handed to ``on_fenced`` once stored, and the task on it is in ``fenced_holders``."""
        lead(self._holders)

    async def _holders(self, app: App) -> None:
        seen: list[tuple[str, int]] = []
        app.nodes.health.on_fenced = lambda node_id, fence: seen.append((node_id, fence.gpu_index))
        entry = await connect(app, gpus=2)
        one = await app.tasks.submit(gpu_spec("one", 1), "r-1")
        await until(lambda: app.tasks.get(one.id).state == TaskState.SCHEDULED)
        gpu = gpus_of(app, one.id)[0]
        report(app, entry, gpus=2, **{f"g{gpu}": bad(REPLACE, "xid 79")})
        await until(lambda: bool(seen))
        assert seen == [("n1", gpu)]
        assert [(t, n, f.gpu_index) for t, n, f in app.nodes.health.fenced_holders()] == [(one.id, "n1", gpu)]

    def test_older_agent_unhealthy_is_a_replace_fence(self, lead: Callable[..., None]) -> None:
        """An older agent's healthy=false fences the GPU until an admin resumes it (its healthy=true does not)."""
        lead(self._older_agent)

    async def _older_agent(self, app: App) -> None:
        entry = await connect(app, gpus=2)
        sample = types_pb2.TelemetrySample(time_unix_s=time.time(), gpus=[
            types_pb2.GpuSample(index=0, healthy=True),
            types_pb2.GpuSample(index=1, healthy=False, health_reason="GPU is lost")])
        app.nodes.telemetry(entry, agent_pb2.TelemetryBatch(samples=[sample]))
        await until(lambda: bool(entry.record.gpu_fences))
        assert (entry.record.gpu_fences[0].action, entry.record.gpu_fences[0].reason) == (REPLACE, "GPU is lost")
        sample.gpus[1].healthy = True
        app.nodes.telemetry(entry, agent_pb2.TelemetryBatch(samples=[sample]))
        async with app.state.node_writes:   # any pass of the watch already under way has ended
            pass
        await app.nodes.health.step()
        assert (await stored(app)).gpu_fences[0].gpu_index == 1


async def finish(app: App, entry: NodeEntry, task_id: str) -> None:
    await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(task_id=task_id, state=int(TaskState.RUNNING)))
    await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(
        task_id=task_id, state=int(TaskState.SUCCEEDED), has_exit_code=True, exit_code=0))


def gpus_of(app: App, task_id: str) -> list[int]:
    return list(app.tasks.get(task_id).allocation.nodes[0].gpu_indices)


class TestPlacement:
    def test_fenced_gpu_is_never_offered_and_named_while_a_task_waits(self, lead: Callable[..., None]) -> None:
        """With GPU 3 fenced, an 8-GPU task waits naming it (not refused at submit) while a 4-GPU task places on
        other GPUs; an admin's resume brings the GPU back and the 8-GPU task is placed."""
        lead(self._waits_naming_the_gpu)

    async def _waits_naming_the_gpu(self, app: App) -> None:
        entry = await connect(app)
        report(app, entry, g3=bad(REPLACE, "xid 79"))
        await until(lambda: bool(entry.record.gpu_fences))
        big = await app.tasks.submit(gpu_spec("big", 8), "r-big")
        await until(lambda: "n1 GPU 3 unhealthy: xid 79" in app.tasks.get(big.id).reason)
        assert app.tasks.get(big.id).state == TaskState.PENDING
        small = await app.tasks.submit(gpu_spec("small", 4), "r-small")
        await until(lambda: app.tasks.get(small.id).state == TaskState.SCHEDULED)
        assert 3 not in gpus_of(app, small.id)
        await finish(app, entry, small.id)
        await until(lambda: app.tasks.get(small.id).state == TaskState.SUCCEEDED)
        assert app.tasks.get(big.id).state == TaskState.PENDING

        view = await app.nodes.health.resume("n1", [3], "admin-alice")
        assert not view.record.gpu_fences
        await until(lambda: app.tasks.get(big.id).state == TaskState.SCHEDULED)
        assert gpus_of(app, big.id) == list(range(8))
        record = await stored(app)
        assert not record.gpu_fences and record.gpu_health_history[-1].by == "admin-alice"
        # The agent still reports the episode the admin cleared: the GPU stays in service.
        report(app, entry, g3=bad(REPLACE, "xid 79", since=record.gpu_health_history[-2].time_unix_s))
        await app.nodes.health.step()
        assert not entry.record.gpu_fences

    def test_degraded_gpu_is_chosen_last(self, lead: Callable[..., None]) -> None:
        """A DEGRADED GPU stays in service but a one-GPU task goes to another GPU of the node."""
        lead(self._degraded_last)

    async def _degraded_last(self, app: App) -> None:
        entry = await connect(app, gpus=2)
        report(app, entry, gpus=2, g0=types_pb2.GpuHealth(state=D, reason="thermal slowdown"))
        await until(lambda: entry.degraded_gpus == frozenset({0}))
        await until(lambda: any(h.state == D for h in entry.record.gpu_health_history))
        one = await app.tasks.submit(gpu_spec("one", 1), "r-1")
        await until(lambda: app.tasks.get(one.id).state == TaskState.SCHEDULED)
        assert gpus_of(app, one.id) == [1]
        two = await app.tasks.submit(gpu_spec("two", 1), "r-2")
        await until(lambda: app.tasks.get(two.id).state == TaskState.SCHEDULED)
        assert gpus_of(app, two.id) == [0]   # in service: taken when nothing else is left
        assert not entry.record.gpu_fences

    def test_pending_health_check_holds_new_work(self, lead: Callable[..., None]) -> None:
        """While the node's health check has no verdict, nothing is placed there and the reason says so."""
        lead(self._check_pending)

    async def _check_pending(self, app: App) -> None:
        entry = await connect(app, gpus=1)
        report(app, entry, gpus=1, check=types_pb2.HEALTH_CHECK_STATE_PENDING)
        one = await app.tasks.submit(gpu_spec("one", 1), "r-1")
        await until(lambda: "n1 health check pending" in app.tasks.get(one.id).reason)
        report(app, entry, gpus=1, check=types_pb2.HEALTH_CHECK_STATE_OK)
        await until(lambda: app.tasks.get(one.id).state == TaskState.SCHEDULED)


class TestResumeGpus:
    def test_gptrmctl_gpus_resume_over_grpc(self, lead: Callable[..., None],
                                            capsys: pytest.CaptureFixture[str]) -> None:
        """`gptrmctl gpus resume NODE:INDEX -o json` lifts that fence (node.json output); an index that is not fenced
        and an unknown node are refused naming the field, with nothing changed; `gpus resume NODE` lifts the rest."""
        lead(lambda app: self._resume(app, capsys))

    async def _resume(self, app: App, capsys: pytest.CaptureFixture[str]) -> None:
        entry = await connect(app, gpus=4)
        report(app, entry, gpus=4, g1=bad(REPLACE, "xid 79"), g2=bad(REPLACE, "row remap failure"))
        await until(lambda: len(entry.record.gpu_fences) == 2)
        server = grpc.aio.server()
        admin_pb2_grpc.add_AdminServicer_to_server(AdminService(app), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ctl = ["--coordinator", f"127.0.0.1:{port}", "--insecure"]
        try:
            capsys.readouterr()
            assert await asyncio.to_thread(ctl_main, [*ctl, "-o", "json", "gpus", "resume", "n1:1"]) == 0
            lines = capsys.readouterr().out.splitlines()   # the coordinator's own log lines are in it too
            doc = json.loads("\n".join(lines[lines.index("{"):lines.index("}") + 1]))
            validate(doc, "node")
            assert [f.gpu_index for f in (await stored(app)).gpu_fences] == [2]

            assert await asyncio.to_thread(ctl_main, [*ctl, "gpus", "resume", "n1:3"]) != 0
            assert "gpu_indices" in capsys.readouterr().err
            assert await asyncio.to_thread(ctl_main, [*ctl, "gpus", "resume", "n9"]) != 0
            assert "n9" in capsys.readouterr().err
            assert await asyncio.to_thread(ctl_main, [*ctl, "gpus", "resume", "n1:x"]) == 2
            assert [f.gpu_index for f in (await stored(app)).gpu_fences] == [2]

            assert await asyncio.to_thread(ctl_main, [*ctl, "gpus", "resume", "n1"]) == 0
            assert "back in service" in capsys.readouterr().out
            assert not (await stored(app)).gpu_fences
        finally:
            await server.stop(None)


class TestNodeDrain:
    def test_drained_at_n_fenced_gpus_and_undrained_when_they_come_back(self, lead: Callable[..., None]) -> None:
        """Two fenced GPUs (--health-drain-gpus 2) drain the node (health_drained, reason, event); the agent's
        healthy reports lift the RESET fences and the health drain with them."""
        lead(self._n_fences, health_drain_gpus=2)

    async def _n_fences(self, app: App) -> None:
        entry = await connect(app, gpus=4)
        report(app, entry, gpus=4, g0=bad(RESET, "xid 48"))
        await until(lambda: len(entry.record.gpu_fences) == 1)
        assert not entry.record.health_drained and entry.state == NodeState.READY
        report(app, entry, gpus=4, g0=bad(RESET, "xid 48"), g2=bad(RESET, "xid 48"))
        await until(lambda: entry.record.health_drained)
        record = await stored(app)
        assert record.health_drained and record.health_drain_reason == "2 GPUs unhealthy" and not record.draining
        assert entry.state == NodeState.DRAINING
        assert any("drained by health: 2 GPUs unhealthy" in m for m, _f in health_events(app))
        report(app, entry, gpus=4)
        await until(lambda: not entry.record.health_drained)
        assert entry.state == NodeState.READY and not (await stored(app)).health_drained

    def test_failed_health_check_drains_and_never_lifts_an_admin_drain(self, lead: Callable[..., None]) -> None:
        """A FAILED health check drains the node with its message; an admin drains it too; the check's OK lifts only
        the health drain: the admin's drain stays."""
        lead(self._check_failed)

    async def _check_failed(self, app: App) -> None:
        entry = await connect(app, gpus=1)
        failed, ok = types_pb2.HEALTH_CHECK_STATE_FAILED, types_pb2.HEALTH_CHECK_STATE_OK
        report(app, entry, gpus=1, check=failed, check_message="ERROR: nvidia-smi reports 1 GPU, expected 8")
        await until(lambda: entry.record.health_drained)
        assert (await stored(app)).health_drain_reason == "ERROR: nvidia-smi reports 1 GPU, expected 8"
        one = await app.tasks.submit(gpu_spec("one", 1), "r-1")
        await until(lambda: "n1 drained by health: ERROR" in app.tasks.get(one.id).reason)
        await app.nodes.set_admin_state("n1", cordoned=True, draining=True)
        report(app, entry, gpus=1, check=ok)
        await until(lambda: not entry.record.health_drained)
        record = await stored(app)
        assert not record.health_drained and record.draining and record.cordoned
        assert entry.state == NodeState.DRAINING and app.tasks.get(one.id).state == TaskState.PENDING


class TestLeaderChange:
    def test_fence_survives_a_leader_change(self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """A fence written by one leader is read by the next from etcd: before any telemetry reaches it an 8-GPU
        task waits naming the GPU; the agent's unchanged report writes nothing new; its resume works there."""
        asyncio.run(self._failover(etcd_server.endpoints, etcd_prefix))

    async def _failover(self, endpoints: list[str], prefix: str) -> None:
        clients = [connect_etcd(endpoints, 2.0) for _ in range(2)]
        apps = [build(CoordinatorConfig(etcd_prefix=prefix, task_grace_s=3600.0, coordinator_id=f"c{i}",
                                     listen=f"127.0.0.1:{7700 + i}"), c)
                for i, c in enumerate(clients)]
        first, second = apps
        background = first.start(asyncio.get_running_loop())
        try:
            await until(lambda: first.leadership.is_leader)
            background += second.start(asyncio.get_running_loop())
            entry = await connect(first)
            report(first, entry, g3=bad(REPLACE, "xid 79", since=100.0))
            await until(lambda: bool(entry.record.gpu_fences))
            await first.leadership.resign()
            await until(lambda: second.leadership.is_leader, timeout_s=30)

            big = await second.tasks.submit(gpu_spec("big", 8), "r-big")
            assert [f.gpu_index for f in second.registry.get("n1").record.gpu_fences] == [3]
            entry = await connect(second)    # the agent follows the new leader
            report(second, entry, g3=bad(REPLACE, "xid 79", since=100.0))
            await until(lambda: "n1 GPU 3 unhealthy: xid 79" in second.tasks.get(big.id).reason)
            async with second.state.node_writes:
                pass
            await second.nodes.health.step()
            record = await stored(second)
            assert [f.gpu_index for f in record.gpu_fences] == [3] and len(record.gpu_health_history) == 1
            await second.nodes.health.resume("n1", [], "admin-bob")
            await until(lambda: second.tasks.get(big.id).state == TaskState.SCHEDULED)
        finally:
            for t in background:
                t.cancel()
            for app in apps:
                await app.leadership.resign()
            for c in clients:
                c.close()


class TestAppXids:
    def test_application_xid_is_recorded_on_the_task(self, lead: Callable[..., None]) -> None:
        """An application XID (13) on a task's GPU is recorded on that task (once per XID, with an event naming
        the task); the GPU stays healthy and nothing is drained."""
        lead(self._app_xid)

    async def _app_xid(self, app: App) -> None:
        entry = await connect(app, gpus=2)
        report(app, entry, gpus=2)
        one = await app.tasks.submit(gpu_spec("one", 1), "r-1")
        await until(lambda: app.tasks.get(one.id).state == TaskState.SCHEDULED)
        gpu = gpus_of(app, one.id)[0]
        at = time.time()
        xid = {f"g{gpu}": types_pb2.GpuHealth(state=H, app_xid_count=1, app_xid_last=13, app_xid_unix_s=at)}
        report(app, entry, gpus=2, **xid)
        await until(lambda: len(app.tasks.get(one.id).app_xids) == 1)
        stored_task = next(t for t in await asyncio.to_thread(app.store.list_tasks) if t.id == one.id)
        [recorded] = stored_task.app_xids
        assert (recorded.node_id, recorded.gpu_index, recorded.xid, recorded.time_unix_s) == ("n1", gpu, 13, at)
        assert any(e.kind == "health" and e.task_id == one.id for e in app.events.recent(100))
        report(app, entry, gpus=2, **xid)   # the same count again: nothing new
        xid[f"g{gpu}"] = types_pb2.GpuHealth(state=H, app_xid_count=2, app_xid_last=31, app_xid_unix_s=at + 1)
        report(app, entry, gpus=2, **xid)
        await until(lambda: len(app.tasks.get(one.id).app_xids) == 2)
        assert [x.xid for x in app.tasks.get(one.id).app_xids] == [13, 31]
        record = await stored(app)
        assert not record.gpu_fences and not record.health_drained and entry.state == NodeState.READY


class TestOverGrpc:
    def test_agent_stream_report_fences_and_admin_resumes(self, lead: Callable[..., None]) -> None:
        """Over real gRPC: an agent stream's UNHEALTHY report shows as a fence in GetNode's record; ResumeGpus
        clears it and answers the node."""
        lead(self._over_grpc)

    async def _over_grpc(self, app: App) -> None:
        server = grpc.aio.server()
        admin_pb2_grpc.add_AdminServicer_to_server(AdminService(app), server)
        agent_pb2_grpc.add_AgentGatewayServicer_to_server(AgentGatewayService(app), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        sent: asyncio.Queue[agent_pb2.AgentMessage | None] = asyncio.Queue()

        async def messages() -> AsyncIterator[agent_pb2.AgentMessage]:
            while (msg := await sent.get()) is not None:
                yield msg

        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                admin = admin_pb2_grpc.AdminStub(channel)
                stream = agent_pb2_grpc.AgentGatewayStub(channel).Connect(messages())
                sent.put_nowait(agent_pb2.AgentMessage(register=agent_pb2.Register(inventory=inventory("n1", 8))))
                assert (await stream.read()).HasField("welcome")
                sample = types_pb2.TelemetrySample(time_unix_s=time.time(), gpus=[
                    types_pb2.GpuSample(index=i, healthy=True, health=bad(REPLACE, "xid 79") if i == 3 else
                                        types_pb2.GpuHealth(state=H)) for i in range(8)])
                sent.put_nowait(agent_pb2.AgentMessage(telemetry=agent_pb2.TelemetryBatch(samples=[sample])))

                async def fences() -> list[int]:
                    view = await admin.GetNode(admin_pb2.GetNodeRequest(node_id="n1"), timeout=10)
                    return [f.gpu_index for f in view.record.gpu_fences]

                deadline = asyncio.get_running_loop().time() + 15
                while await fences() != [3]:
                    assert asyncio.get_running_loop().time() < deadline, "no fence"
                    await asyncio.sleep(0.05)
                view = await admin.ResumeGpus(admin_pb2.ResumeGpusRequest(node_id="n1", gpu_indices=[3]), timeout=10)
                assert not view.record.gpu_fences and view.record.gpu_health_history[-1].state == H
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await admin.ResumeGpus(admin_pb2.ResumeGpusRequest(node_id="n1", gpu_indices=[3]), timeout=10)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "gpu_indices" in err.value.details()
                sent.put_nowait(None)
                stream.cancel()
        finally:
            await server.stop(None)
