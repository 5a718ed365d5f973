"""The apportioner (pure): one engine-interval's measured energy split over the requests in it.

static  = idle_power_w * dt, bounded by the measured dE; dynamic = dE - static.
- static is charged for the time the engine had work resident: static * busy_s / dt (busy_s
  is the union of the requests' residency spans); the static energy of the interval's empty
  time goes to the engine's idle account. The busy part is shared by residency seconds, or,
  with `instant` (what the service uses), equally among the requests resident at each
  instant: a request's weight is the integral of 1/n(t) over its span, n(t) being how many
  spans cover t. That is how an engine spends it: every step's static power serves the
  sequences in that step, and a request that stays while the batch drains pays more per
  second than one that left when it was full.
- dynamic is shared by alpha * prefill_tokens + beta * decode_tokens + gamma * kv_tokens
  (decoded tokens x their context), with the steps' split (`instant`, delta) beta - alpha
  per prompt chunk (a prompt's step holds its sequence as a decode step does: per-sequence
  host and sampling work, the first token sampled in the last chunk), plus the weight
  streaming of the interval's decode steps, delta(tokens per step) for each step. With
  `instant` (the service), each decoder's steps are its decode rate (one token per step
  over its resident time) times its instant weight among the decoders alone, i.e. its
  tokens x the mean of 1/batch over its span, and a prompt's steps its chunks (max(1, p /
  CHUNK_TOKENS): the last emits the first token, which work rows do not count as decoded)
  x the same mean. A row with a head of f seconds
  (its span's first f of r: its prefill, or its decode up to where its pace changed,
  accounting/heads.py) holding e of its d decode tokens weighs each part over its own time:
  steps = W(f) * (chunks + e) / f + (W(r) - W(f)) * (d - e) / (r - f), W(x) the integral
  of 1/n over the span's first x seconds (a long prompt read alone does not make its
  decode, beside a batch, look as if it ran alone; a decoder alone before a burst joined it
  does not look as if it shared its solo steps); f = 0 (none, or f < SPLIT_S) weighs both
  over the whole span. The
  interval's steps are their sum, and each decoder's share of the steps' energy is its own
  steps: a request split into pieces one after another ran the same steps, and a resident
  request that decoded nothing ran none and thins nobody's weight. Without `instant`, steps
  are the most tokens any request decoded and their energy goes by decode tokens. Each step
  carries decode/steps tokens, and one per request prefilling in the interval also carries
  that prompt. A request that did no token work gets no dynamic share. An interval with
  residency but no token work sends its dynamic energy to the idle account, and an interval
  with no request sends all of dE there.
- with `step_s` (what the service uses), the busy static energy follows the Shapley rule of
  the steps: static power x step_s x (the interval's steps' joules / delta) is the steps'
  fixed part, shared by the steps each request was in; the rest by its token work.
Sums use math.fsum over values that do not depend on the order of the rows, so neither does
the result, and sum(shares) + idle == dE up to one rounding per share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from operator import add
from typing import NamedTuple

from accounting.coefficients import Coefficients
from accounting.heads import SPLIT_S
from accounting.prefill import CHUNK_TOKENS
from accounting.shortspan import short_span_weights
from accounting.stepclock import clocked_weights
from accounting.work import Work, WorkColumns


class Share(NamedTuple):
    request_id: str
    energy_j: float
    static_j: float
    dynamic_j: float
    busy_s: float  # this request's share of the engine's busy time (engine-seconds)


class ShareColumns(NamedTuple):
    """The shares column by column (what the ledger writer consumes: no tuple per share)."""

    request_ids: Sequence[str]
    energy_j: Sequence[float]
    static_j: Sequence[float]
    dynamic_j: Sequence[float]
    busy_s: Sequence[float]


NO_SHARES = ShareColumns((), (), (), (), ())


@dataclass(frozen=True, slots=True)
class Apportionment:
    energy_j: float
    static_j: float
    dynamic_j: float
    idle_j: float
    idle_s: float  # engine time with no request resident
    columns: ShareColumns  # one entry per request with a share, in the order of the rows

    @property
    def shares(self) -> tuple[Share, ...]:
        """One `Share` per request that got energy (or busy time)."""
        return tuple(map(Share._make, zip(*self.columns, strict=True)))


_FULL = 1.0 - 1e-12  # a span this close to the whole interval covers it


def busy_seconds(rows: Sequence[Work] | WorkColumns, interval_s: float) -> float:
    """Length of the union of the rows' residency spans, clipped to the interval."""
    cols = rows if isinstance(rows, WorkColumns) else WorkColumns.of(rows)
    if not cols.residency_s:
        return 0.0
    if max(cols.residency_s) >= interval_s:
        return interval_s  # someone was resident all along (the usual case under load)
    spans = sorted(zip(cols.start_s, map(add, cols.start_s, cols.residency_s), strict=True))
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


