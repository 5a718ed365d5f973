"""The meter protocol and the pieces every meter kind shares.

A meter returns cumulative joules per GPU (in the order of the GPUs it was given) with a
wall-clock timestamp. Hardware counters can reset (driver reload, GPU reset) or wrap;
`ResetTracker` turns raw counters into a monotonic series so that energy measured before a
reset is never lost: after a reset the raw counter restarts near zero and the tracker adds
the last value seen before it as an offset. Energy spent between the last read before a
reset and the reset itself is unknowable and is not invented.

A tracker's offsets live in one process. A reading also carries the raw counters it came from
(`EnergyReading.raw_j`), so that whoever keeps the books across process restarts (the
gateway's ledger) can keep its own offsets and resume them (`ResetTracker.resumed`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class MeterError(RuntimeError):
    """A meter could not produce a reading (device gone, HTTP error, bad payload)."""


class CounterUnsupportedError(MeterError):
    """The device has no energy counter (pre-Volta GPU, MIG instance, GH200 GPU scope)."""


@dataclass(frozen=True, slots=True)
class EnergyReading:
    """Cumulative energy of each metered GPU at `timestamp_s` (wall clock, seconds)."""

    timestamp_s: float
    energy_j: tuple[float, ...]
    estimated: bool = False  # True when no hardware counter stands behind the numbers
    resets: int = 0  # counter resets or wraps seen so far by this meter
    idle_power_w: float | None = None  # the source's own idle power, when it publishes one
    # Each GPU's counter as read, before any reset offset (None: the meter has no raw counter).
    # Taken from `energy_j` when that came out of a ResetTracker, so no meter has to pass it.
    raw_j: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.raw_j is None and isinstance(self.energy_j, Tracked):
            object.__setattr__(self, "raw_j", self.energy_j.raw_j)

    @property
    def total_j(self) -> float:
        """The engine's energy: the sum over all its GPUs."""
        return math.fsum(self.energy_j)


class Meter(Protocol):
    kind: str
    estimated: bool

    async def read(self) -> EnergyReading:
        """One reading; raises MeterError when the source cannot be read."""
        ...

    async def close(self) -> None: ...


class Tracked(tuple[float, ...]):
    """Monotonic joules per GPU (a ResetTracker's output) that remember the raw counters they
    were made from (`raw_j`)."""

    raw_j: tuple[float, ...]

    def __new__(cls, values: Sequence[float], raw_j: Sequence[float]) -> Tracked:
        self = super().__new__(cls, values)
        self.raw_j = tuple(raw_j)
        return self


class ResetTracker:
    """Makes raw per-GPU counters monotonic across resets and wraps."""

    __slots__ = ("_last_raw", "_offset", "resets")

    def __init__(self, n_gpus: int):
        self._last_raw: list[float | None] = [None] * n_gpus
        self._offset = [0.0] * n_gpus
        self.resets = 0

    @classmethod
    def resumed(cls, last_raw_j: Sequence[float], offset_j: Sequence[float],
                resets: int) -> ResetTracker:
        """A tracker that continues one stopped earlier: the raw counters it last saw and the
        offsets it had added. A counter below its last raw value when next read restarted
        meanwhile, and is handled as a reset seen live."""
        if len(last_raw_j) != len(offset_j):
            raise ValueError(f"{len(last_raw_j)} raw counters but {len(offset_j)} offsets")
        tracker = cls(len(last_raw_j))
        tracker._last_raw = [float(r) for r in last_raw_j]
        tracker._offset = [float(o) for o in offset_j]
        tracker.resets = resets
        return tracker

    @property
    def last_raw_j(self) -> tuple[float, ...] | None:
        """The raw counters of the last update (None before the first)."""
        raws = [r for r in self._last_raw if r is not None]
        return tuple(raws) if len(raws) == len(self._last_raw) else None

    @property
    def offset_j(self) -> tuple[float, ...]:
        """What is added to each raw counter: the energy counted before its resets."""
        return tuple(self._offset)

    def bridge(self, index: int, joules: float) -> None:
        """Add `joules` to a counter's offset: an estimate of what it spent, unread, before
        its last reset (the caller says it is an estimate)."""
        self._offset[index] += joules

    def update(self, raw_j: Sequence[float]) -> Tracked:
        out = []
        for i, raw in enumerate(raw_j):
            last = self._last_raw[i]
            if last is not None and raw < last:
                # The counter restarted (or wrapped): everything up to `last` was measured.
                self._offset[i] += last
                self.resets += 1
            self._last_raw[i] = raw
            out.append(self._offset[i] + raw)
        return Tracked(out, raw_j)


def pick_gpus(by_index: dict[int, float], gpus: Sequence[int], source: str) -> list[float]:
    """Counters of the configured GPUs, in config order; a missing GPU is an error."""
    missing = [g for g in gpus if g not in by_index]
    if missing:
        raise MeterError(f"{source}: no energy counter for GPU {missing[0]} "
                         f"(has {sorted(by_index)})")
    return [by_index[g] for g in gpus]
