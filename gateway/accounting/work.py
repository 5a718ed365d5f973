"""Per-request work on the wall-clock interval grid (pure).

A finished request becomes one `WorkRow` per interval it touched on its engine:
- prefill tokens: prompt tokens spread uniformly over dispatched..first_token (the engine's
  queueing and prefill); a non-streamed request has no first-token time, so its prefill is
  put at the dispatch instant (prefill is short next to decode);
- decode tokens: completion tokens spread over the token-bearing events in `reads`,
  proportionally to events; a non-streamed request spreads them uniformly over
  dispatched..finished;
- residency: seconds of dispatched..finished inside the interval, with the offset where that
  span starts in the interval (residency is one contiguous span per interval, which lets the
  apportioner compute the engine's busy time exactly).
Requests that never reached an engine have no rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.records import RequestRecord


@dataclass(frozen=True, slots=True)
class WorkRow:
    request_id: str
    interval_idx: int
    prefill_tokens: float
    decode_tokens: float
    residency_s: float
    start_s: float = 0.0  # offset of the residency span from the interval start


def interval_index(t_wall_s: float, interval_s: float) -> int:
    return math.floor(t_wall_s / interval_s)


def spread(amount: float, t0: float, t1: float, interval_s: float, acc: dict[int, float]) -> None:
    """Add `amount` spread uniformly over [t0, t1] to acc[interval]; a point mass when t1 <= t0."""
    if amount == 0.0:
        return
    if t1 <= t0:
        k = interval_index(t0, interval_s)
        acc[k] = acc.get(k, 0.0) + amount
        return
    span = t1 - t0
    k = interval_index(t0, interval_s)
    k_last = interval_index(t1, interval_s)
    while k <= k_last:
        lo = max(t0, k * interval_s)
        hi = min(t1, (k + 1) * interval_s)
        if hi > lo:
            acc[k] = acc.get(k, 0.0) + amount * (hi - lo) / span
        k += 1


def residency(t0: float, t1: float, interval_s: float) -> dict[int, tuple[float, float]]:
    """{interval: (seconds resident, offset of the span's start)} for one span [t0, t1]."""
    out: dict[int, tuple[float, float]] = {}
    k = interval_index(t0, interval_s)
    k_last = interval_index(t1, interval_s)
    while k <= k_last:
        lo = max(t0, k * interval_s)
        hi = min(t1, (k + 1) * interval_s)
        if hi > lo:
            out[k] = (hi - lo, lo - k * interval_s)
        k += 1
    return out


def work_rows(rec: RequestRecord, interval_s: float) -> list[WorkRow]:
    """The request's work per interval of its engine (empty when it never reached one)."""
    if not rec.engine or rec.dispatched_s is None:
        return []
    t_disp = rec.wall(rec.dispatched_s)
    t_end = max(t_disp, rec.wall(rec.finished_s))
    prefill: dict[int, float] = {}
    decode: dict[int, float] = {}
    if rec.first_token_s is not None:
        spread(float(rec.prompt_tokens), t_disp, rec.wall(rec.first_token_s), interval_s, prefill)
    else:
        spread(float(rec.prompt_tokens), t_disp, t_disp, interval_s, prefill)
    n_events = sum(n for _, n in rec.reads)
    if rec.completion_tokens and n_events:
        per_event = rec.completion_tokens / n_events
        for t, n in rec.reads:
            k = interval_index(rec.wall(t), interval_s)
            decode[k] = decode.get(k, 0.0) + per_event * n
    elif rec.completion_tokens:
        spread(float(rec.completion_tokens), t_disp, t_end, interval_s, decode)
    res = residency(t_disp, t_end, interval_s)
    rows = []
    for k in sorted(set(prefill) | set(decode) | set(res)):
        res_s, start_s = res.get(k, (0.0, 0.0))
        rows.append(WorkRow(rec.request_id, k, prefill.get(k, 0.0), decode.get(k, 0.0),
                            res_s, start_s))
    return rows
