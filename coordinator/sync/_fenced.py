"""The one write path: every leader write is a transaction fenced by the leader key's create revision."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Protocol, TypeVar

from common.errors import Fenced
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from coordinator.sync import _records as rec
from coordinator.sync.client import KV, Compare, EtcdClient, Op, TxnResult, cmp_create, cmp_mod, op_get, op_put
from coordinator.sync.election import Election
from coordinator.sync.keys import Keys

__all__ = ["FencedWriter", "Nodes", "Quarantining"]

Nodes = dict[str, tuple[types_pb2.NodeRecord, int]]
"""node id → (its record, the record's mod revision), as read for a compare-and-put."""

_M = TypeVar("_M")


class Quarantining(Protocol):
    """What the writer needs of :class:`~coordinator.sync.quarantine.Quarantine` (which writes through a
    :class:`FencedWriter` of its own, so this module does not import it): reading a value through it."""

    def parse(self, kv: KV, parse: Callable[[KV], _M]) -> _M | None:
        """``parse(kv)``, or None when the parser refuses the value and it is moved aside."""


class FencedWriter:
    """Runs transactions that only apply while ``election`` still holds the leader key.

    Example::

        writer = FencedWriter(client, keys, election)
        result = writer.write([cmp_mod(key, 7)], [op_put(key, data)], [op_get(key)])
        if not result.succeeded:
            current = result.responses[0]        # the failure ops' results, fencing stripped
    """

    def __init__(self, client: EtcdClient, keys: Keys, election: Election, max_txn_ops: int = 128,
                 quarantine: Quarantining | None = None) -> None:
        self._client, self._keys, self._election, self._max_ops = client, keys, election, max_txn_ops
        self.quarantine = quarantine
        self._log = get_logger("sync")

    def parse(self, kv: KV, parse: Callable[[KV], _M]) -> _M | None:
        """``parse(kv)`` through the quarantine (None: the value was refused and moved aside); without a
        quarantine, the parser's error is raised."""
        return parse(kv) if self.quarantine is None else self.quarantine.parse(kv, parse)

    def write(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        """Run a transaction with ``leader create_revision == epoch`` added to ``compare``.

        :returns: the result; when a compare other than fencing failed, ``responses`` are those
            of ``failure``.
        :raises NotLeader: we do not lead.
        :raises Fenced: the leader key is no longer ours; the election has been told to step down.
        :raises EtcdUnavailable: etcd did not answer.
        """
        epoch = self._election.require_epoch()
        leader = self._keys.leader
        result = self._client.txn([cmp_create(leader, epoch), *compare], success, [op_get(leader), *failure])
        if result.succeeded:
            return result
        held = result.responses[0]
        current = held[0].create_revision if held else 0
        if current != epoch:
            reason = f"leader key {leader!r} has create revision {current}, our epoch is {epoch}"
            self._log.warning("write_fenced", key=leader, revision=epoch, reason=reason)
            self._election.step_down(f"fenced: {reason}")
            raise Fenced(f"write refused by fencing: {reason}")
        return TxnResult(False, result.revision, result.responses[1:])

    def read_nodes(self, node_ids: Iterable[str]) -> Nodes:
        """Node records and their mod revisions, read in few round trips (missing nodes, and nodes whose
        record was refused and moved aside, are left out)."""
        ids = sorted(set(node_ids))
        out: Nodes = {}
        for i in range(0, len(ids), self._max_ops):
            chunk = ids[i : i + self._max_ops]
            result = self._client.txn([], [op_get(self._keys.node(n)) for n in chunk])
            for node_id, found in zip(chunk, result.responses, strict=True):
                if not found:
                    continue
                record = self.parse(found[0], partial(rec.parse_node, node_id))
                if record is not None:
                    out[node_id] = (record, found[0].mod_revision)
        return out

    def node_ops(self, nodes: Nodes) -> tuple[list[Compare], list[Op]]:
        """Compare each node's mod revision as read; put each (modified) record."""
        keys = {n: self._keys.node(n) for n in nodes}
        return (
            [cmp_mod(keys[n], rev) for n, (_r, rev) in nodes.items()],
            [op_put(keys[n], r.SerializeToString()) for n, (r, _rev) in nodes.items()],
        )
