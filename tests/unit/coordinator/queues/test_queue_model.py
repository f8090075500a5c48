"""The queue tree: validation naming the field, pools, access, set/remove and plain-data round trips."""

from __future__ import annotations

import json

import pytest

from common.errors import NotFound, ValidationError
from coordinator.queues import DEFAULT_QUEUE, Budget, Queue, QueueConfig

H100 = "NVIDIA H100 80GB HBM3"


def tree() -> QueueConfig:
    return QueueConfig(queues=(
        Queue("org", gpus={"*": 8}),
        Queue("a", parent="org", gpus={"*": 4}, limit={"*": 8}, lend={"*": 2}, members=("alice", "bob"),
              default_for=("alice",)),
        Queue("b", parent="org", gpus={"*": 4}, members=("*",), default_for=("*",)),
    ))


def field_of(excinfo: pytest.ExceptionInfo[ValidationError]) -> str:
    return excinfo.value.field


def test_empty_config_is_the_implicit_default_queue() -> None:
    config = QueueConfig()
    assert not config.managed
    assert config.names == ("default",)
    assert config.get("default") is DEFAULT_QUEUE
    assert config.may_submit("anyone", "default")
    assert config.default_queue("anyone") == "default"
    assert config.leaves() == ("default",)


def test_tree_navigation() -> None:
    config = tree()
    assert config.children("org") == ("a", "b")
    assert config.ancestors("a") == ("org",)
    assert config.descendants("org") == ("a", "b")
    assert config.leaves() == ("a", "b")
    assert not config.is_leaf("org")
    with pytest.raises(NotFound):
        config.get("nope")


