"""Which user a task runs as (agent.task_user)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from agent.task_user import CLAIM_GRACE_S, TaskUserPolicy, UidClaims, parse_uid_range
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


class TestOwnUids:
    def _policy(self, uids: range) -> TaskUserPolicy:
        return TaskUserPolicy.from_config("gptrm-task", ["train"], euid=0,
                                          getpwnam=_lookup(("gptrm-task", 990), ("train", 1001)), uids=uids)

    def test_each_task_gets_a_uid_no_running_task_holds(self) -> None:
        """Tasks get distinct uids of the range, least recently used first, never one in ``taken``."""
        p = self._policy(range(2100000000, 2100000003))
        a = p.resolve("", taken=[])
        b = p.resolve("", taken=[a.uid])
        c = p.resolve("", taken=[a.uid, b.uid])
        assert len({a.uid, b.uid, c.uid}) == 3 and all(u.exclusive and u.switch for u in (a, b, c))
        assert p.resolve("", taken=[b.uid, c.uid]).uid == a.uid   # the only free one
        with pytest.raises(GptrmError, match="no free task uid"):
            p.resolve("", taken=[a.uid, b.uid, c.uid])

    def test_own_uid_has_no_groups_and_home_is_the_workdir(self) -> None:
        """A uid of its own drops every supplementary group and has its working directory as HOME."""
        u = self._policy(range(2100000100, 2100000108)).resolve("")
        assert "--clear-groups" in u.setpriv_argv("/usr/bin/setpriv") and u.env("/w")["HOME"] == "/w"

    def test_named_users_still_come_from_the_allowlist(self) -> None:
        """run_as_user keeps its meaning: an allowed user is shared, not exclusive; others are refused."""
        p = self._policy(range(2100000100, 2100000108))
        assert (p.resolve("train").uid, p.resolve("train").exclusive) == (1001, False)
        with pytest.raises(GptrmError, match="not allowed"):
            p.resolve("gptrm-task")

    def test_not_root_means_no_own_uids(self) -> None:
        """An agent that is not root cannot hand out uids: tasks run as the agent's user."""
        p = TaskUserPolicy.from_config("gptrm-task", [], euid=os.geteuid() or 65534, uids=range(2100000100, 2100000108))
        assert p.uids is None and not p.resolve("").switch

    def test_which_uids_tasks_run_as(self) -> None:
        """Own uids, the task user and allowed users are the tasks'; root and other users are not; an agent that
        is not root runs tasks as itself, and no uid is told from its own."""
        p = TaskUserPolicy.from_config("gptrm-task", ["train", "root"], euid=0, uids=range(2100000100, 2100000108),
                                       getpwnam=_lookup(("gptrm-task", 990), ("train", 1001), ("root", 0)))
        assert [p.runs_tasks_as(u) for u in (2100000100, 2100000107, 990, 1001, 0, 1002, 2100000108)] == [
            True, True, True, True, False, False, False]
        me = TaskUserPolicy.from_config("gptrm-task", [], euid=os.geteuid() or 65534)
        assert not me.runs_tasks_as(me.default.uid)

    @pytest.mark.parametrize("text", ["5-1", "0-10", "abc", "10", "100-4294967295"])
    def test_bad_ranges_name_the_setting(self, text: str) -> None:
        with pytest.raises(ConfigError, match="task_uids"):
            parse_uid_range(text)

    def test_off_and_a_good_range(self) -> None:
        assert parse_uid_range("off") is None
        assert parse_uid_range("2000-2009") == range(2000, 2010)


class TestUidClaims:
    def test_two_agents_never_hand_out_the_same_uid(self, tmp_path: Path) -> None:
        """Two agents on one host with the same range, claims in one directory: their tasks get different uids."""
        uids = range(2100000200, 2100000204)
        a, b = (TaskUserPolicy.from_config("gptrm-task", [], euid=0, getpwnam=_lookup(("gptrm-task", 990)), uids=uids)
                for _ in range(2))
        a.claims, b.claims = UidClaims(tmp_path, "agent-a"), UidClaims(tmp_path, "agent-b")
        got = [a.resolve("").uid, b.resolve("").uid, a.resolve("", taken=[uids[0]]).uid,
               b.resolve("", taken=[uids[1]]).uid]
        assert sorted(got) == list(uids)
        with pytest.raises(GptrmError, match="no free task uid"):
            a.resolve("", taken=[got[0], got[2]])

    def test_a_released_uid_is_free_for_the_other_agent(self, tmp_path: Path) -> None:
        """Once the owner gives a uid back the other agent may take it; a release by a non-owner does nothing."""
        a, b = UidClaims(tmp_path, "agent-a"), UidClaims(tmp_path, "agent-b")
        assert a.claim(2100000300, running=())
        assert not b.claim(2100000300, running=())
        b.release(2100000300)
        assert not b.claim(2100000300, running=())
        a.release(2100000300)
        assert b.claim(2100000300, running=())

    def test_held_lists_this_agents_claims_only(self, tmp_path: Path) -> None:
        """A restarted agent finds the uids it still claims (to clean up after them), not another agent's."""
        a, b = UidClaims(tmp_path, "agent-a"), UidClaims(tmp_path, "agent-b")
        assert a.claim(2100000302, running=()) and a.claim(2100000301, running=()) and b.claim(2100000303, running=())
        assert a.held() == [2100000301, 2100000302] and b.held() == [2100000303]
        a.release(2100000301)
        assert a.held() == [2100000302]

    def test_stale_claims(self, tmp_path: Path) -> None:
        """Another agent's claim stands while a process runs as the uid or within the grace; then it is stale.
        A claim of one's own that no task holds (left from a crash) is taken again at once."""
        now = [1_000_000.0]
        a = UidClaims(tmp_path, "agent-a")
        b = UidClaims(tmp_path, "agent-b", clock=lambda: now[0])
        assert a.claim(2100000400, running=())
        os.utime(tmp_path / "2100000400", (now[0], now[0]))
        assert not b.claim(2100000400, running=())
        now[0] += CLAIM_GRACE_S + 1
        assert not b.claim(2100000400, running={2100000400})
        assert b.claim(2100000400, running=())
        assert UidClaims(tmp_path, "agent-b").claim(2100000400, running=())   # b's own leftover

    def test_a_link_in_place_of_a_claim_is_not_followed(self, tmp_path: Path) -> None:
        """A planted link where a claim file would be is never written through."""
        target = tmp_path / "target"
        target.write_text("keep")
        claims = tmp_path / "claims"
        claims.mkdir()
        (claims / "2100000500").symlink_to(target)
        assert not UidClaims(claims, "agent-a").claim(2100000500, running={2100000500})
        assert target.read_text() == "keep"
