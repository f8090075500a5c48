"""The GPU power capping loop's decisions (coordinator/adaptor/capping.py), on a fake clock."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from prometheus_client import CollectorRegistry, Counter

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TaskState
from coordinator.adaptor.capping import PowerCapper
from coordinator.dispatch.dispatcher import Dispatcher
from coordinator.events import EventBus
from coordinator.monitor.nodes import NodeRegistry
from coordinator.qos.watch import Pressure
from tests.helpers.clock import FakeClock

MIN_W, MAX_W = 200.0, 700.0
STEP_W = 0.1 * (MAX_W - MIN_W)
INTERVAL_S = 30.0


class Qos:
    """The QoS Manager's signals, as the test sets them."""

    def __init__(self) -> None:
        self.pressures: dict[str, Pressure] = {}
        self.active: dict[str, dict[str, str]] = {}

    def pressure(self, task_id: str) -> Pressure | None:
        return self.pressures.get(task_id)

    def violations(self, task_id: str) -> dict[str, str]:
        return self.active.get(task_id, {})


class Rig:
    """One node with two GPUs, its telemetry, tasks and the capper; ``limit`` tracks what the agent applied."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.registry = NodeRegistry(1.0, 10.0, now=self.clock)
        self.outbox: asyncio.Queue[agent_pb2.CoordinatorMessage] = asyncio.Queue()
        inv = types_pb2.NodeInventory(node_id="n1", gpus=[
            types_pb2.GpuInfo(index=i, power_limit_w=MAX_W, power_min_w=MIN_W, power_max_w=MAX_W,
                              power_default_w=MAX_W) for i in range(2)])
        self.registry.connect(inv, outbox=self.outbox)
        self.limit = {0: MAX_W, 1: MAX_W}
        self.util = {0: 0.0, 1: 0.0}
        self.mem = {0: 0.0, 1: 0.0}
        self.tasks: dict[str, types_pb2.Task] = {}
        self.qos = Qos()
        self.events = EventBus()
        self.metrics = CollectorRegistry()
        self.changes = Counter("gptrm_adaptor_power_cap_changes_total", "", ["direction"], registry=self.metrics)
        self.capper = PowerCapper(self.registry, self.sample, lambda: self.tasks, self.qos,
                                  Dispatcher(self.registry, epoch=lambda: 1), self.events, self.changes,
                                  interval_s=INTERVAL_S, now=self.clock)

    def sample(self, node_id: str) -> types_pb2.TelemetrySample | None:
        return types_pb2.TelemetrySample(gpus=[
            types_pb2.GpuSample(index=i, util_gpu=self.util[i], util_mem=self.mem[i], power_limit_w=self.limit[i],
                                healthy=True) for i in range(2)])

    def step(self) -> list[float]:
        """One pass; the agent applies what it was sent. Returns GPU 0's limits sent."""
        self.capper.step()
        sent = []
        while not self.outbox.empty():
            d = self.outbox.get_nowait().decision.set_power_limit
            self.limit[d.gpu_index] = d.power_limit_w
            if d.gpu_index == 0:
                sent.append(d.power_limit_w)
        return sent

    def run_task(self, task_id: str, gpu: int, **spec: object) -> types_pb2.Task:
        task = types_pb2.Task(id=task_id, state=int(TaskState.RUNNING), spec=types_pb2.TaskSpec(**spec))
        task.allocation.nodes.add(node_id="n1", gpu_indices=[gpu])
        self.tasks[task_id] = task
        return task

    def count(self, direction: str) -> float:
        return self.metrics.get_sample_value("gptrm_adaptor_power_cap_changes_total", {"direction": direction}) or 0


@pytest.fixture
def rig() -> Rig:
    return Rig()


class TestStepDown:
    def test_idle_gpu_steps_down_to_its_minimum_and_no_further(self, rig: Rig) -> None:
        """An idle GPU loses a tenth of its range per allowed step and stops at its minimum."""
        seen: list[float] = []
        for _ in range(20):
            seen += rig.step()
            rig.clock.advance(INTERVAL_S)
        assert seen[0] == MAX_W - STEP_W and seen[-1] == MIN_W
        assert all(b < a for a, b in itertools.pairwise(seen))
        assert all(MIN_W <= w <= MAX_W for w in seen) and rig.limit[0] == MIN_W
        assert rig.count("down") == 2 * len(seen)

    def test_memory_bound_gpu_steps_down(self, rig: Rig) -> None:
        """A GPU busy on memory bandwidth with low SM use is capped though a task runs on it."""
        rig.run_task("t1", 0)
        rig.util[0], rig.mem[0] = 0.4, 0.9
        assert rig.step() == [MAX_W - STEP_W]

    def test_compute_bound_gpu_is_left_at_full_power(self, rig: Rig) -> None:
        """A GPU whose SMs are busy gains from its power: no change."""
        rig.run_task("t1", 0)
        rig.util[0], rig.mem[0] = 0.95, 0.3
        assert rig.step() == []

    def test_every_change_is_an_event_with_watts_before_and_after(self, rig: Rig) -> None:
        """The event names the GPU and carries both limits."""
        rig.step()
        event = next(e for e in rig.events.recent(10) if e.fields.get("gpu_index") == "0")
        assert event.kind == "power" and event.node_id == "n1"
        assert float(event.fields["before_w"]) == MAX_W and float(event.fields["after_w"]) == MAX_W - STEP_W


