"""Usage records in etcd: one ``usage/<yyyy-mm-ddThh>`` key per hour (``UsageBucket``) and the ledger's
``usage-marks`` (``UsageMarks``), written together in one fenced transaction by the leader.

Values read back are untrusted: a value larger than its bound, that does not decode, that names
another hour, or that holds a number that is not finite and non-negative (or beyond
:data:`MAX_VALUE`) is moved under ``quarantine/`` and reads as absent.

Example::

    usage = UsageStore(client, keys, election, quarantine=quarantine)
    marks, marks_rev = usage.get_marks()                # (None, 0) when none is stored
    buckets = usage.get_hours([h])                      # hour → (bucket, mod revision)
    usage.commit({h: (bucket, rev)}, new_marks, marks_rev)   # Conflict when one changed meanwhile
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import partial

from common.errors import CoordinationError, ValidationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.sync import _records as rec
from coordinator.sync._fenced import FencedWriter
from coordinator.sync.client import KV, Compare, EtcdClient, Op, cmp_create, cmp_mod, op_get, op_put
from coordinator.sync.election import Election
from coordinator.sync.keys import Keys
from coordinator.sync.quarantine import Quarantine
from coordinator.sync.state_machine import Conflict

__all__ = ["MAX_BUCKET_BYTES", "MAX_LABEL", "MAX_MARKS", "MAX_ROWS", "MAX_VALUE", "UsageStore", "hours_between"]

MAX_BUCKET_BYTES = 1 << 20
"""The largest stored hour read or written (etcd's default request limit is 1.5 MiB)."""

MAX_ROWS = 2048
"""Rows of one hour (the ledger folds more into ``other`` rows)."""

MAX_MARKS = 20_000
"""Tasks with an energy mark (unfinished tasks the ledger follows)."""

MAX_LABEL = 256
"""The longest queue, user or GPU model name of a row, and task id of a mark."""

MAX_VALUE = 1e15
"""The largest number a row or mark may hold (GPU-seconds of a million GPUs for thirty years)."""

_HOUR_S = 3600
_BATCH = 128


def _number(key: str, what: str, value: float) -> None:
    if not (math.isfinite(value) and 0 <= value <= MAX_VALUE):
        raise CoordinationError(f"etcd key {key!r}: {what} {value!r} is not a finite number in [0, {MAX_VALUE:g}]")


def _label(key: str, what: str, value: str) -> None:
    if len(value) > MAX_LABEL:
        raise CoordinationError(f"etcd key {key!r}: {what} is {len(value)} characters, at most {MAX_LABEL}")


class UsageStore:
    """Reads and fenced writes of the usage ledger's hours and marks.

    :param client: the etcd client.
    :param keys: key names.
    :param election: supplies the fencing epoch (a deposed leader's write raises ``Fenced``).
    :param quarantine: where a stored value that does not parse or validate goes (moved aside, then read
        as absent); by default one of its own.
    """

    def __init__(self, client: EtcdClient, keys: Keys, election: Election, *,
                 quarantine: Quarantine | None = None) -> None:
        self._client, self._keys = client, keys
        self._writer = FencedWriter(client, keys, election, quarantine=quarantine or Quarantine(client, keys, election))

    def get_marks(self) -> tuple[types_pb2.UsageMarks | None, int]:
        """The stored marks and their mod revision; (None, 0) when none is stored (or it was moved aside)."""
        kv = self._client.get(self._keys.usage_marks)
        marks = None if kv is None else self._writer.parse(kv, self._parse_marks)
        return (marks, kv.mod_revision) if marks is not None and kv is not None else (None, 0)

    def get_hours(self, hours: Iterable[int]) -> dict[int, tuple[types_pb2.UsageBucket, int]]:
        """The stored buckets of ``hours`` (starts of hours) with their mod revisions; missing ones (and ones
        moved aside) are left out."""
        wanted = sorted(set(hours))
        out: dict[int, tuple[types_pb2.UsageBucket, int]] = {}
        for i in range(0, len(wanted), _BATCH):
            chunk = wanted[i : i + _BATCH]
            result = self._client.txn([], [op_get(self._keys.usage_hour(h)) for h in chunk])
            for hour, found in zip(chunk, result.responses, strict=True):
                if not found:
                    continue
                bucket = self._writer.parse(found[0], partial(self._parse_bucket, hour))
                if bucket is not None:
                    out[hour] = (bucket, found[0].mod_revision)
        return out

    def commit(self, buckets: Mapping[int, tuple[types_pb2.UsageBucket, int]], marks: types_pb2.UsageMarks,
               marks_revision: int) -> int:
        """Write ``buckets`` (hour → (bucket, the mod revision it was read at; 0: new)) and ``marks`` in one
        fenced transaction.

        :returns: the revision written (the marks' new mod revision).
        :raises Conflict: a bucket or the marks changed since they were read.
        :raises ValidationError: a bucket or the marks are larger than their bound.
        :raises NotLeader, Fenced: we do not lead.
        """
        compare: list[Compare] = []
        success: list[Op] = []
        for hour, (bucket, revision) in sorted(buckets.items()):
            key = self._keys.usage_hour(hour)
            data = bucket.SerializeToString()
            if len(data) > MAX_BUCKET_BYTES or len(bucket.rows) > MAX_ROWS:
                raise ValidationError("usage.rows", f"{len(bucket.rows)} rows, {len(data)} bytes; at most "
                                      f"{MAX_ROWS} rows, {MAX_BUCKET_BYTES} bytes")
            compare.append(cmp_mod(key, revision) if revision else cmp_create(key, 0))
            success.append(op_put(key, data))
        data = marks.SerializeToString()
        if len(data) > MAX_BUCKET_BYTES or len(marks.task_energy_j) > MAX_MARKS:
            raise ValidationError("usage.marks", f"{len(marks.task_energy_j)} tasks, {len(data)} bytes; at most "
                                  f"{MAX_MARKS} tasks, {MAX_BUCKET_BYTES} bytes")
        key = self._keys.usage_marks
        compare.append(cmp_mod(key, marks_revision) if marks_revision else cmp_create(key, 0))
        success.append(op_put(key, data))
        result = self._writer.write(compare, success)
        if not result.succeeded:
            raise Conflict("usage: an hour or the marks changed meanwhile")
        return result.revision

    def _parse_marks(self, kv: KV) -> types_pb2.UsageMarks:
        if len(kv.value) > MAX_BUCKET_BYTES:
            raise CoordinationError(f"etcd key {kv.key!r}: {len(kv.value)} bytes, at most {MAX_BUCKET_BYTES}")
        marks = rec.decode(types_pb2.UsageMarks, kv)
        if len(marks.task_energy_j) > MAX_MARKS:
            raise CoordinationError(f"etcd key {kv.key!r}: {len(marks.task_energy_j)} tasks, at most {MAX_MARKS}")
        _number(kv.key, "accounted_until_unix_s", marks.accounted_until_unix_s)
        for task_id, joules in marks.task_energy_j.items():
            _label(kv.key, "a task id", task_id)
            _number(kv.key, f"task_energy_j[{task_id!r}]", joules)
        return marks

    def _parse_bucket(self, hour: int, kv: KV) -> types_pb2.UsageBucket:
        if len(kv.value) > MAX_BUCKET_BYTES:
            raise CoordinationError(f"etcd key {kv.key!r}: {len(kv.value)} bytes, at most {MAX_BUCKET_BYTES}")
        bucket = rec.decode(types_pb2.UsageBucket, kv)
        if bucket.hour_unix_s != hour:
            raise CoordinationError(f"etcd key {kv.key!r} holds the hour starting {bucket.hour_unix_s}")
        if len(bucket.rows) > MAX_ROWS:
            raise CoordinationError(f"etcd key {kv.key!r}: {len(bucket.rows)} rows, at most {MAX_ROWS}")
        for i, row in enumerate(bucket.rows):
            for what in ("queue", "user", "gpu_model"):
                _label(kv.key, f"rows[{i}].{what}", getattr(row, what))
            for what in ("gpu_s", "cpu_core_s", "energy_j"):
                _number(kv.key, f"rows[{i}].{what}", getattr(row, what))
            _number(kv.key, f"rows[{i}].tasks", float(row.tasks))
        return bucket


def hours_between(since_unix_s: float, until_unix_s: float) -> list[int]:
    """Starts of the hours that ``[since, until)`` touches."""
    first = math.floor(since_unix_s / _HOUR_S) * _HOUR_S
    return list(range(first, math.ceil(until_unix_s / _HOUR_S) * _HOUR_S, _HOUR_S))
