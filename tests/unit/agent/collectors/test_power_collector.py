"""RAPL power collector over a temporary powercap tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.collectors.power import RaplPowerCollector, energy_delta_uj, package_zones, parse_energy_uj
from common.errors import NoData
from tests.helpers.clock import FakeClock

MAX_RANGE_UJ = 262_143_328_850


def write_zone(root: Path, name: str, energy_uj: int, max_range_uj: int = MAX_RANGE_UJ) -> None:
    """Create or update one powercap zone."""
    zone = root / name
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_range_uj}\n")


@pytest.fixture
def powercap(tmp_path: Path) -> Path:
    """Two packages, each with a core sub-zone that must not be counted twice."""
    write_zone(tmp_path, "intel-rapl:0", 1_000_000)
    write_zone(tmp_path, "intel-rapl:0:0", 900_000)
    write_zone(tmp_path, "intel-rapl:1", 5_000_000)
    write_zone(tmp_path, "intel-rapl:1:0", 4_000_000)
    return tmp_path


class TestRaplPowerCollector:
    """Package power from energy counter differences."""

    def test_first_reading_is_no_data(self, powercap: Path, clock: FakeClock) -> None:
        """The first tick only records the counters."""
        with pytest.raises(NoData, match="two readings"):
            RaplPowerCollector(powercap, clock).collect()

    def test_power_summed_over_packages(self, powercap: Path, clock: FakeClock) -> None:
        """Power is the packages' energy difference over the elapsed time; sub-zones are skipped."""
        power = RaplPowerCollector(powercap, clock)
        with pytest.raises(NoData):
            power.collect()
        write_zone(powercap, "intel-rapl:0", 1_000_000 + 120_000_000)  # +120 J
        write_zone(powercap, "intel-rapl:1", 5_000_000 + 80_000_000)  # +80 J
        write_zone(powercap, "intel-rapl:0:0", 900_000 + 999_000_000)  # inside package 0: ignored
        clock.advance(2.0)
        [reading] = power.collect()
        assert reading.cpu_power_w == pytest.approx(100.0)  # (120 J + 80 J) / 2 s

    def test_wraparound(self, powercap: Path, clock: FakeClock) -> None:
        """A counter that wrapped past max_energy_range_uj still yields the right energy."""
        write_zone(powercap, "intel-rapl:0", MAX_RANGE_UJ - 10_000_000)
        power = RaplPowerCollector(powercap, clock)
        with pytest.raises(NoData):
            power.collect()
        write_zone(powercap, "intel-rapl:0", 40_000_000)  # wrapped: 10 J before the wrap, 40 J after
        clock.advance(1.0)
        [reading] = power.collect()
        assert reading.cpu_power_w == pytest.approx(50.0)  # package 0: 50 J; package 1 unchanged

    def test_unreadable_counter_is_no_data(self, powercap: Path, clock: FakeClock) -> None:
        """An energy_uj that cannot be read (root-only on most kernels) gives NoData, not a failure."""
        power = RaplPowerCollector(powercap, clock)
        (powercap / "intel-rapl:1" / "energy_uj").unlink()
        with pytest.raises(NoData, match="cannot read"):
            power.collect()

    def test_no_zones_is_no_data(self, tmp_path: Path, clock: FakeClock) -> None:
        """A machine without RAPL (VMs, ARM) gives NoData."""
        with pytest.raises(NoData, match="no RAPL package zone"):
            RaplPowerCollector(tmp_path / "absent", clock).collect()


class TestRaplHelpers:
    """The pure helpers."""

    def test_package_zones(self, powercap: Path) -> None:
        """Only package-level zones are listed, sorted."""
        assert [z.name for z in package_zones(powercap)] == ["intel-rapl:0", "intel-rapl:1"]

    @pytest.mark.parametrize(
        ("previous", "current", "max_range", "expected"),
        [
            (100, 250, 1000, 150),
            (900, 100, 1000, 200),  # wrapped: (1000 - 900) + 100
            (900, 100, 0, 0),  # wrapped with an unknown range: no guess
        ],
    )
    def test_energy_delta(self, previous: int, current: int, max_range: int, expected: int) -> None:
        """The difference between two counter readings, undoing one wrap."""
        assert energy_delta_uj(previous, current, max_range) == expected

    @pytest.mark.parametrize("text", ["", "abc", "-5"])
    def test_parse_energy_rejects_garbage(self, text: str) -> None:
        """Non-numeric or negative counter text is a ValueError."""
        with pytest.raises(ValueError):
            parse_energy_uj(text)

    def test_parse_energy(self) -> None:
        """The counter file's integer, whitespace stripped."""
        assert parse_energy_uj("123456\n") == 123456
