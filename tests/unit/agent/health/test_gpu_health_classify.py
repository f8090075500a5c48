"""The one classification of GPU health signals (agent/health/classify.py)."""

from __future__ import annotations

import pytest
import structlog

from agent.health import GpuHealthTracker, GpuSignals, HealthWatch, XidPolicy, parse_xids
from agent.health.classify import CLOCKS_HW_POWER_BRAKE, CLOCKS_HW_SLOWDOWN, CLOCKS_HW_THERMAL
from common.errors import ConfigError, ValidationError


def tracker(policy: XidPolicy | None = None, *, simulated: bool = False) -> GpuHealthTracker:
    return GpuHealthTracker(policy or XidPolicy(), simulated=simulated)


def state(reading: object) -> tuple[str, str, str, str]:
    return (reading.state, reading.action, reading.reason, reading.evidence)  # type: ignore[attr-defined]


class TestXids:
    """XID events by the configured lists."""

    @pytest.mark.parametrize("xid", [13, 31, 43, 45, 68])
    def test_application_xid_leaves_the_gpu_healthy_and_is_counted(self, xid: int) -> None:
        """An application XID is the task's fault: the GPU stays healthy, the XID is counted with its time."""
        t = tracker()
        r = t.update(GpuSignals(xids=((xid, 50.0),)), 100.0)
        assert r.state == "healthy"
        assert (r.app_xid_count, r.app_xid_last, r.app_xid_unix_s) == (1, xid, 50.0)
        r = t.update(GpuSignals(xids=((xid, 60.0), (31, 61.0))), 101.0)
        assert (r.app_xid_count, r.app_xid_last, r.app_xid_unix_s) == (3, 31, 61.0)

    @pytest.mark.parametrize("xid", [79, 74])
    def test_replace_xid_holds_until_restart(self, xid: int) -> None:
        """XID 79 (fell off the bus) makes the GPU unhealthy with action replace; a reset does not clear it."""
        t = tracker()
        assert state(t.update(GpuSignals(xids=((xid, 1.0),)), 100.0)) == ("unhealthy", "replace", f"xid {xid}",
                                                                          f"xid={xid}")
        r = t.update(GpuSignals(reset_seen=True, ecc_uncorrected_volatile=0), 200.0)
        assert (r.state, r.action, r.since_unix_s) == ("unhealthy", "replace", 100.0)

    @pytest.mark.parametrize("xid", [48, 63, 64, 92, 94, 95])
    def test_reset_xid_holds_until_a_reset_is_seen(self, xid: int) -> None:
        """A reset-kind XID holds the GPU unhealthy (action reset) until the GPU shows it was reset."""
        t = tracker()
        assert state(t.update(GpuSignals(xids=((xid, 1.0),)), 100.0))[:3] == ("unhealthy", "reset", f"xid {xid}")
        assert t.update(GpuSignals(), 110.0).state == "unhealthy"
        r = t.update(GpuSignals(reset_seen=True), 120.0)
        assert (r.state, r.action, r.reason, r.since_unix_s) == ("healthy", "none", "", 120.0)

    def test_unknown_xid_needs_a_reset(self) -> None:
        """An XID in no list is treated as critical: unhealthy until a reset, named unclassified."""
        r = tracker().update(GpuSignals(xids=((999, 1.0),)), 100.0)
        assert state(r) == ("unhealthy", "reset", "xid 999 (unclassified)", "xid=999")

    def test_overridden_lists(self) -> None:
        """The lists come from the config: 13 made a reset XID, 79 an application one."""
        policy = XidPolicy.from_lists("79", "13", "")
        t = tracker(policy)
        assert t.update(GpuSignals(xids=((79, 1.0),)), 100.0).state == "healthy"
        assert state(t.update(GpuSignals(xids=((13, 2.0),)), 101.0))[:3] == ("unhealthy", "reset", "xid 13")

    def test_replace_outranks_reset(self) -> None:
        """With both a reset-kind and a replace-kind finding the action is replace, named by its reason."""
        r = tracker().update(GpuSignals(xids=((48, 1.0), (79, 1.0))), 100.0)
        assert (r.action, r.reason) == ("replace", "xid 79")

    def test_simulated_is_labelled(self) -> None:
        """Simulated signals say so, in the flag and in the evidence."""
        r = tracker(simulated=True).update(GpuSignals(xids=((79, 1.0),)), 100.0)
        assert r.simulated and r.evidence == "xid=79 (simulated)"


