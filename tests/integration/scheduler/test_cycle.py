"""The leader's scheduling cycle (coordinator/scheduler/cycle.py): cycles that cannot change anything are
skipped, and the cycle's snapshot matches one built from scratch. The components are the real ones,
built by ``coordinator.app.build`` on the test session's etcd."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from common.pb.gptrm.v1 import types_pb2
from common.topology import simulated_topology, topology_from_gpus
from common.types import TERMINAL_STATES, TaskState
from coordinator.app import App, build
from coordinator.config import CoordinatorConfig
from coordinator.domain import GpuSlot, NodeSnapshot, Resources
from coordinator.etcd_embedded import EtcdCluster
from coordinator.scheduler import cycle as cycle_module
from coordinator.sync import connect

GIB = 1024**3


def inventory(node_id: str, gpus: int) -> types_pb2.NodeInventory:
    """A node with ``gpus`` 80 GiB GPUs and plenty of host resources."""
    return types_pb2.NodeInventory(
        node_id=node_id, cpu_cores=64, mem_total_bytes=512 * GIB, disk_total_bytes=2000 * GIB,
        gpus=[types_pb2.GpuInfo(index=i, model="NVIDIA H100 80GB HBM3", mem_total_bytes=80 * GIB)
              for i in range(gpus)],
    )


def pending(task_id: str, gpus: float) -> types_pb2.Task:
    """A PENDING task with an explicit demand."""
    return types_pb2.Task(
        id=task_id, state=int(TaskState.PENDING), revision=1, submit_unix_s=1.0,
        spec=types_pb2.TaskSpec(name=task_id, argv=["true"]),
        demand=types_pb2.ResourceVector(gpus=gpus, gpu_mem_bytes=10 * GIB, cpu_cores=1.0, mem_bytes=GIB),
    )


Setup = tuple[App, list[int]]


@pytest.fixture
def setup(etcd_server: EtcdCluster, etcd_prefix: str) -> Iterator[Setup]:
    """A replica with one READY 4-GPU node and one task that needs 8 GPUs (it waits)."""
    client = connect(etcd_server.endpoints, 2.0)
    app = build(CoordinatorConfig(etcd_prefix=etcd_prefix, policy="max-utilization", threshold=0.9), client)
    app.registry.connect(inventory("n1", 4), outbox=None)
    app.state.apply_task(pending("t1", 8.0))
    snapshots: list[int] = []
    original = app.snapshots.snapshot

    def counting(*args: object, **kwargs: object) -> object:
        snapshots.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    app.snapshots.snapshot = counting  # type: ignore[method-assign]
    yield app, snapshots
    client.close()


def cordon(app: App, node_id: str) -> None:
    """The node record as etcd would store it after ``gptrmctl cordon``."""
    entry = app.registry.get(node_id)
    assert entry is not None
    record = types_pb2.NodeRecord()
    record.CopyFrom(entry.record)
    record.cordoned = True
    app.state.apply_node(record)


def run(app: App) -> int:
    """One cycle, to completion."""
    return asyncio.run(app.cycle.cycle())


class TestClock:
    def test_the_cycle_decides_at_its_clocks_time(self, setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
        """The cycle reads the clock it was given, not the wall clock: a task held back until a time far ahead of
        the wall clock is planned (and refused, with its reason) once that clock is past it."""
        app, _ = setup
        held = pending("t2", 6.0)
        held.not_before_unix_s = 4e9
        app.state.apply_task(held)
        run(app)
        assert app.tasks.tasks["t2"].reason == ""
        monkeypatch.setattr(app.cycle, "_clock", lambda: 5e9)
        run(app)
        assert "gpus" in app.tasks.tasks["t2"].reason


class TestIdleCycles:
    def test_unchanged_inputs_skip_the_cycle(self, setup: Setup) -> None:
        """A second cycle over the same tasks and nodes builds no snapshot and decides nothing."""
        app, snapshots = setup
        assert run(app) == 0 and len(snapshots) == 1
        assert "gpus" in app.tasks.tasks["t1"].reason
        assert run(app) == 0 and len(snapshots) == 1
        assert app.cycle.skipped == 1 and app.cycle.cycles == 1

    @pytest.mark.parametrize("change", ["new task", "task revision", "node cordoned", "node reconnected",
                                        "reservation", "threshold", "policy"])
    def test_any_input_change_runs_the_cycle(self, setup: Setup, change: str) -> None:
        """Each input the decisions depend on makes the next cycle run again."""
        app, snapshots = setup
        run(app)
        if change == "new task":
            app.state.apply_task(pending("t2", 6.0))
        elif change == "task revision":
            changed = types_pb2.Task()
            changed.CopyFrom(app.tasks.tasks["t1"])
            changed.revision = 2
            app.state.apply_task(changed)
        elif change == "node cordoned":
            cordon(app, "n1")
        elif change == "node reconnected":
            app.registry.connect(inventory("n1", 4), outbox=None)
        elif change == "reservation":
            app.state.hold("other", [types_pb2.NodeAllocation(node_id="n1", demand=types_pb2.ResourceVector(
                cpu_cores=2.0))])
        elif change == "threshold":
            app.policy.current = types_pb2.Policy(name="max-utilization", threshold=0.8)
        else:
            app.policy.current = types_pb2.Policy(name="power-efficient", threshold=0.9)
        assert run(app) == 0
        assert len(snapshots) == 2 and app.cycle.skipped == 0

    def test_forced_cycle_after_a_while(self, setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
        """Even with nothing changed, a cycle runs once the forced interval has passed."""
        app, snapshots = setup
        run(app)
        monkeypatch.setattr(cycle_module, "FORCED_CYCLE_S", 0.0)
        run(app)
        assert len(snapshots) == 2 and app.cycle.skipped == 0

    def test_finished_tasks_do_not_count(self, setup: Setup) -> None:
        """A task that had already finished changing again (say, its reason) does not wake the cycle."""
        app, snapshots = setup
        done = pending("old", 1.0)
        done.state = int(TaskState.SUCCEEDED)
        app.state.apply_task(done)
        run(app)
        changed = types_pb2.Task()
        changed.CopyFrom(done)
        changed.revision = 7
        app.state.apply_task(changed)
        run(app)
        assert len(snapshots) == 1 and app.cycle.skipped == 1


class TestWaitingQueue:
    def test_a_waiting_tasks_view_is_built_once(self, setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
        """A task that keeps waiting, for the same reason, has its placement request built once, not in every
        cycle; a new record of it (its first reason noted, a new revision) or a new expected run time builds it
        anew."""
        app, _ = setup
        built: list[str] = []
        original = cycle_module.request_for

        def counting(task: types_pb2.Task, run_s: float | None = None) -> object:
            built.append(task.id)
            return original(task, run_s)

        monkeypatch.setattr(cycle_module, "request_for", counting)

        def cycle_after(change: types_pb2.Task) -> list[str]:
            built.clear()
            app.state.apply_task(change)   # a change: the cycle runs
            run(app)
            return sorted(built)

        run(app)
        # A task's record is replaced once its first reason is noted: its request is built once more, then kept.
        assert cycle_after(pending("t2", 6.0)) == ["t1", "t2"]
        assert cycle_after(pending("t3", 6.0)) == ["t2", "t3"]
        assert cycle_after(pending("t4", 6.0)) == ["t3", "t4"] and app.cycle.cycles == 4
        changed = types_pb2.Task()
        changed.CopyFrom(app.tasks.tasks["t1"])
        changed.revision = 2
        assert cycle_after(changed) == ["t1", "t4"]
        app.profiler.observe_run(changed.spec, 30.0)   # t1's name now runs 30 s
        assert cycle_after(pending("t5", 6.0)) == ["t1", "t5"]

    def test_a_task_refused_like_one_ahead_keeps_its_record(self, setup: Setup) -> None:
        """The reason of a task refused because one ahead of it, needing no more, was refused names no task: when
        another task is the first refused, the waiting task's reason, and so its record, stay as they were."""
        app, _ = setup
        app.state.apply_task(pending("t2", 8.0))
        run(app)
        behind = app.tasks.tasks["t2"]
        assert "needing no more, was refused" in behind.reason
        first = pending("t0", 8.0)
        first.submit_unix_s = 0.5   # ahead of both in the queue
        app.state.apply_task(first)
        run(app)
        assert app.tasks.tasks["t2"] is behind and app.cycle.cycles == 2

    def test_a_cycle_that_left_tasks_waiting_pauses_the_next(self, setup: Setup) -> None:
        """After a cycle that could not place everything, the next waits in proportion to the cycle's own work
        (at most a second); the leader's loop goes on meanwhile."""
        app, _ = setup
        paused: list[float] = []

        async def pause(seconds: float) -> None:
            paused.append(seconds)

        app.cycle._pause = pause

        async def two_cycles() -> None:
            runner = asyncio.create_task(app.cycle.run())
            while app.cycle.cycles < 1:
                await asyncio.sleep(0.01)
            runner.cancel()

        asyncio.run(two_cycles())
        assert len(paused) == 1 and 0 < paused[0] <= 1.0


