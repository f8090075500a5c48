"""Choosing nodes: --nodelist, --exclude and --constraint in the placement filter and at the door (admission)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from common.errors import PlacementError
from common.pb.gptrm.v1 import types_pb2
from coordinator.ctl.main import build_parser
from coordinator.ctl.spec import spec_from_args
from coordinator.ctl.transport import CtlError
from coordinator.domain import ClusterSnapshot, Placement
from coordinator.profiler.validation import validate_spec
from coordinator.scheduler.admission import PlaceabilityCheck, constraint_refusal, unplaceable_reason
from coordinator.scheduler.placement import PlacementEngine
from coordinator.scheduler.queue import request_for
from tests.helpers.builders import GIB, make_node, make_request

NODES = [replace(make_node("n1", gpus=4), labels={"rack": "a"}), replace(make_node("n2", gpus=4), labels={"rack": "b"}),
         make_node("n3", gpus=4)]


def _place(**constraints: object) -> str | None:
    req = replace(make_request("t", gpus=1), **constraints)  # type: ignore[arg-type]
    out = PlacementEngine.from_name(ClusterSnapshot(nodes=tuple(NODES)), "max-utilization", threshold=0.9).place(req)
    return out.assignments[0].node_id if isinstance(out, Placement) else None


def test_the_filter_keeps_to_the_node_list_and_away_from_excluded_nodes() -> None:
    assert _place(only_nodes=frozenset({"n3"})) == "n3"
    assert _place(only_nodes=frozenset({"n2", "n3"}), avoid_nodes=frozenset({"n2"})) == "n3"
    assert _place(only_nodes=frozenset({"n2"}), avoid_nodes=frozenset({"n2"})) is None
    assert _place(node_selector={"rack": "b"}) == "n2"
    # The shape cache keys on the constraints: the same shape with another node list is another entry.
    assert make_request("t").constraint_key is None
    assert replace(make_request("t"), only_nodes=frozenset({"n1"})).constraint_key != \
        replace(make_request("t"), only_nodes=frozenset({"n2"})).constraint_key


@pytest.mark.parametrize(("constraints", "field"), [
    (dict(only_nodes=frozenset({"n9", "n8"})), "spec.constraints.only_nodes"),
    (dict(only_nodes=frozenset({"n1"}), avoid_nodes=frozenset({"n1"})), "spec.constraints.avoid_nodes"),
    (dict(avoid_nodes=frozenset({"n1", "n2", "n3"})), "spec.constraints.avoid_nodes"),
    (dict(node_selector={"rack": "c"}), "spec.constraints.node_selector"),
    (dict(only_nodes=frozenset({"n3"}), node_selector={"rack": "a"}), "spec.constraints.node_selector"),
    (dict(gpu_model="B200"), "spec.constraints.gpu_model"),
])
def test_constraints_no_known_node_matches_are_refused_naming_the_field(constraints: dict, field: str) -> None:
    req = replace(make_request("t", gpus=1), **constraints)
    assert (constraint_refusal(req, NODES) or "").startswith(field)
    reason = unplaceable_reason(req, NODES, 0.9, "whole-gpus")
    assert reason is not None and f": {field}:" in reason


def test_constraints_some_node_matches_pass_the_door() -> None:
    req = replace(make_request("t", gpus=1), only_nodes=frozenset({"n9", "n1"}), node_selector={"rack": "a"})
    assert constraint_refusal(req, NODES) is None
    assert unplaceable_reason(req, NODES, 0.9, "whole-gpus") is None
    # Matching nodes that are too small are a capacity refusal, not a constraint one.
    big = replace(make_request("t", gpus=8), only_nodes=frozenset({"n1"}))
    assert "spec.constraints" not in (unplaceable_reason(big, NODES, 0.9, "whole-gpus") or "spec.constraints")


def test_the_door_refuses_a_task_from_its_spec() -> None:
    spec = spec_from_args(build_parser().parse_args(["submit", "--nodelist", "n1,n3", "--exclude", "n1",
                                                     "--constraint", "rack=a", "--", "true"]))
    assert list(spec.constraints.only_nodes) == ["n1", "n3"] and list(spec.constraints.avoid_nodes) == ["n1"]
    validate_spec(spec, max_gpus_per_node=4)
    task = types_pb2.Task(id="t", spec=spec, demand=types_pb2.ResourceVector(gpus=1, gpu_mem_bytes=GIB, cpu_cores=1))
    assert request_for(task).only_nodes == frozenset({"n1", "n3"})
    admission = PlaceabilityCheck(lambda: NODES, lambda: types_pb2.Policy(name="max-utilization", threshold=0.9),
                                  creates_nodes=False)
    with pytest.raises(PlacementError, match=r"spec\.constraints\.node_selector"):
        admission.check(task)


def test_bad_node_lists() -> None:
    with pytest.raises(CtlError, match="--nodelist"):
        spec_from_args(build_parser().parse_args(["submit", "--nodelist", ",", "--", "true"]))
    with pytest.raises(CtlError, match="--constraint"):
        spec_from_args(build_parser().parse_args(["submit", "--constraint", "rack", "--", "true"]))
    spec = types_pb2.TaskSpec(name="x", argv=["true"])
    spec.constraints.only_nodes.append("")
    from common.errors import ValidationError

    with pytest.raises(ValidationError) as e:
        validate_spec(spec, max_gpus_per_node=4)
    assert e.value.field == "spec.constraints.only_nodes[0]"