class TestXidLists:
    """The config's comma lists."""

    def test_parse(self) -> None:
        assert parse_xids(" 31,13,,13 ", "app_xids") == (13, 31)
        assert parse_xids("", "app_xids") == ()

    @pytest.mark.parametrize("text", ["13,x", "0", "70000", "-3", "1.5"])
    def test_bad_entry_names_the_field(self, text: str) -> None:
        with pytest.raises(ValidationError) as info:
            parse_xids(text, "reset_xids")
        assert info.value.field == "reset_xids"

    def test_an_xid_in_two_lists_is_refused(self) -> None:
        """Each XID belongs to one list; the error names both flags."""
        with pytest.raises(ConfigError, match="--replace-xids: XID 79 is also in --app-xids"):
            XidPolicy.from_lists("13,79", "48", "79")

    def test_defaults(self) -> None:
        p = XidPolicy()
        assert [p.kind(x) for x in (13, 48, 79, 1234)] == ["app", "reset", "replace", "unknown"]


class TestLevels:
    """Signals read as levels: they clear when they read healthy again."""

    def test_uncorrectable_ecc_until_the_counter_resets(self) -> None:
        """Volatile uncorrectable ECC > 0 needs a reset; after it the counter reads 0 and the GPU is healthy."""
        t = tracker()
        assert state(t.update(GpuSignals(ecc_uncorrected_volatile=2), 100.0)) == (
            "unhealthy", "reset", "uncorrectable ecc", "ecc_uncorrected_volatile=2")
        assert t.update(GpuSignals(ecc_uncorrected_volatile=0), 110.0).state == "healthy"

    def test_row_remap_pending_then_failure(self) -> None:
        """A pending remap needs a reset and clears when no longer pending; a failure needs a replacement for good."""
        t = tracker()
        r = t.update(GpuSignals(remap_pending=True, remap_failure=False, remapped_uncorrectable=1), 100.0)
        assert (r.state, r.action, r.reason) == ("unhealthy", "reset", "row remap pending")
        assert t.update(GpuSignals(remap_pending=False, remap_failure=False), 101.0).state == "healthy"
        r = t.update(GpuSignals(remap_pending=False, remap_failure=True), 102.0)
        assert state(r) == ("unhealthy", "replace", "row remap failure", "remapped_rows_failure=1")
        assert t.update(GpuSignals(remap_pending=False, remap_failure=False), 103.0).action == "replace"

    def test_unread_signal_keeps_its_last_finding(self) -> None:
        """A slow signal not read this tick (None) keeps what it said last time."""
        t = tracker()
        t.update(GpuSignals(remap_pending=True), 100.0)
        assert t.update(GpuSignals(), 101.0).reason == "row remap pending"

    def test_retired_pages_pending(self) -> None:
        r = tracker().update(GpuSignals(retired_pages_pending=True), 100.0)
        assert (r.state, r.action, r.reason) == ("unhealthy", "reset", "page retirement pending")

    def test_lost_gpu_is_replaced(self) -> None:
        """A GPU NVML calls lost is unhealthy, action replace, until the agent restarts."""
        t = tracker()
        assert state(t.update(GpuSignals(lost="GPU is lost"), 100.0)) == ("unhealthy", "replace", "gpu lost",
                                                                           "GPU is lost")
        assert t.update(GpuSignals(), 101.0).action == "replace"

    def test_reset_required(self) -> None:
        t = tracker()
        assert t.update(GpuSignals(reset_required="Reset Required"), 100.0).action == "reset"
        assert t.update(GpuSignals(), 101.0).state == "healthy"

    @pytest.mark.parametrize(("bits", "reason"), [
        (CLOCKS_HW_THERMAL | CLOCKS_HW_SLOWDOWN, "thermal slowdown"),
        (CLOCKS_HW_POWER_BRAKE | CLOCKS_HW_SLOWDOWN, "power brake"),
        (CLOCKS_HW_SLOWDOWN, "hardware slowdown"),
        (0x20, "thermal slowdown"),
    ])
    def test_throttling_degrades(self, bits: int, reason: str) -> None:
        """Hardware slowdown, thermal slowdown and power brake make the GPU degraded, and clear when they stop."""
        t = tracker()
        assert state(t.update(GpuSignals(clocks_event_reasons=bits), 100.0)) == (
            "degraded", "none", reason, f"clocks_event_reasons={bits:#x}")
        assert t.update(GpuSignals(clocks_event_reasons=0), 101.0).state == "healthy"

    def test_power_cap_and_idle_are_not_faults(self) -> None:
        """Idle clocks (0x1) and the software power cap (0x4, how gptrm itself caps power) leave the GPU healthy."""
        assert tracker().update(GpuSignals(clocks_event_reasons=0x1 | 0x4), 100.0).state == "healthy"

    def test_pcie(self) -> None:
        """A narrower link degrades; a slower generation only while the GPU is busy (idle links slow down)."""
        def pcie(gen: int, width: int, *, busy: bool = False) -> GpuSignals:
            return GpuSignals(pcie_gen=gen, pcie_width=width, pcie_gen_max=5, pcie_width_max=16, busy=busy)

        assert tracker().update(pcie(5, 8), 1.0).evidence == "pcie_width=8 max=16"
        assert tracker().update(pcie(1, 16), 1.0).state == "healthy"
        r = tracker().update(pcie(3, 16, busy=True), 1.0)
        assert (r.state, r.reason, r.evidence) == ("degraded", "pcie link slower", "pcie_gen=3 max=5")

    def test_nvlink_down(self) -> None:
        t = tracker()
        assert state(t.update(GpuSignals(nvlinks_down=(2, 5)), 1.0)) == ("degraded", "none", "nvlink down",
                                                                        "nvlink 2,5 down")
        assert t.update(GpuSignals(nvlinks_down=()), 2.0).state == "healthy"

    def test_unhealthy_outranks_degraded_and_since_stays(self) -> None:
        """The worst finding wins; ``since`` is when the state began, not when its evidence last changed."""
        t = tracker()
        assert t.update(GpuSignals(clocks_event_reasons=CLOCKS_HW_SLOWDOWN), 100.0).since_unix_s == 100.0
        r = t.update(GpuSignals(ecc_uncorrected_volatile=1, clocks_event_reasons=CLOCKS_HW_SLOWDOWN), 110.0)
        assert (r.state, r.since_unix_s) == ("unhealthy", 110.0)
        assert t.update(GpuSignals(ecc_uncorrected_volatile=3), 120.0).since_unix_s == 110.0


