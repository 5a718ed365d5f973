"""The apportioner (pure): one engine-interval's measured energy split over the requests in it.

static  = idle_power_w * dt, bounded by the measured dE; dynamic = dE - static.
- static is charged for the time the engine had work resident: static * busy_s / dt (busy_s
  is the union of the requests' residency spans), shared by residency seconds; the static
  energy of the interval's empty time goes to the engine's idle account.
- dynamic is shared by alpha * prefill_tokens + beta * decode_tokens + gamma * kv_tokens
  (decoded tokens x their context); a request that did no token work gets none. An
  interval with residency but no token work sends its dynamic energy to the idle account,
  and an interval with no request sends all of dE there.
Sums use math.fsum, so the result does not depend on the order of the rows, and
sum(shares) + idle == dE up to one rounding per share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import add, itemgetter
from typing import NamedTuple

from gateway.accounting.work import WorkRow


class Share(NamedTuple):
    request_id: str
    energy_j: float
    static_j: float
    dynamic_j: float
    busy_s: float  # this request's share of the engine's busy time (engine-seconds)


@dataclass(frozen=True, slots=True)
class Apportionment:
    energy_j: float
    static_j: float
    dynamic_j: float
    idle_j: float
    idle_s: float  # engine time with no request resident
    shares: tuple[Share, ...]


_START = itemgetter(5)
_RES = itemgetter(4)
_PREFILL = itemgetter(2)
_DECODE = itemgetter(3)
_KV = itemgetter(6)


def busy_seconds(rows: Sequence[WorkRow], interval_s: float) -> float:
    """Length of the union of the rows' residency spans, clipped to the interval."""
    if not rows:
        return 0.0
    if max(map(_RES, rows)) >= interval_s:
        return interval_s  # someone was resident all along (the usual case under load)
    spans = sorted(zip(map(_START, rows), map(add, map(_START, rows), map(_RES, rows)),
                       strict=True))
    total = 0.0
    cur_lo = cur_hi = -1.0
    for lo, hi in spans:
        if hi <= lo:
            continue
        if lo > cur_hi:
            total += max(0.0, cur_hi - cur_lo)
            cur_lo, cur_hi = lo, hi
        elif hi > cur_hi:
            cur_hi = hi
    total += max(0.0, cur_hi - cur_lo)
    return min(total, interval_s)


def apportion(energy_j: float, interval_s: float, idle_power_w: float,
              rows: Sequence[WorkRow], alpha: float, beta: float, gamma: float = 0.0,
              delta: float = 0.0) -> Apportionment:
    """Split `energy_j` (>= 0) measured over one interval among `rows` (one per request)."""
    if energy_j < 0.0 or not math.isfinite(energy_j):
        raise ValueError(f"interval energy must be finite and >= 0, got {energy_j}")
    static = min(max(idle_power_w, 0.0) * interval_s, energy_j)
    dynamic = energy_j - static
    # Exact sums (fsum) keep the split independent of row order.
    res_total = math.fsum(map(_RES, rows))
    decode_total = math.fsum(map(_DECODE, rows))
    # Decode steps in the interval: a request decoding throughout emits one token per step.
    steps = max(map(_DECODE, rows)) if decode_total > 0.0 else 0.0
    beta_eff = beta + (delta * steps / decode_total if decode_total > 0.0 else 0.0)
    work_total = (alpha * math.fsum(map(_PREFILL, rows)) + beta_eff * decode_total
                  + gamma * math.fsum(map(_KV, rows)))
    busy = busy_seconds(rows, interval_s) if res_total > 0.0 else 0.0
    static_busy = static * (busy / interval_s) if res_total > 0.0 else 0.0
    if res_total <= 0.0 and work_total <= 0.0:
        idle = energy_j
    else:
        idle = (static - static_busy) + (dynamic if work_total <= 0.0 else 0.0)
    static_per_s = static_busy / res_total if res_total > 0.0 else 0.0
    busy_per_s = busy / res_total if res_total > 0.0 else 0.0
    dyn_per_work = dynamic / work_total if work_total > 0.0 else 0.0
    shares = []
    for r in rows:
        res = r.residency_s
        w = alpha * r.prefill_tokens + beta_eff * r.decode_tokens + gamma * r.kv_tokens
        if res <= 0.0 and w <= 0.0:
            continue
        st = res * static_per_s
        d = w * dyn_per_work
        shares.append(Share(r.request_id, st + d, st, d, res * busy_per_s))
    return Apportionment(energy_j=energy_j, static_j=static, dynamic_j=dynamic, idle_j=idle,
                         idle_s=interval_s - busy, shares=tuple(shares))
