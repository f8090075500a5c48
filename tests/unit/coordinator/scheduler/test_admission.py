"""Tests for the refusal at submit of tasks no known node could hold (coordinator/scheduler/admission.py)."""

from __future__ import annotations

from typing import Any

import pytest

from common.errors import PlacementError
from common.pb.gptrm.v1 import types_pb2
from coordinator.domain import NodeSnapshot, Request
from coordinator.monitor.nodes import NodeRegistry
from coordinator.monitor.power_model import PowerModel
from coordinator.scheduler import admission as admission_module
from coordinator.scheduler.admission import PlaceabilityCheck, unplaceable_reason
from coordinator.scheduler.snapshot import SnapshotBuilder
from tests.helpers.builders import GIB, make_node, make_request

NODES = [make_node("n1", gpus=2), make_node("n2", gpus=8), make_node("n3", gpus=4)]


class TestUnplaceableReason:
    def test_fits_an_empty_node(self) -> None:
        """A full-node task fits the empty 8-GPU node under the default mode."""
        assert unplaceable_reason(make_request("t", gpus=8), NODES, 0.9, "whole-gpus") is None

    def test_more_gpus_than_the_largest_node(self) -> None:
        """The reason names the largest node and its GPU count."""
        reason = unplaceable_reason(make_request("t", gpus=16), NODES, 0.9, "whole-gpus")
        assert reason is not None and reason.endswith("16 GPUs per node requested; the largest node, n2, has 8")

    def test_paper_mode_caps_the_gpu_count(self) -> None:
        """Under the paper's rule 8 GPUs never fit 0.9 × 8: the filter's reason for the largest node."""
        reason = unplaceable_reason(make_request("t", gpus=8), NODES, 0.9, "paper")
        assert reason is not None and "the largest node, n2" in reason and "gpus over threshold 0.9" in reason

    def test_host_dimension(self) -> None:
        """A host dimension over the threshold on every node is named."""
        reason = unplaceable_reason(make_request("t", gpus=1, cpu=60.0), NODES, 0.9, "whole-gpus")
        assert reason is not None and "cpu_cores over threshold 0.9" in reason

    def test_gang_needs_enough_nodes(self) -> None:
        """A gang of 4-GPU parts fits two of the three nodes: 2 parts pass, 3 are refused."""
        assert unplaceable_reason(make_request("t", gpus=4, nodes=2), NODES, 0.9, "whole-gpus") is None
        reason = unplaceable_reason(make_request("t", gpus=4, nodes=3), NODES, 0.9, "whole-gpus")
        assert reason is not None and "a gang of 3 nodes requested; only 2 of the 3 known nodes" in reason

    def test_judges_the_views_it_is_given(self) -> None:
        """The filter runs on the views passed in: a full node refuses, its empty copy (what admission passes,
        see SnapshotBuilder.empty_nodes) accepts."""
        busy = [make_node("n1", gpus=8, used_gpus=8)]
        assert unplaceable_reason(make_request("t", gpus=8), busy, 0.9, "whole-gpus") is not None
        assert unplaceable_reason(make_request("t", gpus=8), [make_node("n1", gpus=8)], 0.9, "whole-gpus") is None

    def test_no_known_node_refuses_nothing(self) -> None:
        """With no node known there is nothing to judge by."""
        assert unplaceable_reason(make_request("t", gpus=64), [], 0.9, "whole-gpus") is None


def _task(gpus: float) -> types_pb2.Task:
    return types_pb2.Task(id="t", spec=types_pb2.TaskSpec(name="t", nodes=1),
                          demand=types_pb2.ResourceVector(gpus=gpus, gpu_mem_bytes=10 * GIB, cpu_cores=1.0))


