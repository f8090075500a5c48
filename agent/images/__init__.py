"""Tasks run inside OCI images (``docs/containers.md``): the node's image store and each task's container.

The pieces, all daemonless and each a well-kept Debian package: ``skopeo`` copies an image from a registry (or an
archive) into a temporary OCI layout, ``umoci`` unpacks it once into the store's content-addressed read-only tree
(:mod:`agent.images.store`), and ``crun`` runs each task's container from the task's own root wrapper
(:mod:`agent.launch`) with a generated ``config.json`` (:mod:`agent.images.bundle`), as the task's uid, over a
writable overlay of the task's own that goes with its mount namespace and its directory.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from agent.images.store import Image, ImageStore, PullFailed
from agent.launch import root_program

__all__ = ["Containers", "Image", "ImageStore", "PullFailed", "task_layer"]


@dataclass(frozen=True, slots=True)
class TaskLayer:
    """A task's own container directories (under its agent directory, root's 0700)."""

    root: Path

    @property
    def upper(self) -> Path:
        return self.root / "upper"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def merged(self) -> Path:
        return self.root / "merged"

    @property
    def bundle(self) -> Path:
        return self.root / "bundle"

    @property
    def state(self) -> Path:
        return self.root / "crun"

    def create(self) -> None:
        """Fresh, empty directories (whatever an earlier run of the task left is removed)."""
        self.remove()
        self.root.mkdir(mode=0o700)
        for d in (self.upper, self.work, self.merged, self.bundle, self.state):
            d.mkdir(mode=0o700)
        os.chmod(self.upper, 0o755)   # the container's / : its owner root, like the image's own

    def remove(self) -> None:
        """The task's writable layer and bundle, whatever the task wrote in it (never following a link)."""
        shutil.rmtree(self.root, ignore_errors=True)


def task_layer(agent_dir: Path) -> TaskLayer:
    return TaskLayer(Path(agent_dir) / "container")


@dataclass(frozen=True, slots=True)
class Containers:
    """Whether this node runs tasks with an image, and its store."""

    crun: str
    store: ImageStore | None
    cdi_dirs: tuple[str, ...] = ()

    @property
    def available(self) -> bool:
        return self.store is not None

    @classmethod
    def find(cls, root: Path, *, max_bytes: int = 0, auth_file: str = "", insecure: tuple[str, ...] = (),
             retries: int = 3, cdi_dirs: tuple[str, ...] = ()) -> Containers:
        """Containers where the agent is root and crun, skopeo, umoci, mount and unshare are installed; else none
        (a task with an image is then never placed here)."""
        programs = {name: root_program(name) for name in ("crun", "skopeo", "umoci", "mount", "unshare")}
        if os.geteuid() != 0 or not all(programs.values()):
            return cls(programs["crun"], None)
        store = ImageStore(root, skopeo=programs["skopeo"], umoci=programs["umoci"], max_bytes=max_bytes,
                           auth_file=auth_file, insecure=insecure, retries=retries)
        return cls(programs["crun"], store, cdi_dirs)
