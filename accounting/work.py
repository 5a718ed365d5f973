"""Per-request work on the wall-clock interval grid (pure).

A finished request becomes one `WorkRow` per interval it touched on its engine:
- prefill tokens: prompt tokens spread over the time the engine takes to read them
  (prompt_tokens / the engine's prefill rate, `accounting.prefill`) just before the
  first token, chunk by chunk, each chunk's step as long as its work (`chunk_spans`),
  bounded by the dispatch (what comes before is queueing in the engine: not resident in
  its batch, and charged nothing); a prompt of one chunk (MIN_PROMPT_TOKENS to
  CHUNK_TOKENS) whose step began earlier (`step_from_s`: the engine's previous step's last
  token event) is spread from there, the step it shared with other prompts; a longer prompt
  queued behind others ends its reading inside its last step, which it shared with the next
  prompt (`prefill.read_span`); a request with
  no token event (non-streamed, or ended before its first token) has them over the same span
  just before its decode, which ends the engine's span at the engine's decode pace, what
  comes before being queueing; when the span leaves no room for queueing
  (`NO_QUEUE_FACTOR`), from its dispatch;
- decode tokens: completion tokens but the first (the engine emits it in the prompt's last
  step: a request with a prompt ran one decode step fewer than it has tokens), spread over
  the token-bearing events in `reads`,
  proportionally to events; a request with none spreads them uniformly from the end of its
  prefill to the engine's finish: for a non-streamed answer, the engine's response head
  (`engine_done_s`), not the gateway's read of the body, which a busy gateway makes late;
- KV work: each decoded token times the context it attends over (prompt + tokens so far),
  because decode reads the whole KV cache of its sequence every step; plus the prefill's
  attention, which grows with the square of the prompt (each prompt token attends over the
  ones before it), in the same unit (`PREFILL_ATTENTION_PER_KV`);
- residency: seconds of (prefill start)..finished inside the interval, with the offset where that
  span starts in the interval (residency is one contiguous span per interval, which lets the
  apportioner compute the engine's busy time exactly);
- the head of that span (accounting/heads.py): the prefill's part of it, from its start, or
  where the pace of the row's token events changes, with the decode tokens in it, so the
  apportioner weighs the head's steps and the tail's each over their own time (0: none, or a
  row written before heads were kept).
Requests that never reached an engine have no rows.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate

from accounting.heads import with_heads
from accounting.prefill import DEFAULT_TOKENS_PER_S, DEFAULT_TPOT_S, chunk_spans, read_span
from accounting.queued import Chunks
from accounting.workrow import EMPTY_COLUMNS, HeadlessWork, Work, WorkColumns, WorkRow
from core.records import RequestRecord

__all__ = ["EMPTY_COLUMNS", "Work", "WorkColumns", "WorkRow", "work_rows"]

_Row = HeadlessWork  # a row as the builders below make it (with_heads adds its head)

compiled: Callable[..., list[_Row]] | None  # _streamed_rows' loop in C, where it was built
try:
    from accounting._streamed import streamed_rows as compiled
except ImportError:  # pragma: no cover - a build without a C compiler
    compiled = None



# One prompt token attending over one context token in prefill, in units of one decoded
# token's read of one context token's KV cache (the `gamma` work). From the simulated H100
# profile (engines/sim/perf.py, power.py): a pair is 4 x layers x heads x head_dim FLOPs at
# the 16-bit tensor-core rate the attention kernels reach (45 % of 989 TFLOP/s: 1.18 ns for
# Llama-3.1-8B), drawing 0.88 of (TDP - idle), 625 W: 6.5e-7 J, whatever the precision of the
# GEMMs (the KV cache is 16-bit); 6.5e-7 / gamma (3.0e-5) = 0.0216. A least-squares fit of
# whole prompts' energy (0.0150 P + 5.6e-7 P^2/2) put part of the square into the linear
# term and undercharged a long prompt's attention by 14 %.
PREFILL_ATTENTION_PER_KV = 0.0216


# A request without token events (non-streamed) decodes slower than the streamed median pace
# when its steps hold neighbours' prompt chunks: a 100-token prompt with 20 tokens out beside
# 1,000- and 3,000-token prompts took 12 ms a token against a 9.4 ms median, and an engine
# that is not queueing starts a request in its next step. An engine span up to this many
# times the pace (plus the prefill) is taken as the request's own, from its dispatch: placing
# its decode at the pace, after 46 ms of queueing that never was, moved it out of the steps
# it ran alone in and billed it -35 % of its Shapley share.
NO_QUEUE_FACTOR = 2.0


def prefill_attention(prefill: dict[int, float]) -> dict[int, float]:
    """Per interval, the prefill's attention work (prompt tokens x the context before them)."""
    out: dict[int, float] = {}
    done = 0.0
    for k in sorted(prefill):
        p = prefill[k]
        out[k] = PREFILL_ATTENTION_PER_KV * p * (done + p / 2.0)
        done += p
    return out


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