class TestAdmission:
    @pytest.mark.parametrize("mode", ["", "whole-gpus"])
    def test_refuses_with_placement_error(self, mode: str) -> None:
        """A stored policy without a mode means the default mode."""
        policy = types_pb2.Policy(name="max-utilization", threshold=0.9, threshold_mode=mode)
        admission = PlaceabilityCheck(lambda: NODES, lambda: policy, creates_nodes=False)
        admission.check(_task(8))
        with pytest.raises(PlacementError, match="the largest node, n2, has 8"):
            admission.check(_task(16))

    def test_a_provider_that_creates_nodes_refuses_nothing(self) -> None:
        """A new node may be the answer."""
        policy = types_pb2.Policy(name="max-utilization", threshold=0.9)
        PlaceabilityCheck(lambda: NODES, lambda: policy, creates_nodes=True).check(_task(16))

    def test_a_shape_let_through_is_not_judged_again_on_the_same_nodes(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A sweep's submits share one shape: the nodes are judged for the first, not for each of the rest."""
        judged: list[str] = []
        real = admission_module.unplaceable_reason

        def counted(req: Request, *rest: Any) -> str | None:
            judged.append(req.task_id)
            return real(req, *rest)

        monkeypatch.setattr(admission_module, "unplaceable_reason", counted)
        policy = types_pb2.Policy(name="max-utilization", threshold=0.9)
        admission = PlaceabilityCheck(lambda: NODES, lambda: policy, creates_nodes=False)
        for _ in range(3):
            admission.check(_task(2))
        admission.check(_task(4))   # another shape is judged
        assert len(judged) == 2

    def test_a_changed_node_is_judged_again(self) -> None:
        """A shape let through on the nodes as they were is refused once the node that held it is gone (a new
        view), and one refused is judged again when a node that fits appears."""
        policy = types_pb2.Policy(name="max-utilization", threshold=0.9)
        nodes = [make_node("n1", gpus=8)]
        admission = PlaceabilityCheck(lambda: nodes, lambda: policy, creates_nodes=False)
        admission.check(_task(8))
        nodes = [make_node("n1", gpus=4)]
        with pytest.raises(PlacementError, match="the largest node, n1, has 4"):
            admission.check(_task(8))
        nodes = [make_node("n1", gpus=4), make_node("n2", gpus=8)]
        admission.check(_task(8))
        policy = types_pb2.Policy(name="max-utilization", threshold=0.9, threshold_mode="paper")
        with pytest.raises(PlacementError, match="gpus over threshold"):
            admission.check(_task(8))   # the policy in force is part of what was let through


def _elastic(lo: int, hi: int, *, nodes: bool = False) -> types_pb2.Task:
    spec = types_pb2.TaskSpec(name="e", nodes=1, kind=types_pb2.TASK_KIND_TRAINING)
    if nodes:
        spec.gpus_per_node = 4
        spec.elastic.min_nodes, spec.elastic.max_nodes = lo, hi
    else:
        spec.elastic.min_gpus, spec.elastic.max_gpus = lo, hi
    gpus = 4 if nodes else lo
    demand = types_pb2.ResourceVector(gpus=gpus, gpu_mem_bytes=GIB, cpu_cores=1.0)
    return types_pb2.Task(id="e", spec=spec, demand=demand)


class TestElasticMaximum:
    POLICY = types_pb2.Policy(name="max-utilization", threshold=0.9)

    def test_a_maximum_no_node_holds_is_refused(self) -> None:
        """--gpus 1:5 where every node has 4 GPUs is refused at submit, naming spec.elastic.max_gpus and the
        largest node; 1:4 is accepted."""
        four = [make_node("n1", gpus=4), make_node("n2", gpus=4)]
        admission = PlaceabilityCheck(lambda: four, lambda: self.POLICY, creates_nodes=False)
        admission.check(_elastic(1, 4))
        with pytest.raises(PlacementError) as info:
            admission.check(_elastic(1, 5))
        assert "spec.elastic.max_gpus: 5 GPUs per node requested; the largest node, n1, has 4" in str(info.value)
        assert "elastic range's maximum" in str(info.value)

    def test_a_maximum_of_more_nodes_than_known_is_refused(self) -> None:
        """An elastic job in whole nodes whose maximum needs more nodes than could hold a part is refused."""
        four = [make_node("n1", gpus=4), make_node("n2", gpus=4)]
        admission = PlaceabilityCheck(lambda: four, lambda: self.POLICY, creates_nodes=False)
        admission.check(_elastic(1, 2, nodes=True))
        with pytest.raises(PlacementError) as info:
            admission.check(_elastic(1, 3, nodes=True))
        assert "spec.elastic.max_nodes: a gang of 3 nodes requested" in str(info.value)


def _inventory(node_id: str, gpus: int) -> types_pb2.NodeInventory:
    return types_pb2.NodeInventory(node_id=node_id, cpu_cores=32, mem_total_bytes=256 * GIB,
                                   disk_total_bytes=1024 * GIB,
                                   gpus=[types_pb2.GpuInfo(index=i, model="H100", mem_total_bytes=80 * GIB)
                                         for i in range(gpus)])


def _record(node_id: str, gpus: int) -> types_pb2.NodeRecord:
    return types_pb2.NodeRecord(inventory=_inventory(node_id, gpus))


class TestNodeTableGeneration:
    """The check fetches the node views again only when the node table's generation moved; every change that could
    alter what placement sees of a node moves it."""

    POLICY = types_pb2.Policy(name="max-utilization", threshold=0.9)

    def _setup(self) -> tuple[NodeRegistry, PlaceabilityCheck, list[int]]:
        registry = NodeRegistry(heartbeat_interval_s=1.0, lost_grace_s=10.0)
        registry.connect(_inventory("n1", 8), outbox=None)  # type: ignore[arg-type]
        registry.connect(_inventory("n2", 4), outbox=None)  # type: ignore[arg-type]
        builder = SnapshotBuilder(PowerModel())
        fetches = [0]

        def nodes() -> list[NodeSnapshot]:
            fetches[0] += 1
            return builder.empty_nodes(registry)

        admission = PlaceabilityCheck(nodes, lambda: self.POLICY, creates_nodes=False,
                                      generation=lambda: registry.generation)
        admission.check(_task(8))
        admission.check(_task(8))
        assert fetches == [1]   # unchanged table: the nodes are not fetched again
        return registry, admission, fetches

    def test_a_new_inventory_is_judged(self) -> None:
        registry, admission, _ = self._setup()
        registry.connect(_inventory("n1", 4), outbox=None)  # type: ignore[arg-type]   # re-registered smaller
        with pytest.raises(PlacementError, match="the largest node, n1, has 4"):
            admission.check(_task(8))

    def test_a_node_removed_is_judged(self) -> None:
        registry, admission, _ = self._setup()
        registry.remove("n1")
        with pytest.raises(PlacementError, match="the largest node, n2, has 4"):
            admission.check(_task(8))

    def test_a_node_loaded_is_judged(self) -> None:
        registry, admission, fetches = self._setup()
        registry.load(_record("n3", 2))
        admission.check(_task(8))
        assert fetches == [2]

    @pytest.mark.parametrize("change", ["images", "stored_record", "state", "health", "fences"])
    def test_each_kind_of_change_fetches_the_nodes_again(self, change: str) -> None:
        registry, admission, fetches = self._setup()
        entry = registry.get("n1")
        assert entry is not None
        if change == "images":
            registry.set_images(entry, ["registry.invalid/img:1"])
        elif change == "stored_record":   # an admin's cordon, labels-bearing record, power state: etcd's record
            stored = types_pb2.NodeRecord()
            stored.CopyFrom(entry.record)
            stored.cordoned = True
            registry.follow_stored(stored)
        elif change == "state":
            registry.disconnect("n1", entry.stream_id)
        elif change == "health":
            registry.set_health(entry, frozenset({0}), False)
        else:
            stored = types_pb2.NodeRecord()
            stored.CopyFrom(entry.record)
            stored.gpu_fences.add(gpu_index=0)
            registry.follow_stored(stored)
        admission.check(_task(8))
        assert fetches == [2]
