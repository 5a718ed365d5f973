"""Run summaries (pure): latency distributions from send and from intended arrival, schedule lag,
achieved vs requested rate, goodput and attainment per SLO class and per tenant.

Requests are counted by outcome class (served, refused, failed, cancelled: core/outcomes.py,
graded from the client's side by loadgen.results.client_outcome), as the gateway's metrics
count them: attainment is over served and failed requests (a failure is a miss), refusals and
cancellations are counted apart and are neither hits nor misses.

Latency definitions are core.timing's (vLLM `bench serve` names). Each is computed twice:
- from send: what the server took once the request was on the wire;
- from intended: what a user arriving on schedule felt, including the client's own lateness.
  This is the coordinated-omission-free number and the one SLOs are graded on.
If the schedule lag p99 exceeds the threshold, the generator did not offer the requested load;
the summary then refuses to grade SLOs and says why.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from core.outcomes import counts_for_slo
from core.timing import Latency, latency, slo_met
from core.vocab import OutcomeClass, SloClass
from loadgen.results import RequestResult

DEFAULT_LAG_THRESHOLD_S = 0.010


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Dist:
    """Distribution summary of one quantity (seconds unless the field says otherwise)."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @staticmethod
    def of(values: Iterable[float]) -> Dist:
        v = sorted(values)
        if not v:
            return Dist(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        return Dist(len(v), sum(v) / len(v), percentile(v, 50), percentile(v, 90),
                    percentile(v, 99), v[-1])


@dataclass(frozen=True, slots=True)
class LatencyStats:
    ttft_s: Dist
    tpot_s: Dist
    itl_s: Dist
    itl_norm_s: Dist  # each gap / mean tokens per event of its request
    e2e_s: Dist


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """One request's latencies from both starts, and whether it met its SLO (from intended)."""

    result: RequestResult
    from_send: Latency
    from_intended: Latency
    slo_met: bool


def request_metrics(r: RequestResult, slo: SloClass) -> RequestMetrics:
    end = r.end_s if r.ok else None
    send = latency(r.sent_s, r.reads, r.completion_tokens, end)
    intended = latency(r.intended_s, r.reads, r.completion_tokens, end)
    return RequestMetrics(r, send, intended, slo_met(slo, intended, r.ok))


def latency_stats(ms: Sequence[RequestMetrics], pick: Callable[[RequestMetrics], Latency]
                  ) -> LatencyStats:
    ok = [pick(m) for m in ms if m.result.ok]
    return LatencyStats(
        ttft_s=Dist.of(x.ttft_s for x in ok if x.ttft_s is not None),
        tpot_s=Dist.of(x.tpot_s for x in ok if x.tpot_s is not None),
        itl_s=Dist.of(g for x in ok for g in x.itl_s),
        itl_norm_s=Dist.of(g for x in ok for g in x.itl_norm_s),
        e2e_s=Dist.of(x.e2e_s for x in ok if x.e2e_s is not None),
    )


@dataclass(frozen=True, slots=True)
class GroupStats:
    """One SLO class or tenant. goodput/attainment are None when the run is not graded, and
    attainment also when nothing was served or failed (no request to judge)."""

    name: str
    slo: str  # the SLO class (limits) the group was graded against, e.g. "ttft<=0.5s tpot<=0.05s"
    sent: int
    ok: int  # served
    refused: int
    failed: int
    cancelled: int
    output_tokens: int
    goodput_rps: float | None
    attainment: float | None
    ttft_s: Dist  # from intended arrival
    tpot_s: Dist
    e2e_s: Dist


def describe_slo(slo: SloClass) -> str:
    parts = [f"{k}<={v:g}s" for k, v in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s),
                                         ("e2e", slo.e2e_s)) if v is not None]
    return f"{slo.name}: " + (" ".join(parts) if parts else "no limits")


def outcome_counts(results: Iterable[RequestResult]) -> Counter[OutcomeClass]:
    """Requests per outcome class."""
    return Counter(r.outcome for r in results)


def attainment_of(met: int, outcomes: Counter[OutcomeClass]) -> float | None:
    """Met / (served + failed); None when there was neither."""
    judged = sum(n for cls, n in outcomes.items() if counts_for_slo(cls))
    return met / judged if judged else None