def reference_snapshot(app: App) -> tuple[NodeSnapshot, ...]:
    """The snapshot built from scratch, node by node, from the registry and the unfinished tasks."""
    nodes = []
    for e in sorted(app.registry, key=lambda e: e.node_id):
        if not app.registry.schedulable(e):
            continue
        inv, r = e.inventory, e.reserved
        mem: dict[int, int] = {}
        share: dict[int, float] = {}
        for task in app.tasks.tasks.values():
            if task.state in TERMINAL_STATES:
                continue
            for na in task.allocation.nodes:
                if na.node_id == e.node_id:
                    for i in na.gpu_indices:
                        mem[i] = mem.get(i, 0) + na.demand.gpu_mem_bytes // max(1, len(na.gpu_indices))
                        share[i] = share.get(i, 0.0) + (na.gpu_share or 1.0)
        model = inv.gpus[0].model if inv.gpus else ""
        nodes.append(NodeSnapshot(
            node_id=e.node_id,
            capacity=Resources(float(len(inv.gpus)), sum(g.mem_total_bytes for g in inv.gpus), float(inv.cpu_cores),
                               inv.mem_total_bytes, inv.disk_total_bytes),
            used=Resources(r.gpus, r.gpu_mem_bytes, r.cpu_cores, r.mem_bytes, r.disk_bytes),
            gpus=tuple(GpuSlot(g.index, g.mem_total_bytes, max(0, g.mem_total_bytes - mem.get(g.index, 0)),
                               max(0.0, 1.0 - share.get(g.index, 0.0)), g.topology_group) for g in inv.gpus),
            gpu_model=model, labels=dict(inv.labels), topology=topology_from_gpus(inv.gpus),
            power=app.power.curve(e.node_id, model, len(inv.gpus), inv.gpus[0].mem_total_bytes if inv.gpus else 0),
        ))
    return tuple(nodes)


