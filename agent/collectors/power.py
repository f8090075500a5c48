"""CPU package power from RAPL energy counters under ``/sys/class/powercap``.

Each package zone (``intel-rapl:0``, ``intel-rapl:1``, ...; AMD CPUs use the same
driver) exposes a cumulative ``energy_uj`` that wraps at ``max_energy_range_uj``. Power is
the energy difference between two ticks over the time between them, summed over packages.
Sub-zones (``intel-rapl:0:0``, core/uncore/dram) are inside their package and are skipped.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from agent.collectors.base import PowerReading
from common.errors import NoData

__all__ = ["DEFAULT_POWERCAP_ROOT", "NAME", "RaplPowerCollector", "energy_delta_uj", "package_zones", "parse_energy_uj"]

NAME = "power"
DEFAULT_POWERCAP_ROOT = "/sys/class/powercap"

_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")


class RaplPowerCollector:
    """Package power over the last tick; raises NoData when RAPL cannot be read.

    Example::

        power = RaplPowerCollector()
        power.collect()            # NoData: the first tick only records the counters
        [reading] = power.collect()

    :param root: the powercap directory (tests pass a temporary tree).
    :param clock: monotonic seconds.
    """

    name = NAME

    def __init__(self, root: str | Path = DEFAULT_POWERCAP_ROOT, clock: Callable[[], float] = time.monotonic) -> None:
        self._root = Path(root)
        self._clock = clock
        self._zones = package_zones(self._root)
        # The wrap point is fixed by the hardware; read it once.
        self._max_range = {zone: self._read_max_range(zone) for zone in self._zones}
        self._last: tuple[float, dict[Path, int]] | None = None

    def collect(self) -> list[PowerReading]:
        """Power since the previous call.

        :raises NoData: no package zone, a counter is unreadable (``energy_uj`` is root-only on
            most kernels), or this is the first reading.
        """
        if not self._zones:
            raise NoData(f"no RAPL package zone under {self._root}")
        now = self._clock()
        energy = {zone: self._read_energy(zone) for zone in self._zones}
        last, self._last = self._last, (now, energy)
        if last is None or now <= last[0]:
            raise NoData("RAPL needs two readings to compute power")
        then, previous = last
        joules = sum(energy_delta_uj(previous[z], energy[z], self._max_range[z]) for z in self._zones) / 1e6
        return [PowerReading(cpu_power_w=joules / (now - then))]

    @staticmethod
    def _read_energy(zone: Path) -> int:
        try:
            return parse_energy_uj((zone / "energy_uj").read_text())
        except (OSError, ValueError) as e:
            raise NoData(f"cannot read {zone / 'energy_uj'}: {e}") from e

    @staticmethod
    def _read_max_range(zone: Path) -> int:
        try:
            return parse_energy_uj((zone / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            # Without the range a wrap cannot be undone; energy_delta_uj then reports 0.
            return 0


def package_zones(root: Path) -> list[Path]:
    """The package-level RAPL zones under ``root``, sorted by name."""
    try:
        return sorted(p for p in root.iterdir() if _PACKAGE_ZONE.match(p.name))
    except OSError:
        return []


def parse_energy_uj(text: str) -> int:
    """The integer in an ``energy_uj`` or ``max_energy_range_uj`` file.

    :raises ValueError: when the text is not a non-negative integer.
    """
    value = int(text.strip())
    if value < 0:
        raise ValueError(f"negative energy counter {value}")
    return value


def energy_delta_uj(previous: int, current: int, max_range: int) -> int:
    """Energy used between two counter readings, undoing one wraparound.

    :param previous: the earlier ``energy_uj``. :param current: the later one.
    :param max_range: ``max_energy_range_uj``, the value at which the counter wraps to 0.
    :returns: microjoules; 0 when the counter went back and the range is unknown.
    """
    if current >= previous:
        return current - previous
    if max_range <= 0:
        return 0
    return max_range - previous + current