def _group(name: str, slo: str, ms: Sequence[RequestMetrics], duration_s: float, graded: bool
           ) -> GroupStats:
    ok = [m for m in ms if m.result.ok]
    good = sum(1 for m in ms if m.slo_met)
    outcomes = outcome_counts(m.result for m in ms)
    return GroupStats(
        name=name, slo=slo, sent=len(ms), ok=len(ok), refused=outcomes["refused"],
        failed=outcomes["failed"], cancelled=outcomes["cancelled"],
        output_tokens=sum(m.result.completion_tokens for m in ok),
        goodput_rps=(good / duration_s if duration_s > 0 else 0.0) if graded else None,
        attainment=attainment_of(good, outcomes) if graded else None,
        ttft_s=Dist.of(m.from_intended.ttft_s for m in ok if m.from_intended.ttft_s is not None),
        tpot_s=Dist.of(m.from_intended.tpot_s for m in ok if m.from_intended.tpot_s is not None),
        e2e_s=Dist.of(m.from_intended.e2e_s for m in ok if m.from_intended.e2e_s is not None))


@dataclass(frozen=True, slots=True)
class Summary:
    label: str
    requests: int
    ok: int  # served
    refused: int
    failed: int
    cancelled: int
    errors: dict[str, int]  # requests per client status (http_429, timeout, ...), but ok
    duration_s: float  # first intended arrival -> last response end
    requested_rate_rps: float
    achieved_rate_rps: float  # sends per second over the span of sends
    throughput_rps: float  # successful responses per second of duration
    output_tokens_per_s: float
    lag_s: Dist
    from_send: LatencyStats
    from_intended: LatencyStats
    graded: bool
    grading_note: str
    lag_threshold_s: float
    per_class: tuple[GroupStats, ...]
    per_tenant: tuple[GroupStats, ...]
    goodput_rps: float | None  # all classes together
    attainment: float | None  # over served and failed requests


def summarize(results: Sequence[RequestResult], slo_of: Callable[[str], SloClass], *,
              requested_rate_rps: float, label: str = "",
              lag_threshold_s: float = DEFAULT_LAG_THRESHOLD_S,
              closed_loop: bool = False) -> tuple[Summary, list[RequestMetrics]]:
    """Summarise one run. `slo_of(class name)` gives each class's limits."""
    ms = [request_metrics(r, slo_of(r.slo_class)) for r in results]
    sent = [r for r in results if r.status != "cancelled"]
    lags = Dist.of(r.lag_s for r in sent)
    start = min((r.intended_s for r in results), default=0.0)
    end = max((r.end_s for r in results), default=0.0)
    duration = max(end - start, 1e-9)
    sends = sorted(r.sent_s for r in sent)
    span = sends[-1] - sends[0] if len(sends) > 1 else 0.0
    achieved = (len(sends) - 1) / span if span > 0 else math.inf
    if not sent:
        graded, note = False, "not graded: no request was sent"
    elif not closed_loop and lags.p99 > lag_threshold_s:
        graded = False
        note = (f"not graded: schedule lag p99 {lags.p99 * 1e3:.2f} ms > threshold "
                f"{lag_threshold_s * 1e3:.2f} ms (the client could not keep its schedule; "
                f"use more --workers or a lower rate)")
    else:
        graded = True
        note = ("graded from intended arrival" if not closed_loop
                else "graded from send (closed loop: intended = send)")
    errors = Counter(r.status for r in results if not r.ok)
    ok = [r for r in results if r.ok]
    classes = sorted({r.slo_class for r in results})
    tenants = sorted({r.tenant for r in results})
    per_class = tuple(_group(c, describe_slo(slo_of(c)),
                             [m for m in ms if m.result.slo_class == c], duration, graded)
                      for c in classes)
    per_tenant = tuple(
        _group(t, ", ".join(sorted({m.result.slo_class for m in ms if m.result.tenant == t})),
               [m for m in ms if m.result.tenant == t], duration, graded) for t in tenants)
    good = sum(1 for m in ms if m.slo_met)
    outcomes = outcome_counts(results)
    summary = Summary(
        label=label, requests=len(results), ok=len(ok), refused=outcomes["refused"],
        failed=outcomes["failed"], cancelled=outcomes["cancelled"], errors=dict(errors),
        duration_s=duration,
        requested_rate_rps=requested_rate_rps, achieved_rate_rps=achieved,
        throughput_rps=len(ok) / duration,
        output_tokens_per_s=sum(r.completion_tokens for r in ok) / duration, lag_s=lags,
        from_send=latency_stats(ms, lambda m: m.from_send),
        from_intended=latency_stats(ms, lambda m: m.from_intended), graded=graded,
        grading_note=note, lag_threshold_s=lag_threshold_s, per_class=per_class,
        per_tenant=per_tenant, goodput_rps=good / duration if graded else None,
        attainment=attainment_of(good, outcomes) if graded else None)
    return summary, ms
