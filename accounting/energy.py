"""An engine's cumulative energy over wall-clock time, and its energy per grid interval (pure).

Readings are (timestamp_s, total_j) with total_j summed over the engine's GPUs. The energy at
an interval boundary is interpolated linearly between the readings around it, so a meter that
lags or skips polls still hands every joule to some interval: what the counter has not shown
yet lands in a later interval (carried forward), never dropped. A drop in the counter (a reset
the meter could not see, or a new process whose counter starts lower than the ledger's
boundary) re-bases the series at the last value; it is counted in `resets`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Boundary:
    """The energy the ledger has apportioned up to: cumulative total_j at time_s."""

    time_s: float
    energy_j: float


class EnergyTrack:
    __slots__ = ("_e", "_offset", "_t", "estimated", "resets")

    def __init__(self, start: Boundary | None = None):
        self._t: list[float] = []
        self._e: list[float] = []
        self._offset = 0.0
        self.resets = 0
        self.estimated = False
        if start is not None:
            self._t.append(start.time_s)
            self._e.append(start.energy_j)

    def add(self, time_s: float, total_j: float, *, estimated: bool = False) -> None:
        if estimated:
            self.estimated = True
        if self._t and time_s <= self._t[-1]:
            return  # stale or duplicate reading
        value = total_j + self._offset
        if self._e and value < self._e[-1]:
            self._offset += self._e[-1] - value
            value = self._e[-1]
            self.resets += 1
        self._t.append(time_s)
        self._e.append(value)

    @property
    def latest(self) -> Boundary | None:
        return Boundary(self._t[-1], self._e[-1]) if self._t else None

    @property
    def first(self) -> Boundary | None:
        return Boundary(self._t[0], self._e[0]) if self._t else None

    def energy_at(self, time_s: float, *, hold: bool = False) -> float | None:
        """Cumulative energy at time_s; None when no reading reaches it yet (unless `hold`,
        which uses the latest value and so carries the rest forward). Before the first
        reading the first value is used."""
        if not self._t:
            return None
        if time_s > self._t[-1]:
            return self._e[-1] if hold else None
        i = bisect.bisect_left(self._t, time_s)
        if i == 0:
            return self._e[0]
        t0, t1 = self._t[i - 1], self._t[i]
        e0, e1 = self._e[i - 1], self._e[i]
        return e0 + (e1 - e0) * (time_s - t0) / (t1 - t0)

    def anchor(self, start: Boundary) -> None:
        """Continue from a boundary stored by an earlier apportioner. When this track's own
        readings reach back to it they are kept as they are (self-consistent differences);
        otherwise the boundary becomes the first point, and a counter that restarted below it
        is re-based so no interval gets negative energy."""
        if self._t and self._t[0] <= start.time_s:
            return
        if self._e and self._e[0] < start.energy_j:
            shift = start.energy_j - self._e[0]
            self._e = [e + shift for e in self._e]
            self._offset += shift
            self.resets += 1
        self._t.insert(0, start.time_s)
        self._e.insert(0, start.energy_j)

    def prune(self, before_s: float) -> None:
        """Drop readings no longer needed to interpolate at or after before_s."""
        i = bisect.bisect_left(self._t, before_s) - 1
        if i > 0:
            del self._t[:i]
            del self._e[:i]
