"""Victim choice: strictly lower priority, preemptible, unprotected; smallest set, lowest priority, latest start."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, TaskState
from coordinator.allocator.reservations import NodeReservation, take_gpu
from coordinator.domain import ClusterSnapshot, GpuSlot, NodeSnapshot, Resources
from coordinator.events import EventBus
from coordinator.qos.preemption import Preemptor, _Fit, choose_victims, release_tasks

GIB = 1 << 30
NOW = 10_000.0
FITS = _Fit("max-utilization", 1.0)


def task(tid: str, priority: int, gpus: int, *, node: str = "", indices: tuple[int, ...] = (),
         state: TaskState = TaskState.RUNNING, started: float = 100.0, preemptible: bool | None = None,
         preempted_at: float | None = None, nodes: int = 1) -> types_pb2.Task:
    spec = types_pb2.TaskSpec(name=tid, priority=priority, nodes=nodes)
    if preemptible is not None:
        spec.preemptible = preemptible
    t = types_pb2.Task(id=tid, spec=spec, state=int(state), submit_unix_s=1.0,
                       demand=types_pb2.ResourceVector(gpus=gpus, gpu_mem_bytes=10 * GIB, cpu_cores=0.1))
    if preempted_at is not None:
        t.history.append(types_pb2.TaskStateChange(state=int(TaskState.PREEMPTED), time_unix_s=preempted_at))
    t.history.append(types_pb2.TaskStateChange(state=int(TaskState.RUNNING), time_unix_s=started))
    if node:
        t.allocation.nodes.append(types_pb2.NodeAllocation(
            node_id=node, gpu_indices=list(indices), gpu_share=1.0,
            demand=types_pb2.ResourceVector(gpus=gpus, gpu_mem_bytes=10 * GIB * len(indices), cpu_cores=0.1)))
    return t


def snapshot(nodes: dict[str, int], running: list[types_pb2.Task]) -> ClusterSnapshot:
    """Nodes of 80 GiB GPUs holding what ``running`` holds."""
    out = []
    for node_id, n in nodes.items():
        reservation = NodeReservation()
        slots = {i: GpuSlot(i, 80 * GIB, 80 * GIB, 1.0) for i in range(n)}
        for t in running:
            for na in t.allocation.nodes:
                if na.node_id != node_id:
                    continue
                d = na.demand
                reservation = reservation.add(node_id, Resources(gpus=d.gpus, gpu_mem_total_bytes=d.gpu_mem_bytes,
                                                                 cpu_cores=d.cpu_cores), na.gpu_indices, 1.0)
                for i in na.gpu_indices:
                    mem, share = take_gpu(slots[i].mem_free_bytes, slots[i].share_free, 10 * GIB, 1.0)
                    slots[i] = GpuSlot(i, 80 * GIB, int(mem), share)
        out.append(NodeSnapshot(node_id=node_id, capacity=Resources(gpus=n, gpu_mem_total_bytes=80 * GIB * n,
                                                                    cpu_cores=64, mem_bytes=512 * GIB,
                                                                    disk_bytes=1024 * GIB),
                                used=reservation.used, gpus=tuple(slots[i] for i in range(n))))
    return ClusterSnapshot(nodes=tuple(out), taken_at_s=NOW)


def choose(pending: types_pb2.Task, nodes: dict[str, int], running: list[types_pb2.Task],
           protection_s: float = 60.0) -> list[str] | None:
    victims = choose_victims(pending, snapshot(nodes, running), running, FITS, now=NOW, protection_s=protection_s)
    return None if victims is None else sorted(v.id for v in victims)


class TestVictimChoice:
    def test_lower_priority_work_is_preempted_to_fit(self) -> None:
        """Two priority-0 one-GPU tasks on a full 2-GPU node are both chosen for a priority-10 two-GPU task."""
        running = [task("a", 0, 1, node="n1", indices=(0,)), task("b", 0, 1, node="n1", indices=(1,))]
        assert choose(task("hi", 10, 2, state=TaskState.PENDING), {"n1": 2}, running) == ["a", "b"]

    def test_equal_priority_never_preempts(self) -> None:
        """Running tasks of the same priority as the pending one are never victims."""
        running = [task("a", 5, 1, node="n1", indices=(0,)), task("b", 5, 1, node="n1", indices=(1,))]
        assert choose(task("same", 5, 2, state=TaskState.PENDING), {"n1": 2}, running) is None

    def test_non_preemptible_never_chosen(self) -> None:
        """A task that opted out is not chosen, even when it alone would free enough; another node's is."""
        running = [task("keep", 0, 1, node="n1", indices=(0,), preemptible=False),
                   task("other", 0, 1, node="n2", indices=(0,), started=50.0)]
        assert choose(task("hi", 10, 1, state=TaskState.PENDING), {"n1": 1, "n2": 1}, running) == ["other"]
        assert choose(task("hi", 10, 1, state=TaskState.PENDING), {"n1": 1}, running[:1]) is None

    def test_protection_window_holds(self) -> None:
        """A task preempted less than the protection window ago is not chosen again; after it, it is."""
        recent = [task("a", 0, 1, node="n1", indices=(0,), preempted_at=NOW - 30.0)]
        assert choose(task("hi", 10, 1, state=TaskState.PENDING), {"n1": 1}, recent, protection_s=60.0) is None
        assert choose(task("hi", 10, 1, state=TaskState.PENDING), {"n1": 1}, recent, protection_s=20.0) == ["a"]

    def test_smallest_set_lowest_priority_then_latest_start(self) -> None:
        """One victim is enough: the lowest priority is chosen, and among equals the most recently started."""
        running = [task("p3", 3, 1, node="n1", indices=(0,)),
                   task("p1-old", 1, 1, node="n1", indices=(1,), started=10.0),
                   task("p1-new", 1, 1, node="n1", indices=(2,), started=90.0)]
        assert choose(task("hi", 10, 1, state=TaskState.PENDING), {"n1": 3}, running) == ["p1-new"]

    def test_already_fits_needs_no_victims(self) -> None:
        """A task that fits (for instance on GPUs PREEMPTED tasks are giving back) preempts nothing."""
        held = task("a", 0, 1, node="n1", indices=(0,), state=TaskState.PREEMPTED)
        freed = release_tasks(snapshot({"n1": 1}, [held]), [held])
        assert choose_victims(task("hi", 10, 1, state=TaskState.PENDING), freed, [held], FITS, now=NOW,
                              protection_s=0.0) == []

    def test_gang_uses_fewest_nodes_with_victims(self) -> None:
        """A two-node gang takes the free node and preempts on one more, not on two."""
        running = [task("a", 0, 1, node="n1", indices=(0,)), task("b", 0, 1, node="n2", indices=(0,))]
        gang = task("gang", 10, 1, state=TaskState.PENDING, nodes=2)
        assert choose(gang, {"n1": 1, "n2": 1, "n3": 1}, running) in (["a"], ["b"])