def _events_per_interval(times: tuple[float, ...], events: tuple[int, ...],
                         wall_offset_s: float, interval_s: float) -> dict[int, int]:
    """Token events per interval. Reads come in time order, so each interval's count is a
    difference of prefix sums found by bisection (C-speed passes; this is the apportioner's
    hottest loop). Events are conserved even if reads arrive out of order."""
    if not times:
        return {}
    total = sum(events)
    k_first = math.floor((times[0] + wall_offset_s) / interval_s)
    k_last = math.floor((times[-1] + wall_offset_s) / interval_s)
    if k_first == k_last:
        return {k_first: total} if total > 0 else {}
    # One event per read (the usual case): prefix sums are the indices themselves.
    cum: list[int] | range = (range(1, len(times) + 1) if total == len(times)
                              else list(accumulate(events)))
    out: dict[int, int] = {}
    prev = 0
    for k in range(k_first, k_last):
        i = bisect_left(times, (k + 1) * interval_s - wall_offset_s)
        c = cum[i - 1] if i else 0
        if c > prev:
            out[k] = c - prev
            prev = c
    if total > prev:
        out[k_last] = out.get(k_last, 0) + total - prev
    return out


def work_rows(rec: RequestRecord, interval_s: float,
              prefill_tokens_per_s: float = DEFAULT_TOKENS_PER_S,
              tpot_s: float = DEFAULT_TPOT_S, *, shortcut: bool = True,
              chunks: Chunks | None = None) -> list[Work]:
    """The request's work per interval of its engine (empty when it never reached one, or
    when the engine refused it with a 4xx: it read nothing).
    `prefill_tokens_per_s`: the engine's prefill rate for this prompt, which sizes the
    prefill's span; `tpot_s`: its decode pace, which places the decode of a request without
    token events at the end of its span.
    `shortcut=False` builds a one-interval request's row the general way (tests compare).
    `chunks`: where the engine read a queued prompt's chunks, found from the records of the
    prompts read before it (accounting/queued.py), in place of its own record's guess."""
    total = sum(rec.read_events) if rec.read_times else 0  # summed once: reads are many
    rows = _rows(rec, interval_s, prefill_tokens_per_s, tpot_s, shortcut, total, chunks)
    return with_heads(rows, rec.read_times, rec.read_events, total,
                      rec.arrived_wall_s - rec.arrived_s, interval_s,
                      rec.completion_tokens / total if total else 0.0,
                      1.0 if rec.prompt_tokens and rec.completion_tokens else 0.0)