class TestQos:
    def test_pressure_restores_full_power_at_once(self, rig: Rig) -> None:
        """A capped GPU goes back to its maximum as soon as its task is under QoS pressure, rate limit or not."""
        rig.run_task("t1", 0)
        rig.util[0] = 0.1
        for _ in range(3):
            rig.clock.advance(INTERVAL_S)
            rig.step()
        assert rig.limit[0] == MAX_W - 3 * STEP_W
        rig.qos.pressures["t1"] = Pressure.MORE
        assert rig.step() == [MAX_W]
        assert rig.count("up") == 1

    def test_active_violation_counts_as_pressure(self, rig: Rig) -> None:
        """A task with an active deadline violation is restored and never capped."""
        rig.run_task("t1", 0)
        rig.util[0] = 0.1
        rig.step()
        rig.qos.active["t1"] = {"deadline": "at-risk"}
        rig.clock.advance(INTERVAL_S)
        assert rig.step() == [MAX_W]
        rig.clock.advance(INTERVAL_S)
        assert rig.step() == []

    def test_task_under_pressure_is_never_capped(self, rig: Rig) -> None:
        """An under-utilized GPU whose task is under pressure keeps its full limit."""
        rig.run_task("t1", 0)
        rig.util[0] = 0.1
        rig.qos.pressures["t1"] = Pressure.MORE
        assert rig.step() == []
        rig.qos.pressures["t1"] = Pressure.STEADY
        rig.clock.advance(INTERVAL_S)
        assert rig.step() == []
        rig.qos.pressures["t1"] = Pressure.LESS
        assert rig.step() == [MAX_W - STEP_W]

    def test_full_power_task_restores_and_holds(self, rig: Rig) -> None:
        """A task asking for full power gets its GPU's maximum back and keeps it."""
        for _ in range(2):
            rig.step()
            rig.clock.advance(INTERVAL_S)
        assert rig.limit[0] < MAX_W
        rig.run_task("t1", 0, full_power=True)
        assert rig.step() == [MAX_W]
        rig.clock.advance(INTERVAL_S)
        assert rig.step() == []


class TestRateLimit:
    def test_no_second_lowering_within_the_interval(self, rig: Rig) -> None:
        """After a change the GPU is not lowered again until the interval has passed."""
        assert rig.step() == [MAX_W - STEP_W]
        rig.clock.advance(INTERVAL_S - 1)
        assert rig.step() == []
        rig.clock.advance(1)
        assert rig.step() == [MAX_W - 2 * STEP_W]

    def test_stale_telemetry_does_not_repeat_a_change(self, rig: Rig) -> None:
        """Until telemetry shows the new limit, the limit sent counts: no duplicate decision."""
        rig.capper.step()
        rig.outbox.get_nowait()
        rig.outbox.get_nowait()   # the agent has not applied either yet
        rig.clock.advance(1)
        rig.capper.step()
        assert rig.outbox.empty()

    def test_gpu_without_a_range_is_left_alone(self, rig: Rig) -> None:
        """A GPU whose inventory reports no power range is never changed."""
        entry = rig.registry.get("n1")
        for gpu in entry.inventory.gpus:
            gpu.power_min_w = gpu.power_max_w = 0.0
        assert rig.step() == [] and rig.outbox.empty()


class TestFullPowerFlag:
    def test_submit_full_power_sets_the_spec_field(self) -> None:
        """gptrmctl submit --full-power marks the spec; without it the field stays unset."""
        from coordinator.ctl.main import build_parser
        from coordinator.ctl.spec import spec_from_args

        def spec(*argv: str) -> types_pb2.TaskSpec:
            return spec_from_args(build_parser().parse_args(["submit", "--gpus", "1", *argv, "--", "serve"]))

        assert spec("--full-power").full_power and not spec().full_power


class TestLoop:
    def test_a_failing_pass_does_not_end_the_loop(self, rig: Rig) -> None:
        """A pass that raises (a bad reading) is logged and the next pass still runs and caps."""
        calls = {"n": 0}
        sample = rig.sample

        def flaky(node_id: str) -> types_pb2.TelemetrySample | None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise ValueError("garbage reading")
            return sample(node_id)

        rig.capper._latest = flaky   # the telemetry source the capper was built with
        rig.capper._period_s = 0.01

        async def scenario() -> None:
            task = asyncio.create_task(rig.capper.run())
            for _ in range(200):
                await asyncio.sleep(0.01)
                if not rig.outbox.empty():
                    break
            task.cancel()

        asyncio.run(scenario())
        assert calls["n"] >= 2 and not rig.outbox.empty()
