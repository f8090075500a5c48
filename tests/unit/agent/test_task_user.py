"""Which user a task runs as (agent.task_user)."""

from __future__ import annotations

import os
import pwd

import pytest

from agent.task_user import TaskUserPolicy
from common.errors import ConfigError, GptrmError


def _pw(name: str, uid: int) -> pwd.struct_passwd:
    return pwd.struct_passwd((name, "x", uid, uid, "", f"/home/{name}", "/bin/sh"))


def _lookup(*users: tuple[str, int]):
    table = {n: _pw(n, u) for n, u in users}

    def getpwnam(name: str) -> pwd.struct_passwd:
        return table[name]
    return getpwnam


class TestTaskUserPolicy:
    def test_root_agent_uses_the_task_user(self) -> None:
        """A root agent runs tasks as gptrm-task when that user exists."""
        p = TaskUserPolicy.from_config("gptrm-task", [], euid=0, getpwnam=_lookup(("gptrm-task", 990)))
        assert (p.default.name, p.default.uid, p.default.switch) == ("gptrm-task", 990, True)

    def test_root_agent_falls_back_to_nobody(self) -> None:
        """Without a gptrm-task user a root agent drops to nobody, never root."""
        p = TaskUserPolicy.from_config("gptrm-task", [], euid=0, getpwnam=_lookup(("nobody", 65534)))
        assert (p.default.name, p.default.uid) == ("nobody", 65534)

    def test_root_as_task_user_is_refused(self) -> None:
        """Configuring root (uid 0) as the task user stops start-up with a clear error."""
        with pytest.raises(ConfigError, match="is root"):
            TaskUserPolicy.from_config("toor", [], euid=0, getpwnam=_lookup(("toor", 0)))

    def test_missing_explicit_user_is_an_error(self) -> None:
        """An explicitly configured user that does not exist is an error, not a silent fallback."""
        with pytest.raises(ConfigError, match="no such user 'ml'"):
            TaskUserPolicy.from_config("ml", [], euid=0, getpwnam=_lookup(("nobody", 65534)))

    def test_non_root_agent_runs_tasks_as_itself(self) -> None:
        """An agent that is not root runs tasks as its own user and does not switch."""
        p = TaskUserPolicy.from_config("gptrm-task", [], euid=os.geteuid() or 65534)
        assert not p.default.switch and p.default.uid == (os.geteuid() or 65534)

    def test_spec_user_only_from_the_allowlist(self) -> None:
        """A spec may name another user only if the allowlist has it."""
        p = TaskUserPolicy.from_config("gptrm-task", ["train"], euid=0,
                                       getpwnam=_lookup(("gptrm-task", 990), ("train", 1001), ("root", 0)))
        assert p.resolve("").name == "gptrm-task"
        assert p.resolve("train").uid == 1001
        with pytest.raises(GptrmError, match="'root' is not allowed on this node"):
            p.resolve("root")