def _rows(rec: RequestRecord, interval_s: float, prefill_tokens_per_s: float, tpot_s: float,
          shortcut: bool, total: int, chunks: Chunks | None = None) -> list[_Row]:
    """work_rows' rows without the head's decode (the last field is the prefill's seconds);
    `total`: the record's token events."""
    if not rec.engine or rec.dispatched_s is None or rec.status.startswith("upstream_http_4"):
        return []
    off = rec.arrived_wall_s - rec.arrived_s  # monotonic -> wall clock
    t_disp = rec.dispatched_s + off
    t_end = rec.finished_s + off
    if rec.engine_done_s is not None and rec.engine_done_s + off < t_end:
        t_end = rec.engine_done_s + off
    if t_end < t_disp:
        t_end = t_disp
    prompt = float(rec.prompt_tokens)
    prefill_s = prompt / prefill_tokens_per_s if prefill_tokens_per_s > 0.0 else 0.0
    prefill: dict[int, float] = {}
    first = rec.first_token_s
    t_decode = t_disp  # where decode without token events starts (after the prefill)
    if first is not None:
        t_first = first + off
        # Time to first token is mostly queueing behind other requests when the engine is
        # busy: the request is resident, and prefilling, only for its prefill's span.
        if chunks:
            start, t_prefilled = chunks[0][1], chunks[-1][2]
        else:
            start, t_prefilled = read_span(rec.step_from_s, off, prompt, t_disp, t_first,
                                            prefill_s, prefill_tokens_per_s)
        if start > t_disp:
            t_disp = start
        if t_disp > t_end:
            t_disp = t_end
        t_decode = t_disp
    elif not rec.stream and rec.engine_done_s is None and not rec.completion_tokens:
        # A non-streamed request that never got its answer (the client left, the engine
        # timed out): the engine read its prompt and then decoded, unseen, until the end.
        t_decode = t_prefilled = min(t_disp + prefill_s, t_end)
    elif prefill_s + rec.completion_tokens * tpot_s * NO_QUEUE_FACTOR >= t_end - t_disp:
        # No token event and no room for queueing in the engine's span: the engine ran it
        # from its dispatch, the prefill and then the decode, slower than the pace.
        t_decode = t_prefilled = min(t_disp + prefill_s, t_end)
    else:
        # No token event: the engine's span holds queueing, then the prefill, then the
        # decode at the engine's pace, which ends the span.
        t_decode = t_end - min(rec.completion_tokens * tpot_s, t_end - t_disp)
        if t_decode - prefill_s > t_disp:
            t_disp = t_decode - prefill_s
        t_prefilled = t_decode
    if prompt:
        k = math.floor(t_disp / interval_s)
        if t_prefilled <= t_disp or math.floor(t_prefilled / interval_s) == k:
            prefill[k] = prompt  # the usual case: the prefill lies in one interval
        else:  # chunk by chunk: each step as long as its work (prefill.chunk_spans)
            for tokens, lo, hi in chunks or chunk_spans(prompt, t_disp, t_prefilled):
                spread(tokens, lo, hi, interval_s, prefill)
    # where the prefill's placement ends inside the residency span (no prefill: its start)
    t_pf = (t_prefilled if t_prefilled < t_end else t_end) if prompt else t_disp
    # The engine emits the first token in the prompt's last step: it is no decode step, and
    # comes off the decode of the first token event's interval (or off the spread decode).
    completion = rec.completion_tokens
    first = 1.0 if prompt and completion else 0.0
    times, events = rec.read_times, rec.read_events
    k_first = math.floor(t_disp / interval_s)
    k_last = math.floor(t_end / interval_s)
    if completion and times and min(prefill, default=k_first) >= k_first:
        k_r0 = math.floor((times[0] + off) / interval_s)
        k_rl = math.floor((times[-1] + off) / interval_s)
        if (k_r0 >= k_first and k_rl <= k_last and max(prefill, default=k_last) <= k_last
                and (len(prefill) <= 1 or k_r0 <= k_rl) and total):
            if shortcut and k_first == k_last:
                # One interval (most streams): _streamed_rows' row without its loop.
                d = total * (completion / total)
                return _one_interval_stream(rec.request_id, k_first, prefill.get(k_first, 0.0),
                                            d - (first if first < d else d), prompt, t_disp,
                                            t_end, t_pf, interval_s)
            # A prefill split over intervals: count events as _events_per_interval does.
            span = (k_r0, k_rl) if len(prefill) > 1 else None
            return _streamed_rows(rec.request_id, times, events, total, off, completion, prompt,
                                  prefill, t_disp, t_end, t_pf, k_first, k_last, interval_s,
                                  span, first)
    if (shortcut and k_first == k_last and not times
            and (not prefill or (len(prefill) == 1 and k_first in prefill))):
        # One interval and no token events (most non-streamed requests): the row the loop
        # below builds, bit for bit, without its per-interval dictionaries.
        return _one_interval_row(rec.request_id, k_first, prefill.get(k_first, 0.0),
                                 completion - first, t_disp, t_decode, t_end, t_pf, interval_s)
    decode: dict[int, float] = {}
    if completion:
        per_k = _events_per_interval(times, events, off, interval_s)
        n_events = sum(per_k.values())
        if n_events:
            per_event = completion / n_events
            decode = {k: n * per_event for k, n in per_k.items()}
            k0 = min(decode)
            decode[k0] -= first if first < decode[k0] else decode[k0]
        else:
            spread(completion - first, t_decode, t_end, interval_s, decode)
    kv: dict[int, float] = {}
    done = 0.0
    for k in sorted(decode):
        d = decode[k]
        kv[k] = d * (prompt + done + d / 2.0)
        done += d
    for k, a in prefill_attention(prefill).items():
        kv[k] = kv[k] + a if k in kv else a
    rows: list[_Row] = []
    append = rows.append
    rid = rec.request_id
    get_p, get_d, get_kv = prefill.get, decode.get, kv.get
    for k in range(k_first, k_last + 1):
        lo = k * interval_s
        start = t_disp if t_disp > lo else lo
        hi = lo + interval_s
        res = (t_end if t_end < hi else hi) - start
        p = get_p(k, 0.0)
        d = get_d(k, 0.0)
        if res > 0.0:
            pf = (t_pf if t_pf < hi else hi) - start
            append((rid, k, p, d, res, start - lo, get_kv(k, 0.0), pf if pf > 0.0 else 0.0))
        elif p or d:
            append((rid, k, p, d, 0.0, 0.0, get_kv(k, 0.0), 0.0))
    # Token events stamped outside dispatched..finished (clock skew) still count.
    outside = [k for k in (*prefill, *decode) if k < k_first or k > k_last]
    for k in sorted(set(outside)):
        append((rid, k, get_p(k, 0.0), get_d(k, 0.0), 0.0, 0.0, get_kv(k, 0.0), 0.0))
    return rows


