"""The StartTask a placement sends carries the task's metrics endpoint to its agent."""

from __future__ import annotations

import asyncio

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from coordinator.dispatch import Dispatcher
from coordinator.monitor.nodes import NodeRegistry


def placed(spec: types_pb2.TaskSpec) -> types_pb2.Task:
    """A task allocated one GPU on n1."""
    task = types_pb2.Task(id="t1", spec=spec)
    task.allocation.decision_id = "d1"
    task.allocation.nodes.add(node_id="n1", gpu_indices=[0], gpu_uuids=["GPU-0"], gpu_share=1.0)
    return task


def start_sent(spec: types_pb2.TaskSpec) -> agent_pb2.Decision:
    """The decision queued for n1 when ``spec``'s task is pushed."""
    registry = NodeRegistry(1.0, 5.0)
    outbox: asyncio.Queue = asyncio.Queue()
    registry.connect(types_pb2.NodeInventory(node_id="n1", gpus=[types_pb2.GpuInfo(index=0)]), outbox=outbox)
    Dispatcher(registry, epoch=lambda: 3).start(placed(spec))
    decision = outbox.get_nowait().decision
    assert decision.leader_epoch == 3
    return decision


class TestStartTaskMetrics:
    def test_port_becomes_loopback_url_with_mapping(self) -> None:
        """A metrics_port is sent as http://127.0.0.1:PORT/metrics together with the mapping."""
        spec = types_pb2.TaskSpec(argv=["serve"], metrics_port=8000,
                                  metrics_mapping=types_pb2.MetricsMapping(flavour="tgi", waiting_gauge="q"))
        start = start_sent(spec).start
        assert start.metrics_url == "http://127.0.0.1:8000/metrics"
        assert (start.metrics_mapping.flavour, start.metrics_mapping.waiting_gauge) == ("tgi", "q")

    def test_url_as_given_and_none(self) -> None:
        """A metrics_url is sent as given; a task without an endpoint gets none."""
        assert start_sent(types_pb2.TaskSpec(argv=["serve"], metrics_url="http://[::1]:9/m")).start.metrics_url \
            == "http://[::1]:9/m"
        assert start_sent(types_pb2.TaskSpec(argv=["serve"])).start.metrics_url == ""
