"""Image references, mounts and the container fields of a spec (common/oci.py), and their submit flags."""

from __future__ import annotations

import pytest

from common.errors import ValidationError
from common.oci import parse_image, parse_mount, validate_container
from coordinator.ctl.main import build_parser
from coordinator.ctl.spec import spec_from_args
from coordinator.ctl.transport import CtlError

_DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("text", "skopeo"), [
    ("busybox", "docker://docker.io/library/busybox:latest"),
    ("team/trainer:v2", "docker://docker.io/team/trainer:v2"),
    ("127.0.0.1:5000/team/trainer:v2", "docker://127.0.0.1:5000/team/trainer:v2"),
    ("localhost/x", "docker://localhost/x:latest"),
    (f"nvcr.io/nvidia/pytorch@{_DIGEST}", f"docker://nvcr.io/nvidia/pytorch@{_DIGEST}"),
    ("oci-archive:/srv/images/x.tar", "oci-archive:/srv/images/x.tar"),
    ("oci-archive:/srv/images/x.tar:tag1", "oci-archive:/srv/images/x.tar:tag1"),
    ("docker-archive:/srv/images/y.tar", "docker-archive:/srv/images/y.tar"),
])
def test_reference_forms(text: str, skopeo: str) -> None:
    """Each accepted form reads as the source skopeo copies (Docker Hub names completed as Docker does)."""
    assert parse_image(text).skopeo == skopeo


@pytest.mark.parametrize("text", ["", "Upper/Case", "http://x/y", "a:b:c", "x@sha256:short", "oci-archive:rel.tar",
                                  "docker-archive:/a/../etc/shadow", "x" * 600])
def test_bad_references_name_the_field(text: str) -> None:
    with pytest.raises(ValidationError) as e:
        parse_image(text)
    assert e.value.field == "spec.image"


def test_mounts() -> None:
    assert parse_mount("/data/sets:/data:ro").read_only
    assert not parse_mount("/data/sets:/data").read_only
    for bad in ("/a", "rel:/a", "/a:rel", "/a/../b:/b", "/a:/proc/x", "/a:/", "/a:/b:rx", "/a:/dev"):
        with pytest.raises(ValidationError):
            parse_mount(bad)


def test_allowed_roots() -> None:
    """Mounts and archives below an allowed root pass; others are refused naming the mount; none allowed: none."""
    validate_container("x:1", ["/srv/data/a:/a:ro"], "/w", 0, allowed=["/srv/data"])
    with pytest.raises(ValidationError) as e:
        validate_container("x:1", ["/srv/data/a:/a", "/srv/database:/b"], "", 0, allowed=["/srv/data"])
    assert e.value.field == "spec.mounts[1]"
    with pytest.raises(ValidationError) as e:
        validate_container("oci-archive:/etc/x.tar", [], "", 0, allowed=["/srv/data"])
    assert e.value.field == "spec.image"
    with pytest.raises(ValidationError):
        validate_container("x:1", ["/srv/data:/a"], "", 0, allowed=[])


def test_container_fields_need_an_image() -> None:
    cases: list[tuple[tuple[list[str], str, int], str]] = [
        (([], "/w", 0), "spec.workdir"), ((["/a:/b"], "", 0), "spec.mounts"), (([], "", 1), "spec.shm_bytes")]
    for args, field in cases:
        with pytest.raises(ValidationError) as e:
            validate_container("", *args)
        assert e.value.field == field
    with pytest.raises(ValidationError) as e:
        validate_container("x", [], "w", 0)
    assert e.value.field == "spec.workdir"
    with pytest.raises(ValidationError) as e:
        validate_container("x", ["/a:/b", "/c:/b"], "", 0)
    assert e.value.field == "spec.mounts[1]"


def test_submit_flags() -> None:
    args = build_parser().parse_args(["submit", "--image", "127.0.0.1:5000/t:1", "--mount", "/d:/d:ro",
                                      "--workdir", "/w", "--shm", "1GiB", "--", "python", "x.py"])
    spec = spec_from_args(args)
    assert (spec.image, list(spec.mounts), spec.workdir, spec.shm_bytes) == ("127.0.0.1:5000/t:1", ["/d:/d:ro"],
                                                                             "/w", 1 << 30)
    bad = build_parser().parse_args(["submit", "--image", "Nope:", "--", "x"])
    with pytest.raises(CtlError, match=r"spec\.image"):
        spec_from_args(bad)


