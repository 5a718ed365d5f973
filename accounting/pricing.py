"""Carbon and cost from joules (pure).

carbon_g = kWh * PUE * intensity(t) + embodied_g_per_gpu_s * GPU-seconds
cost_usd = kWh * PUE * price(t) + gpu_hour_usd * GPU-seconds / 3600
Intensity (gCO2e/kWh, location-based as in ISO/IEC 21031 SCI) and price (USD/kWh) are a
constant or a step time series read from CSV (`timestamp,value`; timestamp as Unix seconds
or ISO 8601; each value holds until the next row).
"""

from __future__ import annotations

import bisect
import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

J_PER_KWH = 3.6e6

# Grid intensity 2023, gCO2e/kWh (docs/architecture.md, "Sources of the constants").
REGION_INTENSITY: dict[str, float] = {
    "NO": 30.0, "SE": 41.0, "FR": 56.0, "GB": 238.0, "US": 369.0, "DE": 381.0, "JP": 485.0,
    "CN": 582.0, "PL": 662.0, "IN": 713.0, "WORLD": 475.0,
}


@dataclass(frozen=True, slots=True)
class Series:
    """A constant (no times) or a step function of wall-clock time."""

    times_s: tuple[float, ...]
    values: tuple[float, ...]

    @classmethod
    def constant(cls, value: float) -> Series:
        return cls((), (value,))

    def at(self, t_s: float) -> float:
        if not self.times_s:
            return self.values[0]
        i = bisect.bisect_right(self.times_s, t_s) - 1
        return self.values[max(i, 0)]

    def span(self, t_s: float) -> tuple[float, float]:
        """[from, until): the times around `t_s` over which `at` gives what it gives at
        `t_s` (the first value holds from the start, the last to the end)."""
        times = self.times_s
        j = max(bisect.bisect_right(times, t_s), 1)  # `at` takes values[j - 1]
        return (times[j - 1] if j > 1 else -math.inf, times[j] if j < len(times) else math.inf)


def _parse_time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        stamp = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        return stamp.timestamp()


def series_from_rows(rows: Sequence[Sequence[str]], source: str) -> Series:
    points = []
    for n, row in enumerate(rows, 1):
        if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
            continue
        try:
            points.append((_parse_time(row[0]), float(row[1])))
        except (ValueError, IndexError):
            if n == 1:
                continue  # a header line
            raise ValueError(f"{source}:{n}: expected 'timestamp,value'") from None
    if not points:
        raise ValueError(f"{source}: no data rows")
    points.sort()
    return Series(tuple(p[0] for p in points), tuple(p[1] for p in points))


def series_from_csv(path: Path) -> Series:
    with path.open(newline="") as fh:
        return series_from_rows(list(csv.reader(fh)), str(path))


WORLD_INTENSITY = Series.constant(REGION_INTENSITY["WORLD"])
DEFAULT_PRICE = Series.constant(0.08)  # USD/kWh, US industrial ~0.06-0.10


@dataclass(frozen=True, slots=True)
class Pricing:
    pue: float = 1.0
    intensity_g_per_kwh: Series = WORLD_INTENSITY
    price_usd_per_kwh: Series = DEFAULT_PRICE
    gpu_hour_usd: float = 0.0
    embodied_g_per_gpu_s: float = 0.0

    def carbon_g(self, energy_j: float, gpu_s: float, t_s: float) -> float:
        return self.charges((energy_j,), (gpu_s,), t_s)[0][0]

    def cost_usd(self, energy_j: float, gpu_s: float, t_s: float) -> float:
        return self.charges((energy_j,), (gpu_s,), t_s)[1][0]

    def charges(self, energy_j: Sequence[float], gpu_s: Sequence[float], t_s: float
                ) -> tuple[list[float], list[float]]:
        """carbon_g and cost_usd of many (energy_j, gpu_s) at one time, with the time series
        looked up once (the single-value methods are this with one of each)."""
        pue = self.pue
        intensity = self.intensity_g_per_kwh.at(t_s)
        price = self.price_usd_per_kwh.at(t_s)
        embodied = self.embodied_g_per_gpu_s
        gpu_hour = self.gpu_hour_usd
        kwh = [e / J_PER_KWH for e in energy_j]
        carbon = [q * pue * intensity + embodied * g for q, g in zip(kwh, gpu_s, strict=True)]
        cost = [q * pue * price + gpu_hour * g / 3600.0 for q, g in zip(kwh, gpu_s, strict=True)]
        return carbon, cost