def _one_interval_row(rid: str, k: int, p: float, completion: float, t_disp: float,
                      t_decode: float, t_end: float, t_pf: float, interval_s: float) -> list[_Row]:
    """work_rows of a request inside interval k with no token events: `completion` decoded
    tokens spread uniformly over t_decode..finished (spread()'s arithmetic: the same bits)."""
    lo = k * interval_s
    hi = lo + interval_s
    d = 0.0
    if completion:
        if t_end <= t_decode:
            d = float(completion)
        else:
            s_lo = t_decode if t_decode > lo else lo
            s_hi = t_end if t_end < (k + 1) * interval_s else (k + 1) * interval_s
            if s_hi > s_lo:
                d = completion * (s_hi - s_lo) / (t_end - t_decode)
    kv = d * (p + 0.0 + d / 2.0) if d else 0.0
    if p:  # the prefill's attention, as prefill_attention() computes it for one interval
        a = PREFILL_ATTENTION_PER_KV * p * (0.0 + p / 2.0)
        kv = kv + a if d else a
    start = t_disp if t_disp > lo else lo
    res = (t_end if t_end < hi else hi) - start
    if res > 0.0:
        pf = (t_pf if t_pf < hi else hi) - start
        return [(rid, k, p, d, res, start - lo, kv, pf if pf > 0.0 else 0.0)]
    if p or d:
        return [(rid, k, p, d, 0.0, 0.0, kv, 0.0)]
    return []


