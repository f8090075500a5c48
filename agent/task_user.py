"""Which Unix user a task runs as: never root by default, and never the same uid as another task.

- An agent running as root gives every task a uid of its own from ``--task-uids`` (default
  :data:`DEFAULT_TASK_UIDS`): no passwd entry, no supplementary groups, a group of the same
  number. Two tasks never share a uid while either runs, so they cannot read each other's files,
  signal each other's processes or attach to them, and everything a task leaves behind can be
  found by its uid once it ends. A uid is handed out again only after every other free uid of
  the range has been (least recently used first), never while a process still runs as it, and
  never before what the task left on the host is removed (:func:`agent.taskfs.scrub_uid`).
- Several agents on one host (tests, or a host split between clusters) never hand out the same uid
  at once: a uid is claimed by creating ``/run/gptrm/task-uids/<uid>`` exclusively, and given back
  when the task's last process is gone and what it left is removed. Another agent's claim is
  respected while a process runs as that uid or for :data:`CLAIM_GRACE_S` after it was made (a
  start in progress); a claim of this agent's own that no task of its table holds is left from a
  crash: a restarted agent cleans up after that uid first (:meth:`agent.runtime.TaskRuntime.adopt`),
  then hands it out again.
- ``--task-uids off`` makes every task run as ``--task-user`` (default ``gptrm-task``, created
  by ``make install``; ``nobody`` when it is missing, said in the log); a task user that
  resolves to uid 0 is refused at start-up.
- An agent that is not root (``make run`` by a developer) cannot switch users: tasks run as the
  agent's own user, whatever ``--task-user`` says.
- A spec may ask for another user (``run_as_user``) only if ``--task-users-allowed`` lists it;
  root only if the list names ``root`` explicitly.

Example::

    policy = TaskUserPolicy.from_config("gptrm-task", ["train"], uids=parse_uid_range("1879048192-1879052287"))
    who = policy.resolve("", taken={...})   # a uid of its own, not in ``taken``
    who = policy.resolve("train")           # allowed; any other name raises GptrmError

Who a task runs as is decided here only, from what the StartTask names; a mapping from the
submitting user or team to a uid plugs into :meth:`TaskUserPolicy.resolve`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.launch import ROOT_PATH, root_program
from agent.taskkill import uids_running
from common.errors import ConfigError, GptrmError
from common.logging import get_logger

__all__ = ["CLAIMS_DIR", "CLAIM_GRACE_S", "DEFAULT_TASK_UIDS", "DEFAULT_TASK_USER", "FALLBACK_TASK_USER",
           "NoRoom", "TaskUser", "TaskUserPolicy", "UidClaims", "parse_uid_range"]

DEFAULT_TASK_USER = "gptrm-task"
FALLBACK_TASK_USER = "nobody"
DEFAULT_TASK_UIDS = "1879048192-1879052287"
"""4,096 uids from 0x70000000: above the ranges distributions, ``/etc/subuid`` and container
managers hand out, below 2^31 (tools that keep uids in a signed int)."""
_MIN_TASK_UID = 1000
CLAIMS_DIR = Path("/run/gptrm/task-uids")
CLAIM_GRACE_S = 120.0


class NoRoom(GptrmError):
    """A start refused for want of room the scheduler counts (no free task uid; a master port held by
    something else): the refusal says so (``DecisionAck.no_room``), so the coordinator places the task
    again, on another node or port, instead of failing it."""


def parse_uid_range(text: str) -> range | None:
    """``FIRST-LAST`` (inclusive) → a range; ``off`` or "" → None.

    :raises ConfigError: naming ``task_uids`` when the text is not a range of at least one uid
        above the system users' uids.
    """
    text = text.strip()
    if text in ("", "off"):
        return None
    first, sep, last = text.partition("-")
    try:
        lo, hi = int(first), int(last)
    except ValueError:
        raise ConfigError(f"task_uids: {text!r} is not FIRST-LAST (e.g. {DEFAULT_TASK_UIDS}) or 'off'") from None
    if not sep or lo > hi or lo < _MIN_TASK_UID or hi >= 2**31 - 1:
        raise ConfigError(f"task_uids: {text!r} must be FIRST-LAST with {_MIN_TASK_UID} <= FIRST <= LAST < "
                          f"{2**31 - 1}")
    return range(lo, hi + 1)


@dataclass(frozen=True, slots=True)
class TaskUser:
    """A resolved task user; ``switch`` is False when tasks run as the agent's own user.

    ``exclusive`` marks a uid handed to this one task: every process running as it is the task's,
    so ending the task may kill them all and remove what the uid left behind.
    """

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...]
    switch: bool
    exclusive: bool = False

    def setpriv_argv(self, setpriv: str) -> list[str]:
        """The prefix that drops to this user before exec.

        ``setpriv`` (util-linux) rather than ``subprocess(user=...)``: switching credentials in a
        forked child of a process with gRPC threads can crash the child before exec, while a plain
        exec of setpriv is safe. ``--no-new-privs`` keeps setuid programs from regaining root.

        :param setpriv: setpriv's absolute path (a root step never looks a program up on a PATH).
        """
        if not os.path.isabs(setpriv):
            raise GptrmError(f"setpriv must be named by its absolute path, not {setpriv!r}")
        groups = "--clear-groups" if self.exclusive else f"--groups={','.join(map(str, self.groups or (self.gid,)))}"
        return [setpriv, f"--reuid={self.uid}", f"--regid={self.gid}", groups, "--no-new-privs", "--"]

    @classmethod
    def own(cls, uid: int) -> TaskUser:
        """A uid of one task's own, with a group of the same number and no other groups."""
        return cls(f"task-{uid}", uid, uid, "", (), switch=True, exclusive=True)

    def env(self, workdir: str) -> dict[str, str]:
        """HOME, USER and LOGNAME for the task's environment (HOME: the user's home, else ``workdir``)."""
        home = self.home if self.home and self.home != "/nonexistent" and not self.exclusive else workdir
        return {"HOME": home, "USER": self.name, "LOGNAME": self.name}


