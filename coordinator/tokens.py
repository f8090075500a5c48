"""Bearer tokens for the Admin API: only their SHA-256 hashes are stored.

The coordinator's ``--admin-tokens FILE`` holds one line per principal::

    # NAME  ROLE        HASH            [QUEUES]
    root    admin       sha256:3f4c...
    alice   submitter   sha256:77d0...  queues=ml-vision,shared
    lead    queue-admin sha256:51ee...  queues=ml
    grafana viewer      sha256:9ab1...

The role is one of :data:`TOKEN_ROLES` (``admin``, ``queue-admin``, ``submitter``, ``viewer``;
what each may do: ``coordinator.api.auth``).
The optional fourth field ``queues=A,B`` names the queues the holder may submit to, in order
(the first is its default; names as :func:`coordinator.certs.validate_queues` allows). A line with
three fields names no queues, as every line did before the field existed.

``gptrmctl certs token NAME ROLE [--queues A,B]`` prints a new token once and the line to add.
Removing a line revokes the token: the file is re-read whenever it changes (and on SIGHUP).

Example::

    token = new_token()
    line = token_line("alice", "admin", token, queues=("ml-vision", "shared"))
    tokens = TokenFile(path)             # after writing ``line`` to ``path``
    assert tokens.lookup(token) == TokenHolder("alice", "admin", ("ml-vision", "shared"))
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError, ValidationError
from coordinator.certs import QUEUE_KINDS, validate_name, validate_queues, validate_role_queues

__all__ = ["TOKEN_ROLES", "TokenFile", "TokenHolder", "hash_token", "new_token", "token_line"]

TOKEN_ROLES = QUEUE_KINDS
"""The roles a token gives, as a person's certificate does."""
_MAX_TOKEN_LEN = 512
_QUEUES_FIELD = "queues="


@dataclass(frozen=True, slots=True)
class TokenHolder:
    """Who a listed token stands for: its line's name, role and queues (empty when it names none)."""

    name: str
    role: str
    queues: tuple[str, ...] = ()


def new_token() -> str:
    """A fresh random bearer token (256 bits, URL-safe)."""
    return "gptrm_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form of a token: ``sha256:HEX``."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def token_line(name: str, role: str, token: str, queues: Sequence[str] = ()) -> str:
    """The ``--admin-tokens`` line granting ``role`` to ``name`` for ``token``, naming ``queues``
    (the first the default; no fourth field when there are none).

    :raises ValidationError: bad name, role or queues.
    """
    validate_name(name, "name")
    if role not in TOKEN_ROLES:
        raise ValidationError("role", f"must be one of {', '.join(TOKEN_ROLES)}, got {role!r}")
    held = validate_role_queues(role, queues)
    line = f"{name} {role} {hash_token(token)}"
    return f"{line} {_QUEUES_FIELD}{','.join(held)}" if held else line


class TokenFile:
    """The parsed ``--admin-tokens`` file, re-read when its modification time or size changes.

    :param path: the file; it must exist and parse at start-up.
    :raises ConfigError: unreadable file, or a line that is not ``NAME ROLE sha256:HEX [queues=A,B]``.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._by_hash: dict[str, TokenHolder] = {}
        self.reload()

    def reload(self) -> None:
        """Read the file again (the previous table stays if the new one is invalid at runtime)."""
        try:
            st = os.stat(self.path)
            text = self.path.read_text()
        except OSError as e:
            raise ConfigError(f"admin_tokens: cannot read {str(self.path)!r}: {e.strerror}") from None
        table: dict[str, TokenHolder] = {}
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            where = f"admin_tokens: {self.path}:{n}"
            if len(parts) not in (3, 4) or not parts[2].startswith("sha256:") or len(parts[2]) != 71:
                raise ConfigError(f"{where}: expected 'NAME ROLE sha256:HEX [queues=A,B]', got {line[:80]!r}")
            name, role, digest = parts[:3]
            if role not in TOKEN_ROLES:
                raise ConfigError(f"{where}: role must be one of {', '.join(TOKEN_ROLES)}, got {role!r}")
            try:
                validate_name(name)
            except ValidationError as e:
                raise ConfigError(f"{where}: {e}") from None
            queues = _queues_field(parts[3], where) if len(parts) == 4 else ()
            try:
                validate_role_queues(role, queues)
            except ValidationError as e:
                raise ConfigError(f"{where}: {e}") from None
            table[digest.lower()] = TokenHolder(name, role, queues)
        self._by_hash = table
        self._stamp = (st.st_mtime_ns, st.st_size)

    def _maybe_reload(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._by_hash = {}   # a deleted file revokes every token
            self._stamp = None
            return
        if (st.st_mtime_ns, st.st_size) != self._stamp:
            try:
                self.reload()
            except ConfigError:
                self._by_hash = {}   # fail closed on a half-written or broken file
                self._stamp = (st.st_mtime_ns, st.st_size)

    def lookup(self, token: str) -> TokenHolder | None:
        """Name, role and queues for a presented token, or None when it is not (or no longer) listed."""
        if not token or len(token) > _MAX_TOKEN_LEN:
            return None
        self._maybe_reload()
        digest = hash_token(token)
        for known, who in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return who
        return None


def _queues_field(field: str, where: str) -> tuple[str, ...]:
    """The queues of a line's fourth field, ``queues=A,B``.

    :raises ConfigError: naming ``where`` (file and line) when the field is not that, or names a
        queue that :func:`~coordinator.certs.validate_queues` refuses.
    """
    if not field.startswith(_QUEUES_FIELD) or field == _QUEUES_FIELD:
        raise ConfigError(f"{where}: the fourth field must be 'queues=A,B' with at least one queue, "
                          f"got {field[:80]!r}")
    try:
        return validate_queues(field[len(_QUEUES_FIELD):].split(","))
    except ValidationError as e:
        raise ConfigError(f"{where}: {e}") from None
