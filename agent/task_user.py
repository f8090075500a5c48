"""Which Unix user a task runs as: never root by default.

- An agent running as root starts tasks as ``--task-user`` (default ``gptrm-task``, created by
  ``make install``). When that user does not exist the agent falls back to ``nobody`` and says
  so in its log; a task user that resolves to uid 0 is refused at start-up.
- An agent that is not root (``make run`` by a developer) cannot switch users: tasks run as the
  agent's own user, whatever ``--task-user`` says.
- A spec may ask for another user (``run_as_user``) only if ``--task-users-allowed`` lists it;
  root only if the list names ``root`` explicitly.

Example::

    policy = TaskUserPolicy.from_config("gptrm-task", ["train"])
    who = policy.resolve("")            # the default task user
    who = policy.resolve("train")       # allowed; any other name raises GptrmError
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from common.errors import ConfigError, GptrmError
from common.logging import get_logger

__all__ = ["DEFAULT_TASK_USER", "FALLBACK_TASK_USER", "TaskUser", "TaskUserPolicy"]

DEFAULT_TASK_USER = "gptrm-task"
FALLBACK_TASK_USER = "nobody"


@dataclass(frozen=True, slots=True)
class TaskUser:
    """A resolved task user; ``switch`` is False when tasks run as the agent's own user."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...]
    switch: bool

    def setpriv_argv(self) -> list[str]:
        """The prefix that drops to this user before exec.

        ``setpriv`` (util-linux) rather than ``subprocess(user=...)``: switching credentials in a
        forked child of a process with gRPC threads can crash the child before exec, while a plain
        exec of setpriv is safe. ``--no-new-privs`` keeps setuid programs from regaining root.
        """
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}",
                f"--groups={','.join(map(str, self.groups or (self.gid,)))}", "--no-new-privs", "--"]

    def env(self) -> dict[str, str]:
        """HOME, USER and LOGNAME for the task's environment."""
        home = self.home if self.home and self.home != "/nonexistent" else "/"
        return {"HOME": home, "USER": self.name, "LOGNAME": self.name}


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
    """

    def __init__(self, default: TaskUser, allowed: Sequence[str], *, euid: int,
                 getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam) -> None:
        self.default = default
        self.allowed = tuple(allowed)
        self._euid = euid
        self._getpwnam = getpwnam

    @classmethod
    def from_config(cls, task_user: str, allowed: Sequence[str], *, euid: int | None = None,
                    getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam) -> TaskUserPolicy:
        """:raises ConfigError: the task user is root, or neither it nor ``nobody`` exists."""
        euid = os.geteuid() if euid is None else euid
        log = get_logger("agent").bind(component="runtime")
        if euid != 0:
            me = pwd.getpwuid(euid)
            if task_user and task_user not in (DEFAULT_TASK_USER, me.pw_name):
                log.warning("task_user_ignored", reason=f"the agent runs as {me.pw_name!r}, not root, and "
                            f"cannot start tasks as {task_user!r}; tasks run as {me.pw_name!r}")
            return cls(_entry(me, switch=False), allowed, euid=euid, getpwnam=getpwnam)
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
        if shutil.which("setpriv") is None:
            raise ConfigError("task_user: switching users needs setpriv (util-linux), which is not on PATH")
        if pw.pw_uid == 0:
            raise ConfigError(f"task_user: {name!r} is root; tasks never run as root by default "
                              "(list 'root' in --task-users-allowed for specs that must)")
        return cls(_entry(pw, switch=True), allowed, euid=euid, getpwnam=getpwnam)

    def resolve(self, requested: str) -> TaskUser:
        """The user for a task whose spec asks for ``requested`` ("" for the default).

        :raises GptrmError: the user is not allowed on this node, or does not exist.
        """
        if not requested or requested == self.default.name:
            return self.default
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
