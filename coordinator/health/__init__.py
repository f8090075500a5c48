"""GPU health on the coordinator: fences, health drains, ResumeGpus and application XIDs (the one home of
these rules; see docs/gpu-fencing.md).

Asking "is GPU ``i`` of node ``n`` fenced, and why?" (leader or standby, from the stored record)::

    from coordinator.health import fence_of, fenced, describe_fence
    entry = registry.get("n1")
    fence = fence_of(entry.record, 3)        # None: in service
    if fence is not None:
        fence.reason, fence.evidence         # "xid 79", "xid=79"
        fence.action                         # GPU_HEALTH_ACTION_RESET (lifts itself) or _REPLACE (an admin resumes)
        describe_fence("n1", fence)          # "n1 GPU 3 unhealthy: xid 79" (what pending reasons say)
    fenced(entry.record)                     # {index: GpuFence} for the whole node
    entry.record.health_drained, entry.record.health_drain_reason   # the node itself at fault
    entry.degraded_gpus                      # indices its agent reports DEGRADED now (leader memory)

The leader's :class:`GpuHealthWatch` (``app.nodes.health``) turns telemetry into these records. For whoever
moves work off a fenced GPU: its ``on_fenced`` attribute, when set, is called with ``(node_id, fence)`` for
every GPU this leader newly fences, after the fence is stored; ``fenced_holders()`` lists ``(task id, node id,
fence)`` for every unfinished task on a fenced GPU, whoever wrote the fence (a former leader included).
"""

from coordinator.health.rules import describe_fence, effective, fence_of, fenced
from coordinator.health.watch import GpuHealthWatch

__all__ = ["GpuHealthWatch", "describe_fence", "effective", "fence_of", "fenced"]
