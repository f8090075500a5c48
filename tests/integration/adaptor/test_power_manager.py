"""The leader's power manager (coordinator/adaptor/power.py) as ``coordinator.app.build`` wires it, on the test
session's etcd, with a real operator command as the node provider."""

from __future__ import annotations

import asyncio
import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.app import App, build
from coordinator.config import CoordinatorConfig
from coordinator.etcd_embedded import EtcdCluster
from coordinator.power_states import power_label
from coordinator.sync import connect
from tests.helpers.clock import FakeClock

GIB = 1024**3
PS = types_pb2.NodePowerState

SCRIPT = """#!/bin/sh
cat >> {log}
echo >> {log}
{tail}
"""


class Rig:
    """A leading replica whose provider command logs each request, then runs ``tail`` (its exit); its power
    manager's idle times are on a fake clock that each step moves on. A node whose power-off was accepted
    falls silent after the step, unless it is in ``streaming_on`` (a power-off that does not happen)."""

    def __init__(self, app: App, log: Path) -> None:
        self.app, self.log = app, log
        self.clock = FakeClock()
        self.streaming_on: set[str] = set()
        app.power_manager._now = self.clock   # the clock the manager was built with (time.monotonic)

    def node(self, node_id: str, gpus: int, *, off: bool = False, gpu_mem_gib: int = 80,
             model: str = "NVIDIA H100 80GB HBM3") -> None:
        inv = types_pb2.NodeInventory(
            node_id=node_id, cpu_cores=64, mem_total_bytes=512 * GIB,
            gpus=[types_pb2.GpuInfo(index=i, model=model, mem_total_bytes=gpu_mem_gib * GIB)
                  for i in range(gpus)])
        entry, _ = self.app.registry.connect(inv, outbox=None)
        if off:
            entry.record.power_state = PS.NODE_POWER_STATE_OFF
            self.app.registry.disconnect(node_id, entry.stream_id)

    def pending(self, task_id: str, gpus: float, nodes: int = 1, *, gpu_mem_gib: int = 10,
                avoid: tuple[str, ...] = ()) -> types_pb2.Task:
        task = types_pb2.Task(
            id=task_id, state=int(TaskState.PENDING), revision=1, submit_unix_s=1.0,
            spec=types_pb2.TaskSpec(name=task_id, argv=["true"], nodes=nodes,
                                    constraints=types_pb2.Constraints(avoid_nodes=list(avoid))),
            demand=types_pb2.ResourceVector(gpus=gpus, gpu_mem_bytes=gpu_mem_gib * GIB, cpu_cores=1.0,
                                            mem_bytes=GIB))
        self.app.state.apply_task(task)
        return task

    def steps(self, n: int) -> None:
        """``n`` power-manager steps."""
        async def go() -> None:
            for _ in range(n):
                await self.app.power_manager.step()
                accepted = self.app.power_manager._off_accepted
                for entry in self.app.registry:   # the provider's power-off ends the node's stream
                    if entry.node_id in self.streaming_on:
                        self.app.registry.heartbeat(entry)
                    if entry.connected and entry.node_id not in self.streaming_on and (
                            entry.node_id in accepted or power_label(entry.record.power_state) == "off"):
                        self.app.registry.disconnect(entry.node_id, entry.stream_id)
                self.clock.advance(0.05)   # past --power-down-after
        asyncio.run(go())

    def power(self, node_id: str) -> str:
        return power_label(self.app.registry.get(node_id).record.power_state)

    def requests(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def ignored(self) -> float:
        return self.app.metrics.registry.get_sample_value("gptrm_adaptor_power_off_ignored_total") or 0.0

    def power_offs(self) -> int:
        return sum(1 for r in self.requests() if r["action"] == "power_off")

    def failures(self, action: str) -> float:
        return self.app.metrics.registry.get_sample_value("gptrm_adaptor_provider_failures_total",
                                                          {"action": action}) or 0.0


def make_rig(etcd_server: EtcdCluster, etcd_prefix: str, tmp_path: Path, tail: str,
             **policy: object) -> Iterator[Rig]:
    """A rig with threshold 0.5 under the paper's rule (GPU counts capped too) unless ``policy`` says otherwise."""
    log = tmp_path / "requests.log"
    script = tmp_path / "provider.sh"
    script.write_text(SCRIPT.format(log=log, tail=tail))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    client = connect(etcd_server.endpoints, 2.0)
    settings = {"threshold": 0.5, "threshold_mode": "paper", **policy}
    cfg = CoordinatorConfig(etcd_prefix=etcd_prefix, policy="max-utilization", **settings,
                            node_provider="command", node_provider_command=str(script),
                            node_provider_timeout_s=1.0, power_down_after_s=0.01, spare_nodes=0, lease_ttl_s=5.0)
    app = build(cfg, client)
    assert app.leadership.election.acquire(timeout=10)
    app.leadership.leading = True
    yield Rig(app, log)
    app.leadership.election.resign()
    client.close()


@pytest.fixture
def rig(etcd_server: EtcdCluster, etcd_prefix: str, tmp_path: Path) -> Iterator[Rig]:
    yield from make_rig(etcd_server, etcd_prefix, tmp_path, "exit 0")


@pytest.fixture
def default_rig(etcd_server: EtcdCluster, etcd_prefix: str, tmp_path: Path) -> Iterator[Rig]:
    """A rig with the coordinator's default threshold and threshold mode."""
    defaults = CoordinatorConfig()
    yield from make_rig(etcd_server, etcd_prefix, tmp_path, "exit 0", threshold=defaults.threshold,
                        threshold_mode=defaults.threshold_mode)


@pytest.fixture(params=["exit 1", "exec sleep 30"], ids=["exits-1", "hangs"])
def failing_rig(etcd_server: EtcdCluster, etcd_prefix: str, tmp_path: Path,
                request: pytest.FixtureRequest) -> Iterator[Rig]:
    yield from make_rig(etcd_server, etcd_prefix, tmp_path, request.param)


class TestWakeThreshold:
    def test_fit_only_above_the_threshold_wakes_an_off_node(self, rig: Rig) -> None:
        """3 GPUs on a free 4-GPU node exceed threshold 0.5: the off 8-GPU node is woken for the task."""
        rig.node("n1", 4)
        rig.node("n2", 8, off=True)
        rig.app.power_manager.unplaced(rig.pending("t1", 3.0))
        rig.steps(1)
        assert rig.power("n2") == "powering-on"
        assert [(r["action"], r["node_id"]) for r in rig.requests()] == [("power_on", "n2")]

    def test_fit_under_the_threshold_wakes_nothing(self, rig: Rig) -> None:
        """2 GPUs fit a free 4-GPU node at threshold 0.5: the scheduler places it, no node is woken."""
        rig.node("n1", 4)
        rig.node("n2", 8, off=True)
        rig.app.power_manager.unplaced(rig.pending("t1", 2.0))
        rig.steps(1)
        assert rig.power("n2") == "off" and rig.requests() == []


class TestWholeGpusByDefault:
    def test_gang_of_whole_nodes_wakes_an_off_node(self, default_rig: Rig) -> None:
        """With the defaults a 2-node gang of 4 GPUs each fits two 4-GPU nodes: the ready one cannot take the
        second part, so the off one is woken."""
        default_rig.node("n1", 4)
        default_rig.node("n2", 4, off=True)
        default_rig.app.power_manager.unplaced(default_rig.pending("gang", 4.0, nodes=2))
        default_rig.steps(1)
        assert default_rig.power("n2") == "powering-on"
        assert [(r["action"], r["node_id"]) for r in default_rig.requests()] == [("power_on", "n2")]


class TestPlacementFilter:
    """Wake and scale-in ask the placement filter itself, not a count of GPUs."""

    def test_gpu_memory_the_ready_node_lacks_wakes_a_node_that_has_it(self, rig: Rig) -> None:
        """A free 8-GPU node with 40 GiB GPUs cannot hold 60 GiB per GPU: the off 80 GiB node is woken."""
        rig.node("n1", 8, gpu_mem_gib=40, model="NVIDIA A100-PCIE-40GB")
        rig.node("n2", 8, off=True)
        rig.app.power_manager.unplaced(rig.pending("t1", 1.0, gpu_mem_gib=60))
        rig.steps(1)
        assert rig.power("n2") == "powering-on"

    def test_off_node_without_the_gpu_memory_is_not_woken(self, rig: Rig) -> None:
        """An off node whose GPUs are too small for the task stays off; the provider is asked for a new node."""
        rig.node("n1", 8, off=True, gpu_mem_gib=40, model="NVIDIA A100-PCIE-40GB")
        rig.app.power_manager.unplaced(rig.pending("t1", 1.0, gpu_mem_gib=60))
        rig.steps(1)
        assert rig.power("n1") == "off"
        assert [r["action"] for r in rig.requests()] == ["create"]

    def test_replica_avoiding_the_ready_node_wakes_another(self, rig: Rig) -> None:
        """A replica that must avoid its sibling's node counts that node as no room: an off node is woken."""
        rig.node("n1", 8)
        rig.node("n2", 8, off=True)
        rig.app.power_manager.unplaced(rig.pending("r1", 1.0, avoid=("n1",)))
        rig.steps(1)
        assert rig.power("n2") == "powering-on"

    def test_idle_node_a_pending_task_must_avoid_is_powered_down(self, rig: Rig) -> None:
        """A pending replica that may not use an idle node does not keep that node on."""
        rig.node("n1", 8)
        rig.pending("r1", 1.0, avoid=("n1",))
        rig.steps(3)
        assert rig.power("n1") == "off"


class TestScaleInWithPendingWork:
    def test_pending_task_that_fits_nowhere_blocks_no_power_down(self, rig: Rig) -> None:
        """A pending 16-GPU task fits on no 4-GPU node: both idle nodes are still powered off."""
        rig.node("n1", 4)
        rig.node("n2", 4)
        rig.pending("huge", 16.0)
        rig.steps(3)
        assert rig.power("n1") == "off" and rig.power("n2") == "off"
        assert sorted(r["node_id"] for r in rig.requests() if r["action"] == "power_off") == ["n1", "n2"]

    def test_pending_task_that_fits_keeps_the_nodes_it_could_use(self, rig: Rig) -> None:
        """A pending 2-GPU task fits the 4-GPU node (threshold 0.5) but not the 2-GPU one: only that one goes."""
        rig.node("n1", 4)
        rig.node("n2", 2)
        rig.pending("small", 2.0)
        rig.steps(3)
        assert rig.power("n1") == "ready" and rig.power("n2") == "off"


class TestProviderFailures:
    def test_failed_power_off_is_counted_and_the_node_stays_usable(self, failing_rig: Rig) -> None:
        """A command that exits 1 or hangs past its timeout is an event and counts in
        gptrm_adaptor_provider_failures_total; the node is left ready, connected and schedulable."""
        failing_rig.node("n1", 4)
        failing_rig.steps(3)
        assert [r["action"] for r in failing_rig.requests()] == ["power_off"]
        assert failing_rig.failures("power_off") == 1.0
        assert failing_rig.power("n1") == "ready"
        entry = failing_rig.app.registry.get("n1")
        assert "power-off failed" in entry.record.power_reason
        assert entry.connected and failing_rig.app.registry.schedulable(entry)
        reported = [e for e in failing_rig.app.events.recent(50) if e.kind == "power" and e.node_id == "n1"
                    and "node provider failed to power_off" in e.message]
        assert len(reported) == 1


class TestPowerOffIgnored:
    """The provider accepts power_off (exit 0) but the node's agent goes on streaming."""

    def test_reported_once_back_in_service_and_retried_after_a_doubling_backoff(self, rig: Rig) -> None:
        cfg = CoordinatorConfig()   # the rig's power-off settings are the defaults
        grace, retry = cfg.power_off_grace_s, cfg.power_off_retry_s
        rig.node("n1", 8)
        rig.streaming_on.add("n1")
        rig.steps(2)                 # idle, then draining → powering-off → accepted
        assert rig.power_offs() == 1 and rig.power("n1") == "powering-off"
        rig.clock.advance(grace / 2)
        rig.steps(3)                 # still shutting down as far as anyone knows: not off, not asked again
        assert rig.power_offs() == 1 and rig.power("n1") == "powering-off" and rig.ignored() == 0
        rig.clock.advance(grace / 2)
        rig.steps(1)
        entry = rig.app.registry.get("n1")
        assert rig.power("n1") == "ready" and rig.app.registry.schedulable(entry)
        assert rig.ignored() == 1
        reported = [e for e in rig.app.events.recent(50) if e.fields.get("outcome") == "power_off_ignored"]
        assert len(reported) == 1 and reported[0].node_id == "n1" and reported[0].kind == "power"
        assert "→ ready" in rig.app.events.recent(1)[0].message
        # idle and ready, but its power-off was ignored: not asked again before the backoff
        rig.steps(20)
        rig.clock.advance(retry - 5.0)
        rig.steps(2)
        assert rig.power_offs() == 1 and rig.power("n1") == "ready" and rig.ignored() == 1
        rig.clock.advance(5.0)
        rig.steps(3)
        assert rig.power_offs() == 2 and rig.power("n1") == "powering-off"
        # ignored again: reported again, and the wait doubles
        rig.clock.advance(grace)
        rig.steps(1)
        assert rig.power("n1") == "ready" and rig.ignored() == 2
        rig.clock.advance(2 * retry - 5.0)
        rig.steps(2)
        assert rig.power_offs() == 2
        rig.clock.advance(5.0)
        # this time the node goes down: off once silent, and the backoff is forgotten
        rig.streaming_on.discard("n1")
        rig.steps(3)
        assert rig.power_offs() == 3 and rig.power("n1") == "off"
        assert "n1" not in rig.app.power_manager._off_backoff and rig.ignored() == 2

    def test_a_node_that_falls_silent_is_off_never_before(self, rig: Rig) -> None:
        """Accepted while the agent still streams: powering-off, then off once the stream ends."""
        rig.node("n1", 8)
        rig.streaming_on.add("n1")
        rig.steps(2)
        assert rig.power("n1") == "powering-off"
        rig.streaming_on.discard("n1")
        rig.steps(1)                 # the step that sees it accepted ends its stream (the rig), the next: off
        rig.steps(1)
        assert rig.power("n1") == "off" and rig.ignored() == 0 and rig.power_offs() == 1
        assert not rig.app.registry.get("n1").connected