def instant_weights(starts: Sequence[float], residencies: Sequence[float],
                    interval_s: float) -> list[float]:
    """Per span, the integral over it of 1/n(t) (n(t): spans covering t). They sum to the
    length of the union of the spans. Depends only on the set of spans, not their order."""
    return _sweep(starts, residencies, interval_s, None)[0]


def _sweep(starts: Sequence[float], residencies: Sequence[float], interval_s: float,
           heads: Sequence[float] | None) -> tuple[list[float], list[float] | None]:
    """instant_weights, and with `heads` (seconds from each span's start, below its length;
    0: none) the integral of 1/n(t) over each span's head too (0 where it has none)."""
    n = len(starts)
    full = interval_s * _FULL
    partial = [(lo, lo + r) for lo, r in zip(starts, residencies, strict=True)
               if 0.0 < r < full]
    base = sum(r >= full for r in residencies)  # spans covering the whole interval
    if not partial:
        head_w = None if heads is None else [
            h / base if r >= full else 0.0 for h, r in zip(heads, residencies, strict=True)]
        return ([interval_s / base if r >= full else 0.0 for r in residencies] if base
                else [0.0] * n), head_w
    # Spans covering the whole interval are a constant `base` in n(t): only the partial spans'
    # ends (and the interval's, for the full spans) are breakpoints of the sweep.
    lo_sorted = sorted(lo for lo, _ in partial)
    hi_sorted = sorted(hi for _, hi in partial)
    points = {*lo_sorted, *hi_sorted}
    if base:
        points.update((0.0, interval_s))
    cuts = [] if heads is None else [
        (0.0 if r >= full else lo) + h if h > 0.0 and r > 0.0 else None
        for lo, r, h in zip(starts, residencies, heads, strict=True)]
    points.update(x for x in cuts if x is not None)
    bounds = sorted(points)
    at: dict[float, float] = {}  # integral of 1/n from the first bound to each bound
    m = len(lo_sorted)
    acc = 0.0
    i = j = 0
    prev = bounds[0]
    for x in bounds:
        if i > j or base:
            acc += (x - prev) / (base + i - j)
        at[x] = acc
        while i < m and lo_sorted[i] <= x:
            i += 1
        while j < m and hi_sorted[j] <= x:
            j += 1
        prev = x
    whole = at[interval_s] - at[0.0] if base else 0.0
    head_w = None if heads is None else [
        0.0 if x is None else at[x] - at[0.0 if r >= full else lo]
        for x, lo, r in zip(cuts, starts, residencies, strict=True)]
    return [whole if r >= full else (at[lo + r] - at[lo] if r > 0.0 else 0.0)
            for lo, r in zip(starts, residencies, strict=True)], head_w


def _stepping_weights(own: Sequence[float], start: Sequence[float], res: Sequence[float],
                      interval_s: float, heads: Sequence[float] | None
                      ) -> tuple[list[float], list[float] | None]:
    """Instant weights of the requests with token work of their own in the interval (a
    decode or a prompt chunk: they were in steps), computed over those requests only (0 for
    the others, which were in no step and must not thin anyone's weight); with `heads`, the
    weights of their heads too (_sweep)."""
    decoding = [o > 0.0 for o in own]
    if all(decoding):
        return _sweep(start, res, interval_s, heads)
    idx = [i for i, flag in enumerate(decoding) if flag]
    out = [0.0] * len(decoding)
    head_w = None if heads is None else [0.0] * len(decoding)
    if idx:
        sub, sub_heads = _sweep([start[i] for i in idx], [res[i] for i in idx], interval_s,
                                None if heads is None else [heads[i] for i in idx])
        for i, w in zip(idx, sub, strict=True):
            out[i] = w
        if head_w is not None and sub_heads is not None:
            for i, h in zip(idx, sub_heads, strict=True):
                head_w[i] = h
    return out, head_w


def step_joules(delta: float, delta_1: float | None, half_tokens: float,
                tokens_per_step: float) -> float:
    """Weight streaming of one step: delta_1 at one token per step, tending to delta at many
    (kernels that stream weights poorly at small batch), halfway at 1 + half_tokens."""
    if delta_1 is None or half_tokens <= 0.0:
        return delta
    extra = max(tokens_per_step - 1.0, 0.0)
    return delta + (delta_1 - delta) * half_tokens / (extra + half_tokens)


