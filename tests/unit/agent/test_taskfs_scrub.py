"""What a task's uid left in world-writable directories is removed, without following a link (agent.taskfs)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from agent import taskfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="files of another uid are made by root")


def _owned(path: Path, uid: int, *, directory: bool = False, mode: int = 0o600) -> Path:
    path.mkdir(mode) if directory else path.write_text("x")
    os.chown(path, uid, uid, follow_symlinks=False)
    path.chmod(mode)
    return path


class TestScrubUid:
    def test_the_uids_own_entries_go_others_stay(self, tmp_path: Path) -> None:
        """Its files, links and directories (with what is in them) at the top, and its entries inside a
        world-writable directory of another owner, go; another uid's files, root's directory and what a link points
        at stay."""
        uid, other = 1_954_000_000 + secrets.randbelow(1000), 1_955_000_000
        top = tmp_path / "tmp"
        top.mkdir(0o1777)
        top.chmod(0o1777)
        mine = _owned(top / "mine", uid)
        own_dir = _owned(top / "own-dir", uid, directory=True, mode=0o755)
        _owned(own_dir / "inner", other)
        shared = top / "shared"   # root's, sticky and world-writable, like /tmp/.X11-unix
        shared.mkdir()
        shared.chmod(0o1777)
        nested = _owned(shared / "socket-like", uid)
        theirs = _owned(top / "theirs", other)
        outside = tmp_path / "outside"
        outside.mkdir()
        target = _owned(outside / "file", uid)
        link = top / "link"
        link.symlink_to(outside)
        os.chown(link, other, other, follow_symlinks=False)
        own_link = top / "own-link"   # the task's own link to a directory: the link goes, not what it points at
        own_link.symlink_to(outside)
        os.chown(own_link, uid, uid, follow_symlinks=False)

        removed = taskfs.scrub_uid(uid, [str(top)])

        assert not mine.exists() and not own_dir.exists() and not nested.exists() and not own_link.is_symlink()
        assert sorted(removed) == sorted(map(str, (mine, own_dir, nested, own_link)))
        assert theirs.exists() and shared.is_dir() and target.exists() and link.is_symlink()

    def test_the_host_s_world_writable_directories(self) -> None:
        """/run/lock is among the directories scrubbed, beside /tmp, /var/tmp and /dev/shm (where they exist)."""
        dirs = taskfs.shared_dirs()
        assert {"/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue"} <= set(dirs)
        assert len(dirs) == len(set(dirs))