class TestWatch:
    """The per-node watch: one tracker per GPU, changes logged once."""

    def test_changes_are_logged_once(self) -> None:
        watch = HealthWatch(2, XidPolicy(), structlog.get_logger(), now=lambda: 100.0)
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):
                watch.update(1, GpuSignals(xids=()) if _ else GpuSignals(xids=((79, 1.0),)))
                watch.update(0, GpuSignals(xids=((13, 1.0),)) if not _ else GpuSignals())
        changed = [e for e in logs if e["event"] == "gpu_health_changed"]
        assert [(e["gpu_index"], e["state"], e["reason"]) for e in changed] == [(1, "unhealthy", "xid 79")]
        assert [(e["gpu_index"], e["xid"]) for e in logs if e["event"] == "gpu_app_xid"] == [(0, 13)]

    def test_forget_starts_over(self) -> None:
        watch = HealthWatch(1, XidPolicy(), structlog.get_logger())
        watch.update(0, GpuSignals(lost="gone"))
        watch.forget(0)
        assert watch.update(0, GpuSignals())[0].state == "healthy"


class TestConfig:
    """The agent's flags for GPU health."""

    def test_flags(self) -> None:
        from agent.config import load

        cfg = load(["--insecure", "--app-xids", "13,31,69", "--replace-xids", "79", "--health-read-interval", "30",
                    "--gpu-health", "off"])
        assert cfg.health.policy.kind(69) == "app" and cfg.health.policy.kind(74) == "unknown"
        assert (cfg.health.read_s, cfg.health.enabled) == (30.0, False)

    def test_defaults(self) -> None:
        from agent.config import load

        health = load(["--insecure"]).health
        assert health.policy == XidPolicy() and health.enabled and health.read_s == 10.0

    def test_an_xid_in_two_lists_refused_at_load(self) -> None:
        from agent.config import load

        with pytest.raises(ConfigError, match="--reset-xids: XID 13 is also in --app-xids"):
            load(["--insecure", "--reset-xids", "13,48"])

    def test_bad_entry_names_the_flag(self) -> None:
        from agent.config import load

        with pytest.raises(ConfigError, match="replace_xids: 'x' is not an XID code"):
            load(["--insecure", "--replace-xids", "79,x"])
