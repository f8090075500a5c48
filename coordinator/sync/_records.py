"""Pure helpers of ``Store``: value codecs, task updates, reservation checks, placement batches."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from common.errors import CoordinationError, ValidationError
from common.pb.gptrm.v1 import types_pb2
from common.pbenum import pb_enum
from common.types import TaskState
from coordinator.allocator.reservations import NodeReservation, ReservationConflict
from coordinator.domain import Resources
from coordinator.sync.client import KV
from coordinator.sync.state_machine import Conflict, check_transition

__all__ = [
    "Prepared",
    "append_history",
    "apply_updates",
    "batches",
    "check_reservations",
    "clear_reservation",
    "decode",
    "decode_task",
    "new_task_id",
    "node_demand",
    "parse_allocation",
    "parse_node",
    "parse_request",
    "parse_task",
    "placed_nodes",
    "placed_reason",
    "prepare_placement",
]

M = TypeVar("M", bound=Message)
_NOT_UPDATABLE = frozenset({"id", "state", "history", "revision"})


def new_task_id() -> str:
    """A fresh task id: ``t-`` and 12 hex digits."""
    return f"t-{uuid.uuid4().hex[:12]}"


def decode(cls: type[M], kv: KV) -> M:
    """Parse a stored value.

    :raises CoordinationError: the value is not a serialized ``cls``.
    """
    try:
        return cls.FromString(kv.value)
    except DecodeError as e:
        raise CoordinationError(f"etcd key {kv.key!r} does not hold a {cls.__name__}: {e}") from e


def decode_task(kv: KV) -> types_pb2.Task:
    """Parse a stored task and set ``revision`` to the key's mod revision."""
    task = decode(types_pb2.Task, kv)
    task.revision = kv.mod_revision
    return task


def parse_node(name: str, kv: KV) -> types_pb2.NodeRecord:
    """The node record stored at ``nodes/<name>``, without reservations.

    A record written before reservations were derived from the tasks' allocations carries ``reserved`` and
    ``reserved_gpu_indices``: they are dropped here, unread (the allocations they summed are still stored and
    are what the leader derives a node's holdings from), and the next write of the record leaves them out.

    :raises CoordinationError: not a ``NodeRecord``, or the record of another node.
    """
    node = decode(types_pb2.NodeRecord, kv)
    if node.inventory.node_id != name:
        raise CoordinationError(f"etcd key {kv.key!r} holds node {node.inventory.node_id!r}")
    clear_reservation(node)
    return node


def clear_reservation(record: types_pb2.NodeRecord) -> None:
    """Drop a node record's stored reservation fields (an older layout's; see :func:`parse_node`)."""
    if record.HasField("reserved"):
        record.ClearField("reserved")
    if record.reserved_gpu_indices:
        record.ClearField("reserved_gpu_indices")


def parse_task(name: str, kv: KV) -> types_pb2.Task:
    """The task stored at ``tasks/<name>`` (``revision`` set).

    :raises CoordinationError: not a ``Task``, or another task.
    :raises ValueError: a state that is no ``TaskState``.
    """
    task = decode_task(kv)
    if task.id != name:
        raise CoordinationError(f"etcd key {kv.key!r} holds task {task.id!r}")
    TaskState(task.state)
    return task


def parse_allocation(name: str, kv: KV) -> types_pb2.Allocation:
    """The allocation stored at ``allocations/<name>``.

    :raises CoordinationError: not an ``Allocation``, the allocation of another task, or one without a node.
    """
    alloc = decode(types_pb2.Allocation, kv)
    if alloc.task_id and alloc.task_id != name:
        raise CoordinationError(f"etcd key {kv.key!r} holds the allocation of task {alloc.task_id!r}")
    if any(not na.node_id for na in alloc.nodes):
        raise CoordinationError(f"etcd key {kv.key!r}: an allocation names a node without an id")
    return alloc


def parse_request(kv: KV) -> str:
    """The task id stored at ``requests/<id>`` (UTF-8 text).

    :raises ValueError: not UTF-8.
    :raises ValidationError: not a task id (empty, a "/" or a control character).
    """
    task_id = kv.value.decode()
    if not task_id or "/" in task_id or any(ord(c) < 0x20 for c in task_id):
        raise ValidationError("request", f"etcd key {kv.key!r} holds {task_id!r}, not a task id")
    return task_id


_PLACED_ON = "placed on "
_NODE_SEPARATOR = ", "   # node ids hold no whitespace (the gateway refuses them), so this splits them


def placed_reason(node_ids: Sequence[str]) -> str:
    """The reason of a SCHEDULED history entry: the nodes the task was placed on (``placed on n1, n2``)."""
    return _PLACED_ON + _NODE_SEPARATOR.join(node_ids)


def placed_nodes(change: types_pb2.TaskStateChange) -> tuple[str, ...]:
    """The nodes a SCHEDULED history entry placed the task on (none for any other entry)."""
    if change.state != TaskState.SCHEDULED or not change.reason.startswith(_PLACED_ON):
        return ()
    return tuple(change.reason[len(_PLACED_ON):].split(_NODE_SEPARATOR))


def append_history(task: types_pb2.Task, state: TaskState, reason: str, now_unix_s: float, limit: int) -> None:
    """Set the state and reason and record the change; keeps the newest ``limit`` changes."""
    task.state = pb_enum(types_pb2.TaskState, state)
    task.reason = reason
    task.history.add(state=int(state), time_unix_s=now_unix_s, reason=reason)
    if len(task.history) > limit:
        del task.history[: len(task.history) - limit]


