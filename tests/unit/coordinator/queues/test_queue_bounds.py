"""The queue tree's bounds (each refusal a ValidationError naming the field) and its iterative walks."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pytest

from common.errors import ValidationError
from coordinator.queues import MAX_DEPTH, MAX_QUEUES, Queue, QueueConfig
from coordinator.queues.model import MAX_IDENTITIES, MAX_IDENTITY_CHARS, MAX_MODEL_CHARS


def chain(depth: int) -> list[dict[str, Any]]:
    """``q0`` above ``q1`` above … ``q<depth-1>``, as stored data."""
    return [{"name": f"q{i}", **({"parent": f"q{i - 1}"} if i else {})} for i in range(depth)]


@pytest.mark.parametrize(("data", "field", "text"), [
    ({"name": "a", "gpus": {"*": 99999999999999999999}}, 'queue.gpus["*"]', "≤ 1000000"),
    ({"name": "a", "limit": {"*": 2**32}}, 'queue.limit["*"]', "≤ 1000000"),
    ({"name": "a", "cpu": 99999999999999999999}, "queue.cpu", "≤ 1e+07"),
    ({"name": "a", "mem_gib": 1e300}, "queue.mem_gib", "≤ 1e+09"),
    ({"name": "a", "weight": 1e300}, "queue.weight", "up to 1e+06"),
    ({"name": "a", "budget": {"kind": "kwh", "amount": 1e300}}, "queue.budget.amount", "up to 1e+15"),
    ({"name": "a", "gpus": {"x" * 5000: 1}}, 'queue.gpus["' + "x" * 32 + '"…]', "5000 characters"),
    ({"name": "a", "gpus": {f"m{i}": 0 for i in range(65)}}, "queue.gpus", "65 GPU models"),
    ({"name": "a", "members": [f"u{i}" for i in range(20_000)]}, "queue.members", "20000 identities"),
    ({"name": "a", "default_for": ["x" * (MAX_IDENTITY_CHARS + 1)]}, "queue.default_for[0]", "characters"),
    ({"name": "a", "parent": "x" * 5000}, "queue.parent", "is not a queue name"),
])
def test_values_beyond_their_bounds_are_refused_naming_the_field(data: dict[str, Any], field: str,
                                                                 text: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        Queue.from_dict(data)
    assert excinfo.value.field == field
    assert text in excinfo.value.problem
    assert len(str(excinfo.value)) < 200            # a hostile value is never echoed whole


def test_values_at_their_bounds_are_accepted() -> None:
    q = Queue.from_dict({"name": "a", "gpus": {"m" * MAX_MODEL_CHARS: 1_000_000}, "cpu": 1e7,
                         "members": [f"u{i}" for i in range(MAX_IDENTITIES)]})
    assert q.quota_in("m" * MAX_MODEL_CHARS) == 1_000_000


def test_too_many_queues_are_refused() -> None:
    data = {"queue": [{"name": f"q{i}"} for i in range(MAX_QUEUES + 1)]}
    with pytest.raises(ValidationError) as excinfo:
        QueueConfig.from_dict(data)
    assert excinfo.value.field == "queue" and f"at most {MAX_QUEUES}" in excinfo.value.problem
    assert len(QueueConfig.from_dict({"queue": data["queue"][:MAX_QUEUES]}).queues) == MAX_QUEUES


def test_a_tree_deeper_than_the_limit_is_refused_naming_the_queue() -> None:
    assert QueueConfig.from_dict({"queue": chain(MAX_DEPTH)}).ancestors(f"q{MAX_DEPTH - 1}")[-1] == "q0"
    with pytest.raises(ValidationError) as excinfo:
        QueueConfig.from_dict({"queue": chain(MAX_DEPTH + 1)})
    assert excinfo.value.field == f"queue[{MAX_DEPTH}].parent" and "levels deep" in excinfo.value.problem


def test_a_999_deep_chain_is_a_validation_error_not_a_recursion_error() -> None:
    data = chain(MAX_QUEUES - 1)
    data.reverse()                                   # children before parents: the worst order to walk
    with pytest.raises(ValidationError) as excinfo:
        QueueConfig.from_dict({"queue": data})
    assert "levels deep" in excinfo.value.problem


def test_a_cycle_is_still_named() -> None:
    data = [{"name": "a", "parent": "c"}, {"name": "b", "parent": "a"}, {"name": "c", "parent": "b"}]
    with pytest.raises(ValidationError) as excinfo:
        QueueConfig.from_dict({"queue": data})
    assert excinfo.value.field == "queue[0].parent" and excinfo.value.problem.startswith("cycle a -> c -> b -> a")


@contextmanager
def _few_frames(spare: int) -> Iterator[None]:
    """Lower the recursion limit to ``spare`` frames above the caller's: a recursive walk of a deeper tree fails."""
    frame: FrameType | None = sys._getframe()
    depth = 0
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + spare)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


@pytest.mark.parametrize("walk", [
    lambda c: c.descendants("q0"),
    lambda c: c.tree_order(),
    lambda c: c.ancestors(f"q{MAX_DEPTH - 1}"),
])
def test_walks_are_iterative(walk: Callable[[QueueConfig], tuple[Any, ...]]) -> None:
    """Walks over the deepest tree allowed need a few frames, not one per level."""
    config = QueueConfig.from_dict({"queue": chain(MAX_DEPTH)})
    with _few_frames(12):
        out = walk(config)
    assert len(out) in (MAX_DEPTH - 1, MAX_DEPTH)


def test_tree_order_puts_parents_first_and_siblings_by_name() -> None:
    config = QueueConfig(queues=(Queue("z"), Queue("b", parent="z"), Queue("a", parent="z"), Queue("c", parent="a"),
                                 Queue("m")))
    assert [q.name for q in config.tree_order()] == ["m", "z", "a", "c", "b"]
    assert config.descendants("z") == ("a", "c", "b")