def apportion(energy_j: float, interval_s: float, idle_power_w: float,
              rows: Sequence[Work], alpha: float, beta: float, gamma: float = 0.0,
              delta: float = 0.0, *, delta_1: float | None = None,
              delta_half_tokens: float = 0.0, instant: bool = False,
              step_s: float = 0.0) -> Apportionment:
    """Split `energy_j` (>= 0) measured over one interval among `rows` (one per request)."""
    if energy_j < 0.0 or not math.isfinite(energy_j):
        raise ValueError(f"interval energy must be finite and >= 0, got {energy_j}")
    static = min(max(idle_power_w, 0.0) * interval_s, energy_j)
    dynamic = energy_j - static
    if not rows:
        return Apportionment(energy_j, static, dynamic, energy_j, interval_s, NO_SHARES)
    # Column-wise views: one C-level transpose instead of attribute access per row.
    cols = WorkColumns.of(rows)
    rids, pre, dec, res, start, kv = (cols.request_id, cols.prefill_tokens, cols.decode_tokens,
                                      cols.residency_s, cols.start_s, cols.kv_tokens)
    res_total = math.fsum(res)
    decode_total = math.fsum(dec)
    own = [alpha * p + beta * d + gamma * k for p, d, k in zip(pre, dec, kv, strict=True)]
    # A prompt's step holds its sequence as a decode step does: with the steps' split
    # (`instant`, delta), each chunk with work (the last samples its first token) carries the
    # per-sequence work a decoded token carries beyond its GEMMs, beta - alpha. Without it a
    # prompt of 8 tokens read in a long prompt's last chunk step was billed 8 % under its
    # share of that step.
    chunks = [max(1.0, p / CHUNK_TOKENS) if p > 0.0 else 0.0 for p in pre]
    if instant and delta > 0.0 and beta > alpha:
        seq_w = beta - alpha
        own = [o + seq_w * c if c and o > 0.0 else o for o, c in zip(own, chunks, strict=True)]
    steps = max(dec) if decode_total > 0.0 else 0.0
    part: list[float] = []
    if instant and steps > 0.0 and delta > 0.0:
        # Each sequence's share of the steps: the steps it was in (a decoder one per token,
        # a prompt one per chunk of the engine's token budget) times the mean of 1/batch
        # over its span (its instant weight among the sequences with token work, over its
        # resident time). Every sequence in a step shares that step's weight reads and host
        # work equally, the prompt chunk included. The sum is the interval's steps, whoever
        # ran them: a request split in two, one after the other, ran the same steps, and a
        # resident request with no token work ran none. Spans too short to weigh: the
        # largest decode, shared by decode tokens.
        # A row's head (its first `head_s` seconds: its prefill, or its decode up to where
        # the pace changed, accounting/heads.py) ran its chunks and `head_decode` tokens
        # beside the batch of that time, the rest beside the batch after: each weighed over
        # its own part. Only a head of SPLIT_S or more: a shorter one would weigh its tokens
        # by the jitter of the gateway's timestamps, not by the batch they ran in.
        hs = [f if f >= SPLIT_S else 0.0 for f in cols.head_s]
        split = any(0.0 < f < r for f, r in zip(hs, res, strict=True))
        heads = [f if 0.0 < f < r else 0.0 for f, r in zip(hs, res, strict=True)] if split else None
        weights_d, head_w = _stepping_weights(own, start, res, interval_s, heads)
        # A decoder of even pace beside a prompt's reading ran one step in all that reading
        # (accounting/stepclock.py): its 1/batch weighed by the engine's step rate.
        clocked = clocked_weights(weights_d, own, start, res, pre, dec, hs, cols.head_decode,
                                  interval_s, step_s) if step_s > 0.0 else None
        if clocked is not None:
            weights_d = clocked
        # A span of a few steps weighs by the batch it mostly ran in, not by the relay's
        # jitter at its edges (accounting/shortspan.py).
        short = short_span_weights(weights_d, [o > 0.0 for o in own], start, res, interval_s)
        if short is not None:
            weights_d = short
        part = [w * (d + c) / r if w > 0.0 and r > 0.0 else 0.0
                for w, d, c, r in zip(weights_d, dec, chunks, res, strict=True)]
        if head_w is not None:
            part = [(h * (c + e) / f + max(w - h, 0.0) * (d - e) / (r - f)) if h > 0.0 else q
                    for q, h, w, d, e, c, r, f in zip(part, head_w, weights_d, dec,
                                                      cols.head_decode, chunks, res, hs,
                                                      strict=True)]
        own_steps = math.fsum(part)
        if own_steps > 0.0 and math.isfinite(own_steps):
            steps = own_steps
        else:
            part = []
    in_steps = part  # each sequence's steps (empty: not known)
    step_j = 0.0
    if steps > 0.0 and delta > 0.0:
        # Decode steps carry `batch` tokens; the prompts ride in one step per chunk (at
        # least one each, at most `steps` in all), which their tokens make cheaper per token
        # for kernels that stream weights better with more tokens per step.
        batch = decode_total / steps
        n_pf = min(math.fsum(max(1.0, p / CHUNK_TOKENS) for p in pre if p > 0.0), steps)
        step_j = (steps - n_pf) * step_joules(delta, delta_1, delta_half_tokens, batch)
        if n_pf:
            step_j += n_pf * step_joules(delta, delta_1, delta_half_tokens,
                                         batch + math.fsum(pre) / n_pf)
    if res_total > 0.0:
        if instant:
            weights: Sequence[float] = instant_weights(start, res, interval_s)
            w_total = math.fsum(weights)
            busy = min(w_total, interval_s)
        else:
            weights = res
            busy = busy_seconds(cols, interval_s)
            w_total = res_total
        if w_total > 0.0:
            static_per_w = static * (busy / interval_s) / w_total
            busy_per_w = busy / w_total
        else:  # spans too short to measure
            busy = static_per_w = busy_per_w = 0.0
    else:
        weights = res
        busy = static_per_w = busy_per_w = 0.0
    work = own
    if step_j > 0.0:
        # The steps go to the sequences in them (above); without `instant`, or spans too
        # short to weigh, by decode tokens.
        part_total = math.fsum(part)
        if part_total <= 0.0:
            part = [d if o > 0.0 else 0.0 for o, d in zip(own, dec, strict=True)]
            part_total = math.fsum(part)
        if part_total > 0.0:
            per_part = step_j / part_total
            if math.isinf(per_part):  # subnormal weights: 0 * inf would be NaN, so rescale
                top = max(part)
                part = [q / top for q in part]
                per_part = step_j / math.fsum(part)
            work = [o + q * per_part for o, q in zip(own, part, strict=True)]
    work_total = math.fsum(work)
    if res_total <= 0.0 and work_total <= 0.0:
        idle = energy_j
    else:
        idle = (static - static * (busy / interval_s)) + (dynamic if work_total <= 0.0 else 0.0)
    dyn_per_work = dynamic / work_total if work_total > 0.0 else 0.0
    if math.isinf(dyn_per_work):  # subnormal work: its reciprocal overflows, so rescale it
        top = max(work)
        work = [x / top for x in work]
        dyn_per_work = dynamic / math.fsum(work)
    statics = [w * static_per_w for w in weights]
    if step_s > 0.0 and step_j > 0.0 and in_steps:
        # Token work stamped outside the request's span (clock skew) was in no step the
        # span saw: it pays dynamic energy only, as without the split.
        resident_own = [o if r > 0.0 else 0.0 for o, r in zip(own, res, strict=True)]
        statics = _shapley_static(math.fsum(statics), static / interval_s * step_j * step_s / delta,
                                  in_steps, resident_own) or statics
    if 0.0 in weights:  # a request with neither weight nor work gets no share
        keep = [w > 0.0 or x > 0.0 for w, x in zip(weights, work, strict=True)]
        if not all(keep):
            rids = tuple(compress(rids, keep))
            weights = list(compress(weights, keep))
            work = list(compress(work, keep))
            statics = list(compress(statics, keep))
    # Column by column, in C-level passes where it can (no tuple per share).
    dp, bp = dyn_per_work, busy_per_w
    dynamics = [x * dp for x in work]
    columns = ShareColumns(rids, list(map(add, statics, dynamics)), statics, dynamics,
                           [w * bp for w in weights])
    return Apportionment(energy_j=energy_j, static_j=static, dynamic_j=dynamic, idle_j=idle,
                         idle_s=interval_s - busy, columns=columns)