def apply_updates(task: types_pb2.Task, updates: Mapping[str, object]) -> None:
    """Set ``Task`` fields by name; ``exit_code`` also sets ``has_exit_code`` unless given.

    :raises ValidationError: an unknown or protected field (id, state, history, revision), or a bad value.
    """
    fields = types_pb2.Task.DESCRIPTOR.fields_by_name
    for name, value in updates.items():
        field = fields.get(name)
        if field is None or name in _NOT_UPDATABLE:
            raise ValidationError(f"task.{name}", "is not a field an update may set")
        try:
            if field.is_repeated:
                task.ClearField(name)
                getattr(task, name).extend(value)
            elif field.message_type is not None:
                getattr(task, name).CopyFrom(value)
            else:
                setattr(task, name, value)
        except (TypeError, ValueError) as e:
            raise ValidationError(f"task.{name}", f"bad value {value!r}: {e}") from e
    if "exit_code" in updates and "has_exit_code" not in updates:
        task.has_exit_code = True


def node_demand(v: types_pb2.ResourceVector) -> Resources:
    """A ``NodeAllocation.demand`` as the reservation model's vector (GPU memory as the total of its GPUs)."""
    return Resources(gpus=v.gpus, gpu_mem_total_bytes=v.gpu_mem_bytes, cpu_cores=v.cpu_cores, mem_bytes=v.mem_bytes,
                     disk_bytes=v.disk_bytes)


def check_reservations(held: Callable[[str], NodeReservation], sums: dict[str, NodeReservation],
                       allocations: Iterable[types_pb2.NodeAllocation]) -> None:
    """Add ``allocations`` to ``sums`` (node → reservation, started from ``held(node)``), all or none.

    :raises Conflict: a whole-GPU allocation asks for a GPU already held (by ``held`` or an earlier allocation
        added to ``sums``); ``sums`` is then left as it was.
    """
    grown: dict[str, NodeReservation] = {}
    try:
        for na in allocations:
            current = grown.get(na.node_id) or sums.get(na.node_id) or held(na.node_id)
            grown[na.node_id] = current.add(na.node_id, node_demand(na.demand), na.gpu_indices, na.gpu_share)
    except ReservationConflict as e:
        raise Conflict(str(e)) from None
    sums.update(grown)


@dataclass(frozen=True, slots=True)
class Prepared:
    """One placement ready to commit: the new task and allocation values, serialized."""

    task_id: str
    expected_revision: int
    task: types_pb2.Task
    allocation: types_pb2.Allocation
    task_bytes: bytes
    allocation_bytes: bytes
    node_ids: tuple[str, ...]


def prepare_placement(
    task: types_pb2.Task,
    expected_revision: int,
    allocation: types_pb2.Allocation,
    *,
    epoch: int,
    now_unix_s: float,
    history_limit: int,
) -> Prepared:
    """Build the SCHEDULED task and its allocation record.

    :raises IllegalTransition: the task is not PENDING.
    :raises ValidationError: the allocation names no node.
    """
    check_transition(task.id, TaskState(task.state), TaskState.SCHEDULED)
    if not allocation.nodes or any(not na.node_id for na in allocation.nodes):
        raise ValidationError("allocation.nodes", f"task {task.id}: every allocation needs at least one node id")
    new = types_pb2.Task()
    new.CopyFrom(task)
    new.revision = 0
    alloc = new.allocation   # the allocation record is the task's own copy, serialized on its own too
    alloc.CopyFrom(allocation)
    alloc.task_id = task.id
    alloc.leader_epoch = alloc.leader_epoch or epoch
    alloc.created_unix_s = alloc.created_unix_s or now_unix_s
    new.ClearField("parts")   # one part per node, rank i on nodes[i], until its agent reports
    scheduled = pb_enum(types_pb2.TaskState, TaskState.SCHEDULED)
    new.parts.extend(types_pb2.TaskPart(node_id=na.node_id, rank=i, state=scheduled)
                     for i, na in enumerate(alloc.nodes))
    append_history(new, TaskState.SCHEDULED, placed_reason([na.node_id for na in alloc.nodes]), now_unix_s,
                   history_limit)
    node_ids = tuple(dict.fromkeys(na.node_id for na in alloc.nodes))
    return Prepared(
        task.id, expected_revision, new, alloc, new.SerializeToString(), alloc.SerializeToString(), node_ids
    )


def batches(prepared: Sequence[Prepared], max_ops: int, max_bytes: int) -> Iterator[list[Prepared]]:
    """Split placements into transactions that respect etcd's limits, in order.

    Per transaction: compares = 1 (fencing) + 2 per placement (task revision, allocation absent); success
    ops = 2 per placement; both within ``max_ops`` (etcd's ``--max-txn-ops``), and the values within
    ``max_bytes`` (under etcd's ``--max-request-bytes``). A placement too big on its own gets its own batch.
    No node record is written (a node's reservation is derived from the allocations), so batches share
    nothing and may all be in flight together.
    """
    batch: list[Prepared] = []
    size = 0
    for p in prepared:
        grown = size + len(p.task_bytes) + len(p.allocation_bytes)
        if batch and (1 + 2 * (len(batch) + 1) > max_ops or grown > max_bytes):
            yield batch
            batch, grown = [], len(p.task_bytes) + len(p.allocation_bytes)
        batch.append(p)
        size = grown
    if batch:
        yield batch
