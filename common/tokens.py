"""Bearer tokens for the Admin API: only their SHA-256 hashes are stored.

The coordinator's ``--admin-tokens FILE`` holds one line per principal::

    # NAME  ROLE    HASH
    alice   admin   sha256:3f4c...
    grafana viewer  sha256:9ab1...

``gptrmctl certs token NAME ROLE`` prints a new token once and the line to add. Removing a
line revokes the token: the file is re-read whenever it changes (and on SIGHUP).

Example::

    token = new_token()
    line = token_line("alice", "admin", token)
    tokens = TokenFile(path)             # after writing ``line`` to ``path``
    assert tokens.lookup(token) == ("alice", "admin")
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from common.certs import validate_name
from common.errors import ConfigError, ValidationError

__all__ = ["TOKEN_ROLES", "TokenFile", "hash_token", "new_token", "token_line"]

TOKEN_ROLES = ("admin", "viewer")
_MAX_TOKEN_LEN = 512


def new_token() -> str:
    """A fresh random bearer token (256 bits, URL-safe)."""
    return "gptrm_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form of a token: ``sha256:HEX``."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def token_line(name: str, role: str, token: str) -> str:
    """The ``--admin-tokens`` line granting ``role`` to ``name`` for ``token``.

    :raises ValidationError: bad name or role.
    """
    validate_name(name, "name")
    if role not in TOKEN_ROLES:
        raise ValidationError("role", f"must be one of {', '.join(TOKEN_ROLES)}, got {role!r}")
    return f"{name} {role} {hash_token(token)}"


class TokenFile:
    """The parsed ``--admin-tokens`` file, re-read when its modification time or size changes.

    :param path: the file; it must exist and parse at start-up.
    :raises ConfigError: unreadable file, or a line that is not ``NAME ROLE sha256:HEX``.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._by_hash: dict[str, tuple[str, str]] = {}
        self.reload()

    def reload(self) -> None:
        """Read the file again (the previous table stays if the new one is invalid at runtime)."""
        try:
            st = os.stat(self.path)
            text = self.path.read_text()
        except OSError as e:
            raise ConfigError(f"admin_tokens: cannot read {str(self.path)!r}: {e.strerror}") from None
        table: dict[str, tuple[str, str]] = {}
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            where = f"admin_tokens: {self.path}:{n}"
            if len(parts) != 3 or not parts[2].startswith("sha256:") or len(parts[2]) != 71:
                raise ConfigError(f"{where}: expected 'NAME ROLE sha256:HEX', got {line[:80]!r}")
            name, role, digest = parts
            if role not in TOKEN_ROLES:
                raise ConfigError(f"{where}: role must be one of {', '.join(TOKEN_ROLES)}, got {role!r}")
            try:
                validate_name(name)
            except ValidationError as e:
                raise ConfigError(f"{where}: {e}") from None
            table[digest.lower()] = (name, role)
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

    def lookup(self, token: str) -> tuple[str, str] | None:
        """(name, role) for a presented token, or None when it is not (or no longer) listed."""
        if not token or len(token) > _MAX_TOKEN_LEN:
            return None
        self._maybe_reload()
        digest = hash_token(token)
        for known, who in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return who
        return None