def _one_interval_stream(rid: str, k: int, p: float, d: float, prompt: float, t_disp: float,
                         t_end: float, t_pf: float, interval_s: float) -> list[_Row]:
    """_streamed_rows of a stream inside interval k, which decodes `d` tokens there; the same
    arithmetic, so the same bits."""
    kv = d * (prompt + 0.0 + d / 2.0)
    if p:  # the prefill's attention, as prefill_attention() computes it for one interval
        kv = kv + PREFILL_ATTENTION_PER_KV * p * (0.0 + p / 2.0)
    lo = k * interval_s
    hi = lo + interval_s
    start = t_disp if t_disp > lo else lo
    res = (t_end if t_end < hi else hi) - start
    if res > 0.0:
        pf = (t_pf if t_pf < hi else hi) - start
        return [(rid, k, p, d, res, start - lo, kv, pf if pf > 0.0 else 0.0)]
    return [(rid, k, p, d, 0.0, 0.0, kv, 0.0)] if p or d else []


def _streamed_rows(rid: str, times: tuple[float, ...], events: tuple[int, ...], total: int,
                   off: float, completion: int, prompt: float, prefill: dict[int, float],
                   t_disp: float, t_end: float, t_pf: float, k_first: int, k_last: int,
                   interval_s: float, span: tuple[int, int] | None, first: float) -> list[_Row]:
    """work_rows' usual case in one pass over the intervals: `total` (> 0) token events and
    the prefill all inside the residency span. Same rows as the general path. With `span`
    (the intervals of the first and last read) events are counted exactly as
    _events_per_interval counts them; without, at each interval's end. `first` tokens (that
    the prompt's last step emitted) come off the first interval with events."""
    # One event per read (the usual case): the events before read i are i itself.
    cum = None if total == len(times) else list(accumulate(events))
    attention = prefill_attention(prefill)
    k_r0, k_rl = span if span is not None else (k_first, k_last)
    if compiled is not None and type(times) is tuple:
        return compiled(rid, times, cum, total, off, completion, prompt, prefill, attention,
                        t_disp, t_end, t_pf, k_first, k_last, interval_s, span is not None, k_r0,
                        k_rl, first)
    per_event = completion / total
    get_p = prefill.get
    rows: list[_Row] = []
    append = rows.append
    done = 0.0
    prev = 0
    for k in range(k_first, k_last + 1):
        lo = k * interval_s
        hi = lo + interval_s
        if k >= k_rl:
            c = total
        elif k < k_r0:
            c = 0
        else:
            i = bisect_left(times, ((k + 1) * interval_s if span else hi) - off)
            c = i if cum is None else (cum[i - 1] if i else 0)
        start = t_disp if t_disp > lo else lo
        res = (t_end if t_end < hi else hi) - start
        p = get_p(k, 0.0)
        pf = (t_pf if t_pf < hi else hi) - start
        pf = pf if pf > 0.0 else 0.0
        if c > prev:
            d = (c - prev) * per_event
            if not prev:
                d = d - (first if first < d else d)
            kv = d * (prompt + done + d / 2.0)
            if k in attention:
                kv = kv + attention[k]
            done += d
            prev = c
            if res > 0.0:
                append((rid, k, p, d, res, start - lo, kv, pf))
            elif p or d:
                append((rid, k, p, d, 0.0, 0.0, kv, 0.0))
        elif res > 0.0:
            append((rid, k, p, 0.0, res, start - lo, attention.get(k, 0.0), pf))
        elif p:
            append((rid, k, p, 0.0, 0.0, 0.0, attention.get(k, 0.0), 0.0))
    return rows
