"""The simulated node provider: power changes complete after a virtual delay on the simulator's clock."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.adaptor.providers import SimulatedProvider


class TestSimulatedProvider:
    """Accepts power requests at once, completes them after the boot/shutdown delay, refuses create."""

    def test_power_on_completes_after_boot_time(self) -> None:
        """A power-on accepted at 100 with 30 s boot completes at 130, not before; the node draws power meanwhile."""
        clock = [100.0]
        provider = SimulatedProvider(lambda: clock[0], boot_s=30.0, shutdown_s=5.0)
        assert asyncio.run(provider.request("power_off", "n1", "idle")).ok
        assert provider.completed(104.0) == []
        assert provider.powered("n1")
        assert provider.completed(105.0) == [("power_off", "n1")]
        assert not provider.powered("n1")
        assert asyncio.run(provider.request("power_on", "n1", "task t needs it")).ok
        assert provider.powered("n1")
        assert provider.next_due() == 130.0
        assert provider.completed(129.0) == []
        assert provider.completed(130.0) == [("power_on", "n1")]
        assert provider.next_due() is None

    def test_create_is_refused(self) -> None:
        """A replay's cluster is fixed: create is refused without being attempted."""
        result = asyncio.run(SimulatedProvider(lambda: 0.0).request("create", "", "fits nowhere", {"gpus": 8}))
        assert (result.ok, result.attempted) == (False, False)

    def test_bad_input_is_refused(self) -> None:
        """A negative delay or an unknown action is a clear error."""
        with pytest.raises(ValueError, match="boot_s=-1"):
            SimulatedProvider(lambda: 0.0, boot_s=-1.0)
        with pytest.raises(ValueError, match="unknown provider action 'reboot'"):
            asyncio.run(SimulatedProvider(lambda: 0.0).request("reboot", "n1", ""))