@pytest.mark.parametrize(("queues", "field", "text"), [
    ((Queue("A"),), "queue[0].name", "does not match"),
    ((Queue("-a"),), "queue[0].name", "does not match"),
    ((Queue("a" * 64),), "queue[0].name", "does not match"),
    ((Queue("a"), Queue("a")), "queue[1].name", "defined twice"),
    ((Queue("a", parent="x"),), "queue[0].parent", "no queue named 'x'"),
    ((Queue("a", parent="a"),), "queue[0].parent", "its own parent"),
    ((Queue("a", parent="b"), Queue("b", parent="a")), "queue[0].parent", "cycle a -> b -> a"),
    ((Queue("a", weight=0),), "queue[0].weight", "positive"),
    ((Queue("a", gpus={"*": -1}),), 'queue[0].gpus["*"]', "whole number"),
    ((Queue("a", gpus={"*": 1.5}),), 'queue[0].gpus["*"]', "whole number"),  # type: ignore[dict-item]
    ((Queue("x"), Queue("a", gpus={"*": 4}, limit={"*": 2})), 'queue[1].limit["*"]', "2 is below its quota 4"),
    ((Queue("a", gpus={H100: 4}, limit={"*": 2}),), 'queue[0].limit["*"]', "below its quota 4"),
    ((Queue("a", gpus={"*": 4}, lend={"*": 6}),), 'queue[0].lend["*"]', "6 is above its quota 4"),
    ((Queue("a", cpu=-1),), "queue[0].cpu", "≥ 0"),
    ((Queue("a", members=("",)),), "queue[0].members[0]", "not an identity"),
    ((Queue("a", default_for=("x",)), Queue("b", default_for=("x",))), "queue[1].default_for", "already has"),
    ((Queue("p", gpus={"*": 4}), Queue("a", parent="p", gpus={"*": 3}), Queue("b", parent="p", gpus={"*": 2})),
     'queue[0].gpus["*"]', "add up to 5, more than its 4"),
    ((Queue("p", cpu=8), Queue("a", parent="p", cpu=6), Queue("b", parent="p", cpu=6)), "queue[0].cpu", "add up to 12"),
    ((Queue("p", gpus={"*": 4}, lend={"*": 1}), Queue("a", parent="p")), "queue[0].lend", "only leaf queues lend"),
    ((Queue("a", budget=Budget("watts", 1)),), "queue[0].budget.kind", "not one of"),  # type: ignore[arg-type]
    ((Queue("a", budget=Budget("kwh", 0)),), "queue[0].budget.amount", "positive"),
    ((Queue("a", budget=Budget("kwh", 1, period="year")),), "queue[0].budget.period", "not one of"),  # type: ignore[arg-type]
])
def test_validation_names_the_field(queues: tuple[Queue, ...], field: str, text: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        QueueConfig(queues=queues)
    assert field_of(excinfo) == field
    assert text in str(excinfo.value)


def test_other_validation() -> None:
    with pytest.raises(ValidationError) as excinfo:
        QueueConfig(half_life_h=0)
    assert field_of(excinfo) == "half_life_h"


def test_parent_without_quota_does_not_bound_children() -> None:
    config = QueueConfig(queues=(Queue("org"), Queue("a", parent="org", gpus={"*": 100})))
    assert config.get("a").quota_in("*") == 100


def test_empty_model_key_means_any() -> None:
    q = Queue("a", gpus={"": 2}, limit={"": 3})
    assert q.gpus == {"*": 2}
    assert q.limit_in("*") == 3


def test_pools_and_per_pool_values() -> None:
    config = QueueConfig(queues=(
        Queue("a", gpus={H100: 2, "*": 4}, limit={"*": 10}, lend={H100: 1}),
        Queue("b", gpus={"*": 2}),
    ))
    assert config.named_models == (H100,)
    assert config.pool_of(H100) == H100
    assert config.pool_of("NVIDIA A100") == "*"
    assert config.pool_of("") == "*"
    assert config.pools(["NVIDIA A100", H100, "L4"]) == (H100, "*")
    a, b = config.get("a"), config.get("b")
    assert (a.quota_in(H100), a.quota_in("*")) == (2, 4)
    assert a.limit_in(H100) == 10                 # the "*" limit stands in for a named pool
    assert b.quota_in(H100) == 0                  # a "*" quota does not cover named models
    assert b.limit_in(H100) is None               # no limit: unlimited
    assert a.lend_in(H100) == 1
    assert a.lend_in("*") == 4                    # no entry: all of the quota


def test_access() -> None:
    config = tree()
    assert config.may_submit("alice", "a")
    assert config.may_submit("bob", "a")
    assert not config.may_submit("carol", "a")
    assert config.may_submit("carol", "b")        # members = ["*"]
    assert not config.may_submit("alice", "org")  # not a leaf
    assert not config.may_submit("alice", "nope")
    assert config.default_queue("alice") == "a"
    assert config.default_queue("carol") == "b"   # default_for = ["*"]
    no_wildcard = QueueConfig(queues=(Queue("a", default_for=("alice",)),))
    with pytest.raises(NotFound):
        no_wildcard.default_queue("carol")
    # being a queue's default lets one submit to it even when not among its members
    assert QueueConfig(queues=(Queue("a", default_for=("ci",)),)).may_submit("ci", "a")


def test_set_adds_replaces_and_validates_the_whole_tree() -> None:
    config = tree()
    added = config.set(Queue("c", parent="org"))
    assert added.names == ("org", "a", "b", "c")
    assert config.names == ("org", "a", "b")      # the original is unchanged
    replaced = config.set(Queue("a", parent="org", gpus={"*": 2}))
    assert replaced.get("a").quota_in("*") == 2
    assert replaced.names == config.names
    with pytest.raises(ValidationError) as excinfo:
        config.set(Queue("a", parent="org", gpus={"*": 5}))
    assert field_of(excinfo) == 'queue[0].gpus["*"]'
    with pytest.raises(ValidationError) as excinfo:
        config.set(Queue("org", parent="a"))
    assert field_of(excinfo) == "queue[0].parent"


def test_remove_refuses_a_parent_and_returns_a_new_config() -> None:
    config = tree()
    with pytest.raises(ValidationError) as excinfo:
        config.remove("org")
    assert "has children (a, b)" in str(excinfo.value)
    smaller = config.remove("b")
    assert smaller.names == ("org", "a")
    with pytest.raises(NotFound):
        config.remove("nope")
    assert not QueueConfig(queues=(Queue("x"),)).remove("x").managed
    assert QueueConfig().set(Queue("x")).names == ("x",)          # the implicit default gives way


def test_queue_round_trips_through_json() -> None:
    queue = Queue("a", parent="org", weight=2.5, gpus={H100: 2, "*": 1}, limit={"*": 4}, lend={H100: 1}, cpu=64,
                  mem_gib=512.5, members=("alice",), default_for=("alice", "ci"),
                  budget=Budget("cost", 100.0, "week", "lowest"))
    data = json.loads(json.dumps(queue.to_dict()))
    assert Queue.from_dict(data) == queue
    assert Queue("x").to_dict() == {"name": "x"}


def test_config_round_trips_through_plain_data() -> None:
    config = QueueConfig(queues=tree().queues, half_life_h=12)
    assert QueueConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


@pytest.mark.parametrize(("data", "field"), [
    ({"name": "a", "colour": "red"}, "queue.colour"),
    ({"parent": "x"}, "queue.name"),
    ({"name": "a", "members": "alice"}, "queue.members"),
    ({"name": "a", "budget": {"kind": "kwh"}}, "queue.budget"),
])
def test_queue_from_dict_names_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        Queue.from_dict(data)
    assert field_of(excinfo) == field
