"""Energy windows of one engine (pure): the joules the accounting service has apportioned,
paired with the work the gateway's records put on the engine over the same wall-clock span.

The accounting service apportions an engine's metered energy interval by interval and keeps,
per engine, the boundary it has reached: (wall-clock end of the last apportioned interval,
the meter's cumulative joules there). Two successive boundaries bound a window whose energy
is their difference, exactly what the ledger booked for it (requests plus idle). The records
give the window's work: prompt tokens at the first token, output tokens spread evenly over
the decode span, and residency (dispatch to finish) whose mean is the window's load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from core.records import RequestRecord
from gateway.routing.models import EnergyWindow

HORIZON_S = 300.0  # work older than this behind the newest boundary is dropped unpaired


@dataclass(slots=True)
class _Slot:
    prompt: float = 0.0
    output: float = 0.0
    resident_s: float = 0.0


def _spread(slots: dict[int, _Slot], start_s: float, end_s: float, grid_s: float,
            attr: str, total: float) -> None:
    """Add `total` over [start_s, end_s] in proportion to each grid slot's overlap (all of it
    at start_s when the span is empty); `resident_s` adds the overlap seconds themselves."""
    if end_s <= start_s:
        slot = slots.setdefault(math.floor(start_s / grid_s), _Slot())
        setattr(slot, attr, getattr(slot, attr) + (0.0 if attr == "resident_s" else total))
        return
    span = end_s - start_s
    k = math.floor(start_s / grid_s)
    while k * grid_s < end_s:
        overlap = min(end_s, (k + 1) * grid_s) - max(start_s, k * grid_s)
        if overlap > 0.0:
            slot = slots.setdefault(k, _Slot())
            add = overlap if attr == "resident_s" else total * overlap / span
            setattr(slot, attr, getattr(slot, attr) + add)
        k += 1


@dataclass(slots=True)
class EnergyWindows:
    """Work binned on a wall-clock grid (`grid_s`, the accounting interval), turned into
    `EnergyWindow`s as boundaries arrive."""

    grid_s: float = 1.0
    slots: dict[int, _Slot] = field(default_factory=dict)
    boundary: tuple[float, float] | None = None  # (wall s, cumulative J)

    def add_record(self, rec: RequestRecord) -> None:
        if rec.dispatched_s is None:
            return
        shift = rec.arrived_wall_s - rec.arrived_s  # monotonic -> wall clock
        start = rec.dispatched_s + shift
        end = rec.finished_s + shift
        first = rec.first_token_s + shift if rec.first_token_s is not None else end
        last = max(rec.read_times[-1] + shift, first) if rec.read_times else max(end, first)
        grid = self.grid_s
        k = math.floor(start / grid)
        lo, hi = k * grid, (k + 1) * grid
        if lo <= first and end < hi and last < hi:
            # the usual request: all of it inside one grid slot
            slot = self.slots.get(k)
            if slot is None:
                slot = self.slots[k] = _Slot()
            slot.resident_s += max(end - start, 0.0)
            slot.prompt += float(rec.prompt_tokens)
            slot.output += float(rec.completion_tokens)
            return
        _spread(self.slots, start, end, grid, "resident_s", 0.0)
        _spread(self.slots, first, first, grid, "prompt", float(rec.prompt_tokens))
        _spread(self.slots, first, last, grid, "output", float(rec.completion_tokens))

    def add_boundary(self, end_s: float, energy_j: float) -> EnergyWindow | None:
        """The service's new boundary; the window since the previous one, or None (the first
        boundary, no progress, or a meter reset: energy went down)."""
        prev = self.boundary
        if prev is not None and end_s <= prev[0]:
            return None
        self.boundary = (end_s, energy_j)
        first_k = math.floor(prev[0] / self.grid_s + 1e-9) if prev is not None else None
        last_k = math.ceil(end_s / self.grid_s - 1e-9)  # slots below this are inside
        work = _Slot()
        for k in [k for k in self.slots if k < last_k]:
            slot = self.slots.pop(k)
            if first_k is not None and k >= first_k:
                work.prompt += slot.prompt
                work.output += slot.output
                work.resident_s += slot.resident_s
        horizon = math.floor((end_s - HORIZON_S) / self.grid_s)
        for k in [k for k in self.slots if k < horizon]:
            del self.slots[k]
        if prev is None or energy_j < prev[1]:
            return None
        dt = end_s - prev[0]
        return EnergyWindow(energy_j=energy_j - prev[1], dt_s=dt, prompt_tokens=work.prompt,
                            output_tokens=work.output, load=work.resident_s / dt)
