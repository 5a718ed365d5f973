"""Where a work row's pace changes: the head of its span (pure).

The apportioner counts the steps a request was in by weighing its tokens with the mean of
1/batch over the time they took. Over a whole interval that mean assumes the tokens came
evenly. They do not when the batch changed under the request: a decoder alone on the engine
for 0.3 s (a token every 7 ms, 41 steps of its own) that a burst of 30 prompts then joins
(long chunk steps, 9 tokens in 0.45 s) decoded most of its tokens alone; weighed evenly over
0.74 s its steps are counted as if mostly shared, and the burst is billed the solo steps'
fixed part.

So a row's span is cut once, into a head and a tail, each weighed over its own time:
- a row with a prefill of at least SPLIT_S: the head is the prefill (the prompt's chunks),
  and no decode is in it;
- otherwise, a row with token events: the cut is where the count of events departs most
  from an even pace (the CUSUM of events against time),

      i* = argmax_i | i - n (t_i - s) / (e - s) |,   over the row's n events in [s, e],

  taken when that departure is at least MIN_SHIFT_EVENTS events and both parts last at least
  SPLIT_S; the head holds the first i* events, and its decode tokens are those events'
  (less the first token, which came with the prompt's last step, if the row holds it).
  A cut where the pace does not change leaves the steps as they were (both parts weigh the
  same tokens per second).

A row carries the head as `head_s` (seconds from its span's start) and `head_decode`. A
decoding row whose events show one pace (or are too few to tell two apart) carries its whole
span as its head, with all its decode tokens: it weighs as a row without a head does, and
says that its tokens' times were seen, which the step clock (accounting/stepclock.py) leaves
alone; a row without token events (non-streamed) has no head.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence

from accounting.workrow import HeadlessWork, Work

# A head shorter than this measures the gateway's timing jitter, not a batch: 30 riders whose
# first tokens the engine emitted in one step reach the gateway a few milliseconds apart, and
# 1-ms heads weighed the earliest by the few spans begun by then (billed up to 3x their
# Shapley share). A 12,000-token prompt reads for 0.4 s; a decode step takes 7-30 ms.
SPLIT_S = 0.05
# A departure from an even pace smaller than this is noise (a uniform stream's CUSUM peaks at
# about half the square root of its events).
MIN_SHIFT_EVENTS = 2.0

Split = Callable[[tuple[float, ...], "list[int] | None", float, float, float],
                 "tuple[int, float, float] | None"]


def cusum_split(times: tuple[float, ...], cum: list[int] | None, off: float, s: float,
                e: float) -> tuple[int, float, float] | None:
    """(events in the head, the cut's wall time, the departure in events) over the reads
    whose wall times (times + off) lie in [s, e]; None with fewer than two reads there.
    `cum`: events up to each read (None: one event per read)."""
    i0 = bisect_left(times, s - off)
    i1 = bisect_left(times, e - off)
    while i1 < len(times) and times[i1] + off <= e:
        i1 += 1
    if i1 - i0 < 2 or e <= s:
        return None
    base = 0 if cum is None or i0 == 0 else cum[i0 - 1]
    n = (i1 - i0) if cum is None else cum[i1 - 1] - base
    best = -1.0
    got = 0
    cut = s
    for i in range(i0, i1 - 1):
        c = (i - i0 + 1) if cum is None else cum[i] - base
        t = times[i] + off
        dev = c - n * (t - s) / (e - s)
        if dev < 0.0:
            dev = -dev
        if dev > best:
            best, got, cut = dev, c, t
    return got, cut, best


split: Split = cusum_split
# with_heads' loop over a request with token events in C, where it was built: the same
# operations in the same order (tests/accounting/test_streamed_compiled.py compares the two)
compiled: Callable[..., list[Work]] | None
try:
    from accounting._streamed import cusum_split as _compiled
    from accounting._streamed import with_heads as compiled

    split = _compiled
except ImportError:  # pragma: no cover - a build without a C compiler
    compiled = None


def with_heads(rows: Sequence[HeadlessWork], times: tuple[float, ...], events: Sequence[int],
               total: int, off: float, interval_s: float, per_event: float, first: float
               ) -> list[Work]:
    """`rows` (each ending with its prefill seconds) with `head_decode` appended: 0 where the
    head is the prefill (or a row without token events); where the pace changes, the cut as
    `head_s`; where it does not, the whole span, holding all the row's decode. `total`: the
    sum of `events`."""
    if not times or per_event <= 0.0:
        return [(*r, 0.0) for r in rows]
    cum = None if len(events) == total else _accumulate(events)
    if compiled is not None and type(rows) is list and type(times) is tuple:
        return compiled(rows, times, cum, off, interval_s, per_event, first, SPLIT_S,
                        MIN_SHIFT_EVENTS)
    t_first = times[0] + off
    out: list[Work] = []
    for r in rows:
        res, pf, d = r[4], r[7], r[3]
        if d <= 0.0 or pf >= SPLIT_S or res <= 0.0:
            out.append((*r, 0.0))
            continue
        s = r[1] * interval_s + r[5]
        e = s + res
        got = split(times, cum, off, s, e) if res >= 2.0 * SPLIT_S else None
        if got is None or got[2] < MIN_SHIFT_EVENTS or got[1] - s < SPLIT_S \
                or e - got[1] < SPLIT_S:
            # its events show one pace (or too few to tell another): a head of the whole
            # span with all its decode, which weighs as none does, and tells the step clock
            # (accounting/stepclock.py) that the tokens' times were seen, not assumed
            out.append((r[0], r[1], r[2], d, res, r[5], r[6], res, d))
            continue
        dh = got[0] * per_event - (first if t_first >= s else 0.0)
        dh = min(max(dh, 0.0), d)
        out.append((r[0], r[1], r[2], d, res, r[5], r[6], got[1] - s, dh))
    return out


def _accumulate(events: Sequence[int]) -> list[int]:
    out, c = [], 0
    for x in events:
        c += x
        out.append(c)
    return out
