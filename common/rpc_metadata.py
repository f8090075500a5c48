"""Trailing-metadata keys of the Admin API, shared by the coordinator and gptrmctl."""

from __future__ import annotations

__all__ = ["LEADER_METADATA_KEY", "REFUSED_METADATA_KEY"]

LEADER_METADATA_KEY = "gptrm-leader-address"
"""Set by a standby that refuses a write: where the leader is, for the client to follow."""

REFUSED_METADATA_KEY = "gptrm-refused"
"""Set by a coordinator that answered UNAVAILABLE itself (etcd down), as opposed to no connection."""
