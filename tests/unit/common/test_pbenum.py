"""pb_enum: the domain enums carry the proto enums' numbers, and the conversion keeps the number."""

import pytest

from common.pb.gptrm.v1 import types_pb2
from common.pbenum import pb_enum
from common.types import NodeState, TaskKind, TaskState


@pytest.mark.parametrize(("domain", "proto", "prefix"), [
    (TaskState, types_pb2.TaskState, "TASK_STATE_"),
    (NodeState, types_pb2.NodeState, "NODE_STATE_"),
    (TaskKind, types_pb2.TaskKind, "TASK_KIND_"),
])
def test_domain_enums_mirror_the_proto_enums(domain, proto, prefix):
    for member in domain:
        assert proto.Value(prefix + member.name) == member.value


def test_pb_enum_is_the_plain_number():
    value = pb_enum(types_pb2.TaskState, TaskState.RUNNING)
    assert value == types_pb2.TASK_STATE_RUNNING
    assert type(value) is int
    assert types_pb2.Task(state=value).state == types_pb2.TASK_STATE_RUNNING
