"""A service replica that needs one more node than is on: the power manager wakes an off node through the
node provider (a real operator command) and the replica runs there, with the in-process leading app on the
test session's etcd playing the agents' side."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TERMINAL_STATES, TaskState
from coordinator.app import App
from coordinator.etcd_embedded import EtcdCluster
from coordinator.power_states import power_label
from tests.helpers.inproc import inventory, run_leading, until

PS = types_pb2.NodePowerState

PROVIDER = """#!/bin/sh
cat >> {log}
echo >> {log}
"""


def service_spec() -> types_pb2.TaskSpec:
    """A one-GPU inference service of 1 to 2 replicas, scaled on GPU utilization."""
    spec = types_pb2.TaskSpec(name="llm", argv=["true"], kind=types_pb2.TASK_KIND_INFERENCE, has_demand=True,
                              demand=types_pb2.ResourceVector(gpus=1, cpu_cores=1), metrics_port=9100)
    spec.service.min_replicas, spec.service.max_replicas, spec.service.target_util = 1, 2, 0.6
    return spec


def live(app: App, service_id: str) -> dict[int, types_pb2.Task]:
    """The service's unfinished replicas by index."""
    return {t.replica_index: t for t in app.tasks.tasks.values()
            if t.service_id == service_id and t.state not in TERMINAL_STATES}


def placed_on(task: types_pb2.Task | None) -> str:
    """The node a task was placed on ('' while unplaced)."""
    return task.allocation.nodes[0].node_id if task is not None and task.allocation.nodes else ""


class TestServiceWakesANode:
    def test_a_replica_wakes_an_off_node_and_runs_there(self, etcd_server: EtcdCluster, etcd_prefix: str,
                                                        tmp_path: Path) -> None:
        """With the only ready node full (one GPU, replica 0) and the other node off, scaling to 2 replicas
        makes the power manager ask the provider to power the off node on; once its agent registers the
        replica is placed there, runs, and no other node was woken."""
        log = tmp_path / "requests.log"
        script = tmp_path / "provider.sh"
        script.write_text(PROVIDER.format(log=log))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)

        def requests() -> list[tuple[str, str]]:
            if not log.exists():
                return []
            return [(r["action"], r["node_id"]) for r in map(json.loads, log.read_text().splitlines()) if r]

        async def scenario(app: App) -> None:
            n1 = await app.nodes.connected(agent_pb2.Register(inventory=inventory("n1", gpus=1)), asyncio.Queue())
            n2, _ = app.registry.connect(inventory("n2", gpus=1), outbox=None)   # known, then powered off
            n2.record.power_state = PS.NODE_POWER_STATE_OFF
            await app.leadership.write(app.store.put_node, n2.record)
            app.registry.disconnect("n2", n2.stream_id)

            async def heartbeats() -> None:   # the agents' side: connected nodes stay ready
                while True:
                    for e in app.registry:
                        if e.connected:
                            app.registry.heartbeat(e)
                    await asyncio.sleep(0.2)

            beating = asyncio.create_task(heartbeats())
            try:
                svc = await app.services.create(service_spec())
                await until(lambda: placed_on(live(app, svc.id).get(0)) == "n1")
                await app.reconciler.on_task_status(n1, agent_pb2.TaskStatus(task_id=live(app, svc.id)[0].id,
                                                                             state=int(TaskState.RUNNING)))
                assert power_label(n2.record.power_state) == "off" and requests() == []
                await app.services.scale(svc.id, 2)
                await until(lambda: power_label(n2.record.power_state) == "powering-on", timeout_s=20)
                assert requests() == [("power_on", "n2")]
                assert 1 in live(app, svc.id) and not placed_on(live(app, svc.id)[1])   # waits for the node
                n2 = await app.nodes.connected(agent_pb2.Register(inventory=inventory("n2", gpus=1)),
                                               asyncio.Queue())                      # its agent booted
                await until(lambda: placed_on(live(app, svc.id).get(1)) == "n2", timeout_s=20)
                r1 = live(app, svc.id)[1]
                assert r1.state == TaskState.SCHEDULED and power_label(n2.record.power_state) == "ready"
                await app.reconciler.on_task_status(n2, agent_pb2.TaskStatus(task_id=r1.id,
                                                                             state=int(TaskState.RUNNING)))
                assert live(app, svc.id)[1].state == TaskState.RUNNING
                assert {i: placed_on(t) for i, t in live(app, svc.id).items()} == {0: "n1", 1: "n2"}
                assert requests() == [("power_on", "n2")]
            finally:
                beating.cancel()

        asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario, node_provider="command",
                                node_provider_command=str(script), node_provider_timeout_s=5.0))
