"""Capacity signal (pure): how many engines a pool's current load needs to meet its SLO.

An endpoint's SLO capacity is the largest load at which its curves still predict latency
within `slo_margin` x the SLO (the load `slo_energy` packs it to). A pool (model, precision)
needs as many of its engines, most capable first, as it takes for their capacities to cover
the pool's current load; the rest can be scaled down or power-capped. Exported as the gauge
`wattgate_pool_engines_needed` for an autoscaler (docs/routing.md).
"""

from __future__ import annotations

from collections.abc import Sequence

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
