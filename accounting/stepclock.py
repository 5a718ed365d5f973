"""Where a decode without token events spent its steps: the engine's step clock (pure).

The apportioner counts the steps a decoder was in as its tokens times the mean of 1/batch
over its span, which takes its tokens to have come evenly in time. They come one per engine
step, and an engine step is not of even length: a step that reads a prompt chunk lasts as
long as that chunk's reading (a 3,000-token prompt: ~80 ms), a decode step a few
milliseconds (the coefficients' `step_s`). A decoder beside a neighbour's prompt decoded one
token in that prompt's whole reading, and the rest of its tokens before and after it. A
100-token prompt with 20 tokens out, non-streamed (no token events to place its decode by),
that decoded alone for 50 ms before a 1,000- and a 3,000-token prompt joined it, ran most of
its steps alone; weighed evenly over its span they were counted as if mostly shared.

So where the interval holds a prefill head (a row's prompt reading of SPLIT_S or more,
accounting/heads.py), a decoder row with no head (a request without token events: its
decode spread over its span by assumption) weighs 1/batch by the engine's step rate over its
span:

    w = r * integral(clock / n) / integral(clock)   over its span of r seconds,

clock(t) = 1 / step_s outside the prefill heads, and inside them the heads' chunks per
second (each head's chunks / its seconds, summed over the heads at t, at most 1 / step_s);
n(t) the rows with token work resident at t (the apportioner's batch). Where no prefill
head meets its span the clock is even and w is the plain integral of 1/n; such rows are left
as they are, bit for bit. So is a streamed row (a head of its own: a cut, or its whole span
where its events show one pace): its events placed its tokens, and a prefill head placed by
a learnt rate must not overrule them (applied to them, the clock moved the steps' fixed
energy off 8,000-30,000-token prompts onto decoders whose events showed no stall, and
bench.accounting_truth billed those prompts 23-25 % under at p95, against 12-15 %).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from itertools import pairwise

from accounting.heads import SPLIT_S
from accounting.prefill import CHUNK_TOKENS

_FULL = 1.0 - 1e-12  # a span this close to the whole interval covers it (as apportion's)


def clocked_weights(weights: Sequence[float], own: Sequence[float], start: Sequence[float],
                    res: Sequence[float], prefill: Sequence[float], decode: Sequence[float],
                    head_s: Sequence[float], head_decode: Sequence[float], interval_s: float,
                    step_s: float) -> list[float] | None:
    """`weights` (each stepping row's integral of 1/n over its span) with those of the
    decoders without a head whose span meets a prefill head weighed by the step clock;
    None where none does (the caller keeps `weights`). `head_s`: each row's head in seconds,
    0 where it has none of SPLIT_S or more."""
    if step_s <= 0.0:
        return None
    spans = [_span(lo, r, interval_s) for lo, r in zip(start, res, strict=True)]
    heads = [(spans[i][0], spans[i][0] + head_s[i],
              max(1.0, prefill[i] / CHUNK_TOKENS) / head_s[i])
             for i in range(len(spans))
             if prefill[i] > 0.0 and head_s[i] >= SPLIT_S and head_decode[i] == 0.0
             and own[i] > 0.0 and res[i] > 0.0]
    if not heads:
        return None
    reading = _union([(a, b) for a, b, _ in heads])
    starts = [a for a, _ in reading]
    chosen = [i for i in range(len(spans))
              if decode[i] > 0.0 and own[i] > 0.0 and res[i] > 0.0 and head_s[i] <= 0.0
              and head_decode[i] == 0.0
              and _meets(reading, starts, *spans[i])]
    if not chosen:
        return None
    stepping = [spans[i] for i in range(len(spans)) if own[i] > 0.0 and res[i] > 0.0]
    bounds, per_n, clock = _integrals(stepping, heads, step_s)
    out = list(weights)
    for i in chosen:
        lo, hi = spans[i]
        a, b = bisect_left(bounds, lo), bisect_left(bounds, hi)
        c = clock[b] - clock[a]
        if c > 0.0:
            out[i] = (hi - lo) * (per_n[b] - per_n[a]) / c
    return out


def _span(lo: float, r: float, interval_s: float) -> tuple[float, float]:
    """A row's resident span in the interval (the whole of it where it covers it)."""
    if r >= interval_s * _FULL:
        return 0.0, interval_s
    return lo, lo + r


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of spans, as disjoint spans in order."""
    out: list[tuple[float, float]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _meets(union: list[tuple[float, float]], starts: list[float], lo: float,
           hi: float) -> bool:
    """Whether (lo, hi) overlaps the union (disjoint spans in order, `starts` their starts):
    the last span starting before hi reaches furthest of those."""
    k = bisect_left(starts, hi) - 1
    return k >= 0 and union[k][1] > lo


def _integrals(stepping: Sequence[tuple[float, float]],
               heads: Sequence[tuple[float, float, float]], step_s: float
               ) -> tuple[list[float], list[float], list[float]]:
    """The sweep's breakpoints, and at each the integrals from the first of clock / n and of
    clock. Sums over sets, not over the rows' order: the result does not depend on it."""
    bounds = sorted({x for s in stepping for x in s} | {x for h in heads for x in h[:2]})
    los = sorted(lo for lo, _ in stepping)
    his = sorted(hi for _, hi in stepping)
    by_lo = sorted(range(len(heads)), key=lambda h: heads[h][0])
    by_hi = sorted(range(len(heads)), key=lambda h: heads[h][1])
    fast = 1.0 / step_s
    per_n = [0.0]
    clock = [0.0]
    active: dict[int, float] = {}  # the prefill heads covering the segment, with their rates
    clk = fast
    i = j = a = b = 0
    for x0, x1 in pairwise(bounds):
        while i < len(los) and los[i] <= x0:
            i += 1
        while j < len(his) and his[j] <= x0:
            j += 1
        n = i - j  # spans begun by x0 and not ended: those covering (x0, x1)
        changed = False
        while a < len(by_lo) and heads[by_lo[a]][0] <= x0:
            active[by_lo[a]] = heads[by_lo[a]][2]
            a += 1
            changed = True
        while b < len(by_hi) and heads[by_hi[b]][1] <= x0:
            del active[by_hi[b]]
            b += 1
            changed = True
        if changed:  # fsum over the set: the same sum whatever the rows' order
            clk = min(math.fsum(active.values()), fast) if active else fast
        dx = x1 - x0
        per_n.append(per_n[-1] + (clk * dx / n if n else 0.0))
        clock.append(clock[-1] + clk * dx)
    return bounds, per_n, clock
