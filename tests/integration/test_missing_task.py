"""A task its agent no longer runs is reconciled, not left RUNNING: real components from ``coordinator.app.build``
on the test session's etcd; the agent's side is played through the reconciler's inputs."""

from __future__ import annotations

import asyncio

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TaskState
from coordinator.app import App
from coordinator.etcd_embedded import EtcdCluster
from coordinator.monitor.nodes import NodeEntry
from tests.helpers.inproc import inventory, one_gpu_spec, run_leading, until


async def _running(app: App) -> tuple[NodeEntry, types_pb2.Task]:
    entry = await app.nodes.connected(agent_pb2.Register(inventory=inventory("n1")), asyncio.Queue())
    task = await app.tasks.submit(one_gpu_spec("t"), "r-1")
    await until(lambda: app.tasks.get(task.id).state == TaskState.SCHEDULED)
    await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(task_id=task.id, state=int(TaskState.RUNNING)))
    assert app.tasks.get(task.id).state == TaskState.RUNNING
    return entry, app.tasks.get(task.id)


class TestUnknownTaskAck:
    def test_cancel_refused_as_unknown_ends_cancelled_and_frees_the_gpu(self, etcd_server: EtcdCluster,
                                                                       etcd_prefix: str) -> None:
        """A cancel whose stop the agent refuses because it runs no such task ends CANCELLED, GPUs released."""

        async def scenario(app: App) -> None:
            entry, task = await _running(app)
            await app.tasks.cancel(task.id)
            assert app.tasks.get(task.id).state == TaskState.RUNNING   # waiting for the agent
            await app.reconciler.on_decision_ack(entry, agent_pb2.DecisionAck(
                ok=False, task_id=task.id, task_unknown=True, reason=f"task {task.id!r} is not running on this node"))
            assert app.tasks.get(task.id).state == TaskState.CANCELLED
            assert not entry.task_ids and not entry.reservation.gpu_indices   # its GPU is free again

        asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario))

    def test_other_refusals_leave_the_task_alone(self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """A refusal that does not say the task is unknown (the process may still run) changes nothing; an unknown
        task on another node's ack changes nothing either."""

        async def scenario(app: App) -> None:
            entry, task = await _running(app)
            await app.reconciler.on_decision_ack(entry, agent_pb2.DecisionAck(ok=False, task_id=task.id,
                                                                               reason="signal failed"))
            other = await app.nodes.connected(agent_pb2.Register(inventory=inventory("n2")), asyncio.Queue())
            await app.reconciler.on_decision_ack(other, agent_pb2.DecisionAck(ok=False, task_id=task.id,
                                                                               task_unknown=True))
            assert app.tasks.get(task.id).state == TaskState.RUNNING

        asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario))


class TestLateEndOfAnEarlierRun:
    def test_a_late_end_of_the_run_before_does_not_end_the_run_just_placed(self, etcd_server: EtcdCluster,
                                                                          etcd_prefix: str) -> None:
        """Preempted, requeued and placed again on the same node: the earlier run's end, delivered again after a
        reconnect, names that run's start decision and leaves the new placement alone; the new run's reports
        apply."""

        async def scenario(app: App) -> None:
            entry, task = await _running(app)
            first = f"{task.allocation.decision_id}/n1"
            await app.tasks.transition(task.id, TaskState.PREEMPTED, "preempted for a test", preemptions=1)
            ended = agent_pb2.TaskStatus(task_id=task.id, state=int(TaskState.CANCELLED), decision_id=first,
                                         exit_code=0, has_exit_code=True)
            await app.reconciler.on_task_status(entry, ended)   # the preempted run ended: back in the queue
            await until(lambda: app.tasks.get(task.id).state == TaskState.SCHEDULED)
            placed = app.tasks.get(task.id).allocation.decision_id
            assert placed and not first.startswith(placed + "/")
            await app.reconciler.on_task_status(entry, ended)   # the same end, delivered again
            assert app.tasks.get(task.id).state == TaskState.SCHEDULED
            await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(
                task_id=task.id, state=int(TaskState.RUNNING), decision_id=f"{placed}/n1"))
            assert app.tasks.get(task.id).state == TaskState.RUNNING

        asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario))

    def test_a_late_refusal_of_the_earlier_runs_stop_does_not_fail_the_run_just_placed(
            self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """The stop sent for the preempted run, refused late as unknown, leaves the new placement alone; a refusal of
        the new placement's own start still fails it."""

        async def scenario(app: App) -> None:
            entry, task = await _running(app)
            await app.tasks.transition(task.id, TaskState.PREEMPTED, "preempted for a test", preemptions=1)
            await app.reconciler.on_task_status(entry, agent_pb2.TaskStatus(
                task_id=task.id, state=int(TaskState.CANCELLED), decision_id=f"{task.allocation.decision_id}/n1"))
            await until(lambda: app.tasks.get(task.id).state == TaskState.SCHEDULED)
            await app.reconciler.on_decision_ack(entry, agent_pb2.DecisionAck(
                decision_id=f"stop-{task.id}-abc123", ok=False, task_id=task.id, task_unknown=True,
                reason=f"task {task.id!r} is not running on this node"))
            assert app.tasks.get(task.id).state == TaskState.SCHEDULED
            placed = app.tasks.get(task.id).allocation.decision_id
            await app.reconciler.on_decision_ack(entry, agent_pb2.DecisionAck(
                decision_id=f"{placed}/n1", ok=False, task_id=task.id, reason="no such GPU"))
            assert app.tasks.get(task.id).state != TaskState.SCHEDULED   # the start itself was refused

        asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario))


class TestStartRefusedForRoom:
    def test_a_start_refused_for_want_of_room_is_placed_again_not_failed(self, etcd_server: EtcdCluster,
                                                                         etcd_prefix: str) -> None:
        """The agent refuses a start with no_room (no free task uid): the task goes back to PENDING, its reason
        saying why, not counted as a restart even with restart policy "never", and is placed again."""

        async def scenario(app: App) -> None:
            entry = await app.nodes.connected(agent_pb2.Register(inventory=inventory("n1")), asyncio.Queue())
            spec = one_gpu_spec("t")
            spec.restart_policy = types_pb2.RESTART_POLICY_NEVER
            task = await app.tasks.submit(spec, "r-1")
            await until(lambda: app.tasks.get(task.id).state == TaskState.SCHEDULED)
            placed = app.tasks.get(task.id).allocation.decision_id
            await app.reconciler.on_decision_ack(entry, agent_pb2.DecisionAck(
                decision_id=f"{placed}/n1", ok=False, task_id=task.id, no_room=True,
                reason="no free task uid: all 2 uids of --task-uids 5000-5001 are in use"))
            again = app.tasks.get(task.id)
            assert again.state == TaskState.PENDING and again.restarts == 0, again
            assert "no free task uid" in again.reason and "placing it again" in again.reason
            assert not entry.reservation.gpu_indices   # what it held is free
            await until(lambda: app.tasks.get(task.id).state == TaskState.SCHEDULED, timeout_s=15.0)
            assert app.tasks.get(task.id).allocation.decision_id != placed

        asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, scenario))