def _shapley_static(busy_j: float, fixed_j: float, in_steps: Sequence[float],
                    own: Sequence[float]) -> list[float] | None:
    """The busy static energy split as the Shapley value of the engine's steps splits it:
    the static power over the steps' fixed part (`fixed_j`, at most `busy_j`) by the steps
    each sequence was in, the rest by its token work. None when there is no token work to
    weigh the rest by (the caller keeps the residency split)."""
    steps_total, own_total = math.fsum(in_steps), math.fsum(own)
    fixed_j = min(fixed_j, busy_j)
    if steps_total <= 0.0 or own_total <= 0.0 or not math.isfinite(fixed_j):
        return None
    per_step, per_work = fixed_j / steps_total, (busy_j - fixed_j) / own_total
    if math.isinf(per_step) or math.isinf(per_work):
        return None
    return [q * per_step + o * per_work for q, o in zip(in_steps, own, strict=True)]


def apportion_by(energy_j: float, interval_s: float, idle_power_w: float,
                 rows: Sequence[Work], c: Coefficients) -> Apportionment:
    """The service's apportioning: coefficients of one engine/precision, instant sharing,
    the static power of the steps' fixed part by steps and the rest by work."""
    return apportion(energy_j, interval_s, idle_power_w, rows, c.alpha, c.beta, c.gamma,
                     c.delta, delta_1=c.delta_1, delta_half_tokens=c.delta_half_tokens,
                     instant=True, step_s=c.step_s)