class UidClaims:
    """Host-wide claims on task uids, one file per uid (see the module docstring).

    :param directory: where the claim files live (root's, 0700).
    :param owner: this agent's name in its claims (one per state directory).
    """

    def __init__(self, directory: Path, owner: str, *, clock: Callable[[], float] = time.time) -> None:
        self.directory = Path(directory)
        self.owner = owner
        self._clock = clock

    @classmethod
    def open(cls, owner: str, directory: Path = CLAIMS_DIR) -> UidClaims | None:
        """The claims directory, created if need be; None (logged) where it cannot be."""
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(directory, 0o700)
        except OSError as e:
            get_logger("agent").bind(component="runtime").warning(
                "task_uid_claims_unavailable", path=str(directory), reason=str(e))
            return None
        return cls(directory, owner)

    def claim(self, uid: int, running: Collection[int]) -> bool:
        """Claim ``uid`` for this agent; False when another agent holds it.

        :param running: uids some process runs as now.
        """
        path = self.directory / str(uid)
        for _ in range(2):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                if not self._stale(path, uid, running):
                    return False
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(f"{self.owner}\n")
            return True
        return False

    def held_elsewhere(self, running: Collection[int]) -> set[int]:
        """The uids another agent holds a live claim on (one directory listing)."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return set()
        held = set()
        for name in names:
            if not name.isdigit():
                continue
            path = self.directory / name
            if self._owner_of(path) != self.owner and not self._stale(path, int(name), running):
                held.add(int(name))
        return held

    def release(self, uid: int) -> None:
        """Give ``uid`` back (only a claim of this agent's own)."""
        path = self.directory / str(uid)
        if self._owner_of(path) == self.owner:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def held(self) -> list[int]:
        """The uids this agent holds claims on (after a restart: those of tasks it ran before)."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return sorted(int(n) for n in names if n.isdigit() and self._owner_of(self.directory / n) == self.owner)

    def _owner_of(self, path: Path) -> str | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            return os.read(fd, 256).decode(errors="replace").strip()
        finally:
            os.close(fd)

    def _stale(self, path: Path, uid: int, running: Collection[int]) -> bool:
        if self._owner_of(path) == self.owner:
            return True   # ours, and the caller knows no task of ours holds it
        if uid in running:
            return False
        try:
            return self._clock() - os.lstat(path).st_mtime > CLAIM_GRACE_S
        except FileNotFoundError:
            return True


def _entry(pw: pwd.struct_passwd, switch: bool) -> TaskUser:
    try:
        groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except OSError:
        groups = (pw.pw_gid,)
    return TaskUser(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir, groups, switch)


class TaskUserPolicy:
    """Resolves the user of each task.

    :param default: the user tasks run as when the spec names none.
    :param allowed: other users a spec may name.
    :param euid: the agent's effective uid (injected in tests).
    :param getpwnam: user lookup (injected in tests).
    :param uids: the uids handed to tasks one each (None: every task runs as ``default``).
    """

    def __init__(self, default: TaskUser, allowed: Sequence[str], *, euid: int,
                 getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam, uids: range | None = None) -> None:
        self.default = default
        self.allowed = tuple(allowed)
        self.uids = uids if euid == 0 else None
        self._euid = euid
        self._getpwnam = getpwnam
        self._next = 0   # index in ``uids`` where the search for a free uid starts (least recently used)
        self.claims: UidClaims | None = None   # set by the runtime where a host-wide claims directory exists

    @classmethod
    def from_config(cls, task_user: str, allowed: Sequence[str], *, euid: int | None = None,
                    getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam,
                    uids: range | None = None) -> TaskUserPolicy:
        """:raises ConfigError: the task user is root, or neither it nor ``nobody`` exists."""
        euid = os.geteuid() if euid is None else euid
        log = get_logger("agent").bind(component="runtime")
        if euid != 0:
            me = pwd.getpwuid(euid)
            if task_user and task_user not in (DEFAULT_TASK_USER, me.pw_name):
                log.warning("task_user_ignored", reason=f"the agent runs as {me.pw_name!r}, not root, and "
                            f"cannot start tasks as {task_user!r}; tasks run as {me.pw_name!r}")
            return cls(_entry(me, switch=False), allowed, euid=euid, getpwnam=getpwnam, uids=None)
        name = task_user or DEFAULT_TASK_USER
        try:
            pw = getpwnam(name)
        except KeyError:
            if task_user and task_user != DEFAULT_TASK_USER:
                raise ConfigError(f"task_user: no such user {task_user!r}") from None
            try:
                pw = getpwnam(FALLBACK_TASK_USER)
            except KeyError:
                raise ConfigError(f"task_user: neither {DEFAULT_TASK_USER!r} nor {FALLBACK_TASK_USER!r} exists; "
                                  f"create {DEFAULT_TASK_USER!r} (make install does) or set --task-user") from None
            log.warning("task_user_fallback", reason=f"user {DEFAULT_TASK_USER!r} does not exist; tasks run as "
                        f"{FALLBACK_TASK_USER!r} (make install creates {DEFAULT_TASK_USER!r})")
        if not root_program("setpriv"):
            raise ConfigError(f"task_user: switching users needs setpriv (util-linux), which is not in {ROOT_PATH}")
        if pw.pw_uid == 0:
            raise ConfigError(f"task_user: {name!r} is root; tasks never run as root by default "
                              "(list 'root' in --task-users-allowed for specs that must)")
        return cls(_entry(pw, switch=True), allowed, euid=euid, getpwnam=getpwnam, uids=uids)

    def resolve(self, requested: str, *, taken: Collection[int] = ()) -> TaskUser:
        """The user for a task whose spec asks for ``requested`` ("" for the default).

        :param taken: uids of the tasks this agent runs now (never handed out again meanwhile).
        :raises GptrmError: the user is not allowed on this node, does not exist, or no uid of
            the range is free.
        """
        if not requested or (requested == self.default.name and self.uids is None):
            return self._own_uid(taken) if self.uids is not None else self.default
        if requested not in self.allowed:
            allowed = ", ".join(self.allowed) or "none"
            raise GptrmError(f"run_as_user {requested!r} is not allowed on this node (allowed: {allowed})")
        if self._euid != 0:
            raise GptrmError(f"run_as_user {requested!r}: the agent is not root and cannot switch users")
        try:
            pw = self._getpwnam(requested)
        except KeyError:
            raise GptrmError(f"run_as_user {requested!r}: no such user on this node") from None
        return _entry(pw, switch=True)

    def _own_uid(self, taken: Collection[int]) -> TaskUser:
        """The least recently handed out uid of the range that no task holds and no process runs as."""
        assert self.uids is not None
        running = uids_running(self.uids)
        busy = set(taken) | running
        n = len(self.uids)
        for step in range(n):
            i = (self._next + step) % n
            uid = self.uids[i]
            if uid in busy or _has_passwd_entry(uid):
                continue
            if self.claims is not None and not self.claims.claim(uid, running):
                continue
            self._next = (i + 1) % n
            return TaskUser.own(uid)
        raise NoRoom(f"no free task uid: all {n} uids of --task-uids {self.uids.start}-{self.uids.stop - 1} "
                         "are in use")

    def room(self, own: Collection[int]) -> int | None:
        """How many tasks with a uid of their own this agent can run at once, as things stand: the uids of
        the range held by ``own`` (its running tasks' uids) or free as :meth:`resolve` would find them (no
        process runs as it, no passwd entry, no other agent's claim). None without a range (no limit). What
        the coordinator places on this node beyond it would be refused with "no free task uid"."""
        if self.uids is None:
            return None
        running = uids_running(self.uids)
        try:
            named = {pw.pw_uid for pw in pwd.getpwall()}
        except OSError:
            named = set()
        elsewhere = self.claims.held_elsewhere(running) if self.claims is not None else set()
        mine = set(own)
        busy = (running | named | elsewhere) - mine
        return len(self.uids) - sum(1 for uid in busy if uid in self.uids)

    def release(self, uid: int) -> None:
        """A task's own uid is free again (its last process is gone, and what it left is removed)."""
        if self.claims is not None:
            self.claims.release(uid)

    def runs_tasks_as(self, uid: int) -> bool:
        """Whether a task of this agent may run as ``uid`` (never root, and never when tasks run as the agent's
        own user: then nothing tells a task from the agent's operator)."""
        if uid == 0 or not self.default.switch:
            return False
        if (self.uids is not None and uid in self.uids) or uid == self.default.uid:
            return True
        for name in self.allowed:
            with contextlib.suppress(KeyError):
                if self._getpwnam(name).pw_uid == uid:
                    return True
        return False

    def held(self) -> list[int]:
        """The task uids this agent has claimed and not released (none without host-wide claims)."""
        return self.claims.held() if self.claims is not None else []

    def resume_after(self, uids: Collection[int]) -> None:
        """After a restart: go on after the highest uid in ``uids`` (the running tasks' own)."""
        if self.uids is not None:
            mine = [u for u in uids if u in self.uids]
            if mine:
                self._next = (self.uids.index(max(mine)) + 1) % len(self.uids)


def _has_passwd_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
