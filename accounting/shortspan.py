"""The batch of a span too short to weigh by time (pure).

The apportioner counts the steps a request was in as its tokens and chunks times the mean of
1/batch over its span, the batch at each instant being the spans that cover it. Over a span
of a few steps that mean measures the gateway's timing, not the engine's batch: the token
events of one step reach the gateway a few milliseconds apart (each is relayed in turn), so
30 requests of 8 prompt tokens and 2 out that the engine read in one step and decoded in the
next (every one of them beside the other 29: equal Shapley shares, by symmetry) have spans of
15-20 ms staggered by up to 6 ms. The first begins where few others have, the last ends
where few remain, and weighed by the mean of 1/batch over those edges they were counted in
up to 1.5 times the steps of the middle ones (billed from -3 % to +50 % of the same share).

So a span shorter than SPLIT_S (accounting/heads.py: the shortest head weighed on its own,
for the same reason) weighs its steps by the batch at its middle, where the jitter of its
edges does not reach: the number of spans covering that instant. Its steps are (chunks +
decode tokens) / that batch. Spans that overlap for most of their time get the same batch,
whatever their edges; two that barely overlap (one request after another) each keep the
batch they ran in. (The median batch over the span, by time, bills the benchmark's riders
the same, and costs up to ten times as much with a thousand short spans in an interval.)
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from accounting.heads import SPLIT_S

_FULL = 1.0 - 1e-12  # a span this close to the whole interval covers it (as apportion's)


def short_span_weights(weights: Sequence[float], stepping: Sequence[bool],
                       start: Sequence[float], res: Sequence[float],
                       interval_s: float) -> list[float] | None:
    """`weights` (each stepping row's integral of 1/batch over its span) with those of the
    stepping rows shorter than SPLIT_S replaced by span / (the batch at the span's middle);
    None where there is no such row (the caller keeps `weights`). The batch counts the
    stepping rows only, as the weights do."""
    full = interval_s * _FULL
    short = [i for i, s in enumerate(stepping) if s and 0.0 < res[i] < SPLIT_S and res[i] < full]
    if not short:
        return None
    n_full = sum(1 for s, r in zip(stepping, res, strict=True) if s and r >= full)
    partial = [(start[i], start[i] + res[i]) for i, s in enumerate(stepping)
               if s and 0.0 < res[i] < full]
    los = sorted(lo for lo, _ in partial)
    his = sorted(hi for _, hi in partial)
    out = list(weights)
    for i in short:
        lo, r = start[i], res[i]
        batch = _batch_at(lo + r / 2.0, los, his, n_full)
        if batch > 0:
            out[i] = r / batch
    return out


def _batch_at(t: float, los: list[float], his: list[float], n_full: int) -> int:
    """The spans covering instant t (`los`, `his`: the partial spans' starts and ends, sorted;
    `n_full` spans cover the whole interval)."""
    return n_full + bisect_right(los, t) - bisect_right(his, t)