def test_a_task_with_an_image_goes_only_where_containers_run() -> None:
    """request_for selects the containers label for a task with an image; a node without it is refused by placement's
    own constraint check, one with it (as the snapshot labels a node whose agent reports containers) is not."""
    from common.oci import CONTAINERS_LABEL
    from common.pb.gptrm.v1 import types_pb2
    from coordinator.domain import NodeSnapshot, Resources
    from coordinator.scheduler.policies.base import constraint_reason
    from coordinator.scheduler.queue import request_for

    task = types_pb2.Task(id="t1", spec=types_pb2.TaskSpec(image="127.0.0.1:5000/t:1", argv=["x"]))
    req = request_for(task)
    plain = NodeSnapshot(node_id="n1", capacity=Resources(gpus=1))
    able = NodeSnapshot(node_id="n2", capacity=Resources(gpus=1), labels={CONTAINERS_LABEL: "true"})
    assert constraint_reason(req, plain) is not None and CONTAINERS_LABEL in (constraint_reason(req, plain) or "")
    assert constraint_reason(req, able) is None
    assert constraint_reason(request_for(types_pb2.Task(id="t2", spec=types_pb2.TaskSpec(argv=["x"]))), plain) is None


def test_queue_mount_roots() -> None:
    """A queue's mount_allowed holds absolute, normalized roots, named by index when one is not; it round-trips."""
    from coordinator.queues.model import Queue

    q = Queue.from_dict({"name": "team", "mount_allowed": ["/srv/team"]})
    assert q.mount_allowed == ("/srv/team",) and Queue.from_dict(q.to_dict()) == q
    for bad, field in ((["/srv/team", "rel"], "queue.mount_allowed[1]"), ("/srv", "queue.mount_allowed"),
                       (["/a/../b"], "queue.mount_allowed[0]")):
        with pytest.raises(ValidationError) as e:
            Queue.from_dict({"name": "team", "mount_allowed": bad})
        assert e.value.field == field


@pytest.mark.parametrize("policy", ["max-utilization", "load-balancing", "power-efficient"])
def test_image_locality_among_equal_nodes(policy: str) -> None:
    """Among nodes the policy ranks equal, a task with an image goes to one that holds it; a node the policy
    ranks better still wins, and a task without an image keeps the policy's own order."""
    import dataclasses

    from coordinator.domain import ClusterSnapshot, Placement, Request, Resources
    from coordinator.scheduler.placement.engine import PlacementEngine
    from coordinator.scheduler.policies import build
    from tests.helpers.builders import GIB, make_node

    image = "127.0.0.1:5000/t:1"
    holder = dataclasses.replace(make_node("n3", gpus=4), images=frozenset({image}))
    equal = ClusterSnapshot(nodes=(make_node("n1", gpus=4), make_node("n2", gpus=4), holder))

    def placed(cluster: ClusterSnapshot, with_image: bool) -> str:
        req = Request(task_id="t", demand=Resources(gpus=1.0, cpu_cores=1.0, mem_bytes=GIB),
                      image=image if with_image else "")
        decision = PlacementEngine(cluster, build(policy)).place(req)
        assert isinstance(decision, Placement)
        return decision.node_ids[0]

    assert placed(equal, True) == "n3"
    plain = placed(equal, False)
    assert plain != "n3"
    # n1 ranked strictly better than the holder by the policy: it still wins.
    if policy == "load-balancing":   # the emptier node is better: the holder is the busier one
        unequal = ClusterSnapshot(nodes=(make_node("n1", gpus=4),
                                         dataclasses.replace(make_node("n3", gpus=4, used_gpus=2),
                                                             images=frozenset({image}))))
    else:                            # the fuller node is better
        unequal = ClusterSnapshot(nodes=(make_node("n1", gpus=4, used_gpus=2), holder))
    assert placed(unequal, True) == placed(unequal, False)
