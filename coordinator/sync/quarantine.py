"""The one path of a value read from etcd that cannot be used: moved aside, remembered, reported.

Example::

    quarantine = Quarantine(client, keys, election, listener=lambda key, prefix, reason: ...)
    task = quarantine.parse(kv, parse_task)      # None: the value did not parse or validate, and
                                                 # now lies under quarantine/<key>@<mod revision>
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from common.errors import GptrmError, NotLeader
from common.logging import get_logger
from coordinator.sync._fenced import FencedWriter
from coordinator.sync._kv import KV, cmp_mod, op_delete, op_put
from coordinator.sync.client import EtcdClient
from coordinator.sync.election import Election
from coordinator.sync.keys import Keys

__all__ = ["KEPT", "Listener", "Quarantine"]

M = TypeVar("M")

Listener = Callable[[str, str, str], None]
"""Told of each value moved aside: (its key, its collection such as ``tasks``, why); may run on any thread."""

KEPT = 20
"""How many of the newest moved keys :attr:`Quarantine.keys` remembers (what ``gptrmctl status`` lists)."""


class Quarantine:
    """Moves values that do not decode or do not validate to ``quarantine/<key>@<mod revision>``.

    Every read of a stored value by the leader goes through :meth:`parse`: a value its parser
    refuses (a ``GptrmError`` such as ``CoordinationError``/``ValidationError``, or a ``ValueError``)
    is moved aside byte for byte, in one fenced transaction that also deletes the original if it
    still has the mod revision that was read, so nothing is half-applied and a value rewritten
    meanwhile is left alone. The caller then goes on without it (the value reads as absent).

    On a standby (no leadership) the value is only skipped and logged; the leader moves it.

    :param client: the etcd client.
    :param keys: key names.
    :param election: supplies the fencing epoch.
    :param listener: told of every value moved (metrics, the event stream); set later via :attr:`listener`.
    """

    def __init__(self, client: EtcdClient, keys: Keys, election: Election, *,
                 listener: Listener | None = None) -> None:
        self._writer = FencedWriter(client, keys, election)
        self._keys = keys
        self.listener = listener
        self._lock = threading.Lock()
        self._recent: list[str] = []
        self._log = get_logger("sync")

    @property
    def keys(self) -> list[str]:
        """The newest :data:`KEPT` keys moved aside by this replica, oldest first."""
        with self._lock:
            return list(self._recent)

    def parse(self, kv: KV, parse: Callable[[KV], M]) -> M | None:
        """``parse(kv)``, or None when it refuses the value (which is then moved aside, see :meth:`move`).

        :raises Fenced: we lost leadership while moving the value.
        :raises EtcdUnavailable: etcd did not answer the move.
        """
        try:
            return parse(kv)
        except (GptrmError, ValueError) as e:
            self.move(kv, str(e) or type(e).__name__)
            return None

    def move(self, kv: KV, reason: str) -> bool:
        """Move ``kv`` to ``quarantine/<key>@<mod revision>`` (original bytes) and delete the original,
        in one fenced transaction guarded by the original's mod revision.

        :returns: True when moved; False when the key changed meanwhile or this replica does not lead.
        :raises Fenced: we lost leadership.
        :raises EtcdUnavailable: etcd did not answer.
        """
        target = self._keys.quarantine(kv.key, kv.mod_revision)
        try:
            result = self._writer.write([cmp_mod(kv.key, kv.mod_revision)],
                                        [op_put(target, kv.value), op_delete(kv.key)])
        except NotLeader:
            self._log.warning("etcd_value_unusable", key=kv.key, reason=reason, value_bytes=len(kv.value))
            return False
        if not result.succeeded:
            self._log.info("etcd_value_changed_before_quarantine", key=kv.key, revision=kv.mod_revision)
            return False
        with self._lock:
            self._recent = [*self._recent[-(KEPT - 1):], kv.key]
        collection = self._collection(kv.key)
        self._log.warning("etcd_value_quarantined", key=kv.key, quarantine_key=target, prefix=collection,
                          reason=reason, value_bytes=len(kv.value))
        listener = self.listener
        if listener is not None:
            try:
                listener(kv.key, collection, reason)
            except Exception:   # reporting must never undo or stop the read that found the value
                self._log.exception("quarantine_listener_failed", key=kv.key)
        return True

    def _collection(self, key: str) -> str:
        relative = key[len(self._keys.prefix):] if key.startswith(self._keys.prefix) else key.lstrip("/")
        return relative.split("/", 1)[0] if "/" in relative else relative
