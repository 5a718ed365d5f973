"""One time base per table and plot: wall time, or a simulator's engine time.

A simulated engine with `time_scale` k runs engine time at k x wall time: a run offered at
R engine requests/s is sent at R x k on the wall, and a latency of L wall seconds is L x k
engine seconds. Everything measured on such a fleet is reported in engine time, and every
table and plot names the base it uses.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TimeBase:
    """Engine time = wall time x `time_scale` (1: a single clock, wall time)."""

    time_scale: float = 1.0

    @property
    def name(self) -> str:
        if self.time_scale == 1.0:
            return "wall time"
        return f"engine time (simulator time_scale {self.time_scale:g})"

    @property
    def short(self) -> str:
        return "wall time" if self.time_scale == 1.0 else "engine time"

    def seconds(self, wall_s: float) -> float:
        """A duration measured on the wall, in this base."""
        return wall_s * self.time_scale

    def rate(self, wall_rps: float) -> float:
        """A rate measured on the wall, in this base."""
        return wall_rps / self.time_scale


WALL = TimeBase()
