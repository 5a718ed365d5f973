"""Capacity signal (pure): how many engines a pool's current load needs to meet its SLO.

An endpoint's SLO capacity is the largest load at which its curves still predict latency
within `slo_margin` x the SLO (the load `slo_energy` packs it to). A pool (model, precision)
needs as many of its engines, most capable first, as it takes for their capacities to cover
the pool's current load; the rest can be scaled down or power-capped. Exported as the gauge
`wattgate_pool_engines_needed` for an autoscaler (docs/routing.md). `SurplusMeter` adds up
the idle joules of the engines the load did not need: what scaling them down would have saved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.routing.base import Candidate, RoutingContext
from gateway.routing.models import Curves
from gateway.routing.slo_energy import slo_ratio

MAX_LOAD = 1024.0


def slo_capacity(curves: Curves, ctx: RoutingContext) -> float:
    """Largest load (requests resident) whose predicted latency stays within the margin;
    0 when even an idle engine is predicted to miss it. Latency curves are non-decreasing in
    load, so a bisection finds it."""

    def ok(load: float) -> bool:
        return slo_ratio(Candidate("", "", inflight=0, running=load), curves, ctx
                         ) <= ctx.slo_margin

    if not ok(0.0):
        return 0.0
    if ok(MAX_LOAD):
        return MAX_LOAD
    lo, hi = 0.0, MAX_LOAD
    while hi - lo > 0.25:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def engines_needed(load: float, capacities: Sequence[float]) -> int:
    """Fewest engines, most capable first, whose capacities cover `load` (all of them when
    they cannot; 0 for no load)."""
    if load <= 0.0:
        return 0
    covered = 0.0
    for n, cap in enumerate(sorted(capacities, reverse=True), start=1):
        covered += cap
        if covered >= load:
            return n
    return len(capacities)


def surplus_engines(names: Sequence[str], capacities: Sequence[float], needed: int
                    ) -> tuple[str, ...]:
    """The engines of a pool beyond the `needed` most capable ones (`engines_needed`'s order;
    ties by name): those an autoscaler could scale down or power-cap."""
    order = sorted(range(len(names)), key=lambda i: (-capacities[i], names[i]))
    return tuple(names[i] for i in order[max(needed, 0):])


class SurplusMeter:
    """Integrates, per engine, the seconds it was surplus (not needed by its pool's load) and
    the idle joules it burnt meanwhile (idle power x those seconds): what scaling it down would
    have saved.

    The state seen at one `advance` holds until the next, for at most `hold_s`; past that
    nothing was routed, the loads routing saw are stale, and every engine counts as surplus
    (the capacity signal reads such loads as idle too)."""

    def __init__(self, hold_s: float):
        self.hold_s = hold_s
        self.seconds: dict[str, float] = {}
        self.joules: dict[str, float] = {}
        self._last_s: float | None = None
        self._surplus_w: dict[str, float] = {}
        self._all_w: dict[str, float] = {}

    def advance(self, now_s: float, surplus_idle_w: Mapping[str, float],
                all_idle_w: Mapping[str, float]) -> None:
        """Close the span since the last call, then take the surplus engines now (name ->
        idle power, W) and every engine's idle power for a span that outlives `hold_s`."""
        if self._last_s is not None and now_s > self._last_s:
            dt = now_s - self._last_s
            held = min(dt, self.hold_s)
            self._add(self._surplus_w, held)
            self._add(self._all_w, dt - held)
        if self._last_s is None or now_s >= self._last_s:
            self._last_s = now_s
            self._surplus_w = dict(surplus_idle_w)
            self._all_w = dict(all_idle_w)

    def _add(self, idle_w: Mapping[str, float], dt_s: float) -> None:
        if dt_s <= 0.0:
            return
        for name, w in idle_w.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + dt_s
            self.joules[name] = self.joules.get(name, 0.0) + w * dt_s
