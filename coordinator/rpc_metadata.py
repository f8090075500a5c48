"""Trailing-metadata keys of the Admin API, shared by the coordinator and gptrmctl."""

from __future__ import annotations

__all__ = ["LEADER_METADATA_KEY", "NOT_LEADER_METADATA_KEY", "REFUSED_METADATA_KEY"]

LEADER_METADATA_KEY = "gptrm-leader-address"
"""Set by a standby that refuses a write: where the leader is, for the client to follow."""

REFUSED_METADATA_KEY = "gptrm-refused"
"""Set by a coordinator that answered UNAVAILABLE itself (etcd down), as opposed to no connection."""

NOT_LEADER_METADATA_KEY = "gptrm-not-leader"
"""Set when a write was refused only because this replica does not lead (or lost the lease during
the write, nothing applied): the client may retry it, on the leader, with the same request id."""