def running(task_id: str, node_id: str, gpu_indices: list[int], share: float = 1.0) -> types_pb2.Task:
    """A RUNNING task holding GPUs on one node."""
    task = pending(task_id, float(len(gpu_indices)))
    task.state = int(TaskState.RUNNING)
    task.allocation.nodes.add(node_id=node_id, gpu_indices=gpu_indices, gpu_share=share,
                              demand=types_pb2.ResourceVector(gpu_mem_bytes=20 * GIB * len(gpu_indices)))
    return task


class TestSnapshot:
    def test_matches_a_build_from_scratch_through_changes(self, setup: Setup) -> None:
        """Cached inventory parts and idle GPU tuples never hide a change: allocations, finished
        tasks, a re-registration with a different inventory, cordoning."""
        app, _ = setup
        grouped = inventory("n2", 4)
        for k, g in enumerate(grouped.gpus):
            g.topology_group = k // 2   # two PCIe switches: groups 0 and 1
        grouped.labels["zone"] = "a"
        app.registry.connect(grouped, outbox=None)
        app.registry.connect(types_pb2.NodeInventory(node_id="cpu-only", cpu_cores=32, mem_total_bytes=64 * GIB),
                              outbox=None)

        def check() -> None:
            assert app.snapshots.snapshot(app.tasks.tasks.values(), app.registry).nodes == reference_snapshot(app)

        check()
        app.state.apply_placement(running("r1", "n2", [0, 1]))
        app.state.apply_placement(running("r2", "n2", [2], share=0.25))
        check()
        finished = types_pb2.Task()
        finished.CopyFrom(app.tasks.tasks["r1"])
        finished.state = int(TaskState.SUCCEEDED)
        app.state.apply_task(finished)
        check()
        bigger = inventory("n1", 8)
        bigger.labels["zone"] = "b"
        app.registry.connect(bigger, outbox=None)
        check()
        cordon(app, "n2")
        check()
        nodes = app.snapshots.snapshot(app.tasks.tasks.values(), app.registry).nodes
        assert [n.node_id for n in nodes] == ["cpu-only", "n1"]

    def test_unchanged_nodes_keep_their_objects(self, setup: Setup) -> None:
        """A node none of whose inputs changed is the last snapshot's object (the kept placement state
        finds the changed nodes by that); a node with a new allocation is a new object."""
        app, _ = setup
        app.registry.connect(inventory("n2", 4), outbox=None)

        def nodes() -> dict[str, NodeSnapshot]:
            return {n.node_id: n for n in app.snapshots.snapshot(app.tasks.tasks.values(), app.registry).nodes}

        first = nodes()
        again = nodes()
        assert all(again[k] is first[k] for k in first)
        app.state.apply_placement(running("r1", "n2", [0]))
        third = nodes()
        assert third["n1"] is first["n1"] and third["n2"] is not first["n2"]
        assert tuple(third.values()) == reference_snapshot(app)

    def test_gpu_topology_built_once_per_registration(self, setup: Setup) -> None:
        """A node's GPU topology is derived when it registers and shared by every snapshot until it
        registers again; the snapshot still matches a build from scratch."""
        app, _ = setup

        def linked(name: str) -> types_pb2.NodeInventory:
            inv = inventory("n3", 8)
            for g, facts in zip(inv.gpus, simulated_topology(name, 8, range(16)), strict=True):
                g.numa_node_plus_one = facts.numa_node + 1
                g.cpu_affinity.extend(facts.cpu_affinity)
                g.links.extend(types_pb2.GpuLink(peer_index=p, level=level, nvlinks=n) for p, level, n in facts.links)
            return inv

        def node() -> NodeSnapshot:
            return {n.node_id: n for n in app.snapshots.snapshot(app.tasks.tasks.values(), app.registry).nodes}["n3"]

        app.registry.connect(linked("pcie-nvlink-pairs"), outbox=None)
        first = node()
        assert first.topology is not None and first.topology.islands(0) == [(0, 1), (2, 3), (4, 5), (6, 7)]
        assert node().topology is first.topology
        assert app.snapshots.snapshot(app.tasks.tasks.values(), app.registry).nodes == reference_snapshot(app)
        app.registry.connect(linked("hgx"), outbox=None)
        assert node().topology is not None and node().topology.islands(0) == [(0, 1, 2, 3), (4, 5, 6, 7)]

    def test_topology_group_zero_is_a_group(self, setup: Setup) -> None:
        """GPUs in topology group 0 keep it (only -1 means unknown), so the allocator can keep a task in it."""
        app, _ = setup
        grouped = inventory("n2", 4)
        for k, g in enumerate(grouped.gpus):
            g.topology_group = k // 2
        app.registry.connect(grouped, outbox=None)
        node = {n.node_id: n for n in app.snapshots.snapshot(app.tasks.tasks.values(), app.registry).nodes}["n2"]
        assert [g.topology_group for g in node.gpus] == [0, 0, 1, 1]