class _Table:
    """The reads of the task table the hold-back makes."""

    def __init__(self, *tasks: types_pb2.Task) -> None:
        self._by_id = {t.id: t for t in tasks}

    def values(self) -> list[types_pb2.Task]:
        return list(self._by_id.values())

    def live(self) -> list[types_pb2.Task]:
        return [t for t in self._by_id.values() if t.state not in TERMINAL_STATES]

    def find(self, task_id: str) -> types_pb2.Task | None:
        return self._by_id.get(task_id)

    def count_in(self, state: TaskState) -> int:
        return sum(1 for t in self._by_id.values() if t.state == state)


class TestHoldBack:
    def test_lower_priority_waits_while_victims_stop(self) -> None:
        """While a task is PREEMPTED, pending tasks below the highest pending priority wait; afterwards all go."""
        stopping = task("v1", 0, 1, node="n1", indices=(0,), state=TaskState.PREEMPTED)
        back = task("v2", 0, 1, state=TaskState.PENDING)
        urgent = task("hi", 10, 2, state=TaskState.PENDING)
        table = _Table(stopping, back, urgent)
        counter = Counter("p_total", "p", registry=CollectorRegistry())
        preemptor = Preemptor(table, None, None, None, EventBus(), counter, now=lambda: NOW)  # type: ignore[arg-type]
        assert [t.id for t in preemptor.schedulable([back, urgent])] == ["hi"]
        table._by_id["v1"] = task("v1", 0, 1, state=TaskState.PENDING)
        assert [t.id for t in preemptor.schedulable([back, urgent])] == ["v2", "hi"]


class TestOnePreemptionPerPass:
    """choose_preemption: the decision the leader's Preemptor and the simulator's preemption both make."""

    def test_the_first_waiting_task_in_queue_order_is_helped(self) -> None:
        """Of two waiting tasks of one priority, the one with the least slack (deadline − expected run time) gets
        the victims, whatever its deadline; lower-priority waiting work gets none."""
        from dataclasses import replace

        from coordinator.qos import preemption
        from coordinator.scheduler.queue import request_for
        from coordinator.simulator import qos as sim_qos

        assert sim_qos.choose_preemption is preemption.choose_preemption
        running = [task("a", 0, 2, node="n1", indices=(0, 1))]
        early = replace(request_for(task("early", 5, 2, state=TaskState.PENDING)), deadline_s=NOW + 100,
                        expected_run_s=10.0)
        long_job = replace(request_for(task("long", 5, 2, state=TaskState.PENDING)), deadline_s=NOW + 500,
                           expected_run_s=450.0)
        low = request_for(task("low", 0, 2, state=TaskState.PENDING))
        chosen = preemption.choose_preemption([low, early, long_job], [preemption.candidate(t) for t in running],
                                              lambda: snapshot({"n1": 2}, running), FITS, now=NOW, protection_s=60.0)
        assert chosen is not None and chosen[0].task_id == "long" and [c.id for c in chosen[1]] == ["a"]
        assert preemption.choose_preemption([low], [preemption.candidate(t) for t in running],
                                            lambda: snapshot({"n1": 2}, running), FITS, now=NOW,
                                            protection_s=60.0) is None
