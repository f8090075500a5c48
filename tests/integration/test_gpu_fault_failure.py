"""A task whose program dies of a GPU fault before its move reached it is requeued as a move, not a restart:
real components from ``coordinator.app.build`` on the test session's etcd, the agent's side played by the
reconciler's inputs (a real agent's simulated faults never kill the task: tests/integration/test_gpu_health.py)."""

from __future__ import annotations

import asyncio

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.pbenum import pb_enum
from common.types import TaskState
from coordinator.app import App
from coordinator.etcd_embedded import EtcdCluster
from tests.helpers.inproc import inventory, one_gpu_spec, run_leading, until


def _report(task_id: str, state: TaskState) -> agent_pb2.TaskStatus:
    status = agent_pb2.TaskStatus(task_id=task_id, state=pb_enum(types_pb2.TaskState, state))
    if state == TaskState.FAILED:
        status.has_exit_code, status.exit_code, status.reason = True, 1, "exit code 1"
    return status


class TestFailedOnAFencedGpu:
    def test_requeued_as_a_move_not_a_restart(self, etcd_server: EtcdCluster, etcd_prefix: str) -> None:
        """Restart policy never: the task whose GPU is fenced goes back in the queue with gpu_fault_moves 1 and no
        restart; one that fails on a healthy GPU ends FAILED."""
        asyncio.run(run_leading(etcd_server.endpoints, etcd_prefix, self._scenario))

    async def _scenario(self, app: App) -> None:
        entry = await app.nodes.connected(agent_pb2.Register(inventory=inventory("n1")), asyncio.Queue())
        app.cycle._moves = None   # the program dies before the cycle's move reaches it
        ids = [(await app.tasks.submit(one_gpu_spec(name), f"r-{name}")).id for name in ("on-bad", "on-good")]
        await until(lambda: all(app.tasks.get(t).state == TaskState.SCHEDULED for t in ids))
        for t in ids:
            await app.reconciler.on_task_status(entry, _report(t, TaskState.RUNNING))
        bad = app.tasks.get(ids[0]).allocation.nodes[0].gpu_indices[0]
        record = types_pb2.NodeRecord()
        record.CopyFrom(entry.record)
        record.gpu_fences.add(gpu_index=bad, reason="xid 79", action=types_pb2.GPU_HEALTH_ACTION_REPLACE)
        app.state.apply_node(record)
        for t in ids:
            await app.reconciler.on_task_status(entry, _report(t, TaskState.FAILED))

        moved = app.tasks.get(ids[0])
        assert moved.restarts == 0 and moved.gpu_fault_moves == 1
        states = [h.state for h in moved.history]
        i = states.index(types_pb2.TASK_STATE_FAILED)
        assert states[i + 1] == types_pb2.TASK_STATE_PENDING
        assert moved.history[i + 1].reason.startswith(f"moved off n1 GPU {bad}: xid 79; it failed there")
        failed = app.tasks.get(ids[1])
        assert failed.state == TaskState.FAILED and failed.gpu_fault_moves == 0
