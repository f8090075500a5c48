"""The event-loop thread's CPU class (coordinator/loop_priority.py), tried in child processes so that the test
runner's own threads keep theirs."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from common.errors import ConfigError
from coordinator import config as config_mod
from coordinator.loop_priority import current, raise_to

REPO = Path(__file__).resolve().parents[3]

_PROBE = textwrap.dedent("""
    import json, os, subprocess, sys, threading
    from coordinator.loop_priority import raise_to
    got, refused = raise_to(sys.argv[1])
    seen = {}
    t = threading.Thread(target=lambda: seen.update(policy=os.sched_getscheduler(0)))
    t.start(); t.join()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                           capture_output=True, text=True, check=True)
    print(json.dumps({"policy": got.policy, "priority": got.priority, "reset": got.reset_on_fork,
                      "refused": refused, "thread": seen["policy"], "child": int(child.stdout)}))
""")


def _probe(wanted: str, *wrap: str, rtprio: int | None = None) -> dict[str, object]:
    def limit() -> None:   # (an RLIMIT_RTPRIO above 0 would allow SCHED_RR 1 without the capability)
        if rtprio is not None:
            resource.setrlimit(resource.RLIMIT_RTPRIO, (rtprio, rtprio))
    out = subprocess.run([*wrap, sys.executable, "-c", _PROBE, wanted], capture_output=True, text=True, timeout=60,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=limit, check=True)
    return json.loads(out.stdout)


def test_normal_changes_nothing_and_an_unknown_class_is_refused() -> None:
    before = current()
    assert raise_to("normal") == (before, "")
    assert current() == before
    with pytest.raises(ValueError, match="loop priority must be one of normal, realtime, got 'fast'"):
        raise_to("fast")


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_RR needs root or CAP_SYS_NICE")
def test_realtime_is_the_calling_thread_only() -> None:
    """The thread is SCHED_RR 1 with reset-on-fork; a thread and a process it starts afterwards run normal."""
    seen = _probe("realtime")
    assert seen == {"policy": "realtime", "priority": 1, "reset": True, "refused": "", "thread": os.SCHED_OTHER,
                    "child": os.SCHED_OTHER}


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="dropping CAP_SYS_NICE needs root and setpriv")
def test_refused_without_the_privilege_says_why_and_stays_normal() -> None:
    seen = _probe("realtime", "setpriv", "--bounding-set", "-sys_nice", "--inh-caps", "-sys_nice", rtprio=0)
    assert seen["policy"] == "normal" and seen["priority"] == 0
    assert isinstance(seen["refused"], str) and seen["refused"].startswith("SCHED_RR refused (")
    assert "CAP_SYS_NICE" in seen["refused"] and "RLIMIT_RTPRIO" in seen["refused"]


def test_the_setting_is_checked_by_name() -> None:
    with pytest.raises(ConfigError, match=r"^loop_priority: must be one of normal, realtime, got 'fast'"):
        config_mod.load(["--insecure", "--loop-priority", "fast"])
    assert config_mod.load(["--insecure"]).loop_priority == "normal"
    assert config_mod.load(["--insecure", "--loop-priority", "realtime"]).loop_priority == "realtime"
