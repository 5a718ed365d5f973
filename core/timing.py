"""Latency metrics from a request's timeline (pure). Names and definitions follow `vllm bench serve`.

- TTFT: first token-bearing SSE event - request start (not the first byte).
- TPOT: (last token event - first token event) / (completion_tokens - 1), from the server's usage
  count, never from counting chunks (engines coalesce several tokens per event).
- ITL: every gap between consecutive token-bearing events. Events that arrived in one read share
  one timestamp, so their gaps are 0, as in `vllm bench serve`'s client.
- Token-normalised ITL: each gap divided by the mean tokens per event of the request
  ((completion_tokens - 1) / (events - 1)), because a chunk may carry more than one token.
- E2E: last token event (or the end of a non-streamed body) - request start.

GuideLLM and AIPerf call vLLM's TPOT "ITL"; here ITL always means the per-gap value.
All times are seconds on one monotonic clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from operator import sub

from core.vocab import SloClass, value_type


def tpot_s(first_token_s: float | None, last_token_s: float | None, completion_tokens: int
           ) -> float | None:
    """Time per output token after the first; None when fewer than two tokens were produced."""
    if first_token_s is None or last_token_s is None or completion_tokens < 2:
        return None
    return (last_token_s - first_token_s) / (completion_tokens - 1)


def tokens_per_event(completion_tokens: int, events: int) -> float:
    """Mean tokens carried by each event after the first (>= 1 for a sane stream)."""
    if events < 2 or completion_tokens < 2:
        return 1.0
    return max(1.0, (completion_tokens - 1) / (events - 1))


@value_type
class Latency:
    """The user-felt latencies of one request, seconds."""

    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    itl_s: tuple[float, ...]
    itl_norm_s: tuple[float, ...]


def itl_gaps(times: Sequence[float], events: Sequence[int]) -> list[float]:
    """ITL gaps straight from per-read timestamps and token-bearing event counts: the first
    event of a read is `t - previous read`, the others in the same read are 0 (the per-event
    definition). One event per read (the usual case) takes C-level passes."""
    if len(times) == sum(events):
        return list(map(sub, islice(times, 1, None), times))
    out: list[float] = []
    prev: float | None = None
    for t, n in zip(times, events, strict=True):
        if prev is not None:
            out.append(t - prev)
        if n > 1:
            out.extend([0.0] * (n - 1))
        prev = t
    return out


def split_reads(reads: Iterable[tuple[float, int]]) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Per-read (timestamp, token-bearing events) pairs as two columns: (times, events)."""
    pairs = tuple(reads)
    return tuple(t for t, _ in pairs), tuple(n for _, n in pairs)


def latency(start_s: float, reads: Sequence[tuple[float, int]], completion_tokens: int,
            end_s: float | None) -> Latency:
    """`latency_of` per-read (timestamp, token-bearing events) pairs."""
    return latency_of(start_s, *split_reads(reads), completion_tokens, end_s)


def latency_of(start_s: float, times: Sequence[float], events: Sequence[int],
               completion_tokens: int, end_s: float | None) -> Latency:
    """Latencies from the start time and, per engine read, its time and token-bearing events.

    `end_s` is used as the end for non-streamed responses (no token events).
    """
    if not times:
        e2e = None if end_s is None else end_s - start_s
        # A non-streamed body: its first token is only visible at the end.
        return Latency(ttft_s=e2e if completion_tokens else None, tpot_s=None, e2e_s=e2e,
                       itl_s=(), itl_norm_s=())
    first, last = times[0], times[-1]
    gaps = itl_gaps(times, events)
    scale = 1.0 / tokens_per_event(completion_tokens, len(gaps) + 1)
    itl = tuple(gaps)
    return Latency(
        ttft_s=first - start_s,
        tpot_s=tpot_s(first, last, completion_tokens),
        e2e_s=last - start_s,
        itl_s=itl,
        itl_norm_s=itl if scale == 1.0 else tuple(g * scale for g in gaps),
    )


def slo_met(slo: SloClass, lat: Latency, ok: bool) -> bool:
    """True when the request succeeded and met every limit its SLO class sets."""
    if not ok:
        return False
    if slo.ttft_s is not None and (lat.ttft_s is None or lat.ttft_s > slo.ttft_s):
        return False
    if slo.tpot_s is not None and lat.tpot_s is not None and lat.tpot_s > slo.tpot_s:
        return False
    return not (slo.e2e_s is not None and (lat.e2e_s is None or lat.e2e_s > slo.e2e_s))
