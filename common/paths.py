"""Default filesystem locations."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_state_dir"]


def default_state_dir(component: str) -> str:
    """``$STATE_DIRECTORY`` (systemd), else ``$XDG_STATE_HOME/gptrm/<component>``, else
    ``~/.local/state/gptrm/<component>``."""
    if os.environ.get("STATE_DIRECTORY"):
        return os.environ["STATE_DIRECTORY"].split(":")[0]
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "gptrm" / component)
