"""`slo_energy` (pure): the fewest predicted joules that still meet the tenant's SLO.

Among the candidates (already limited to the precisions the tenant may use), each endpoint's
learnt curves predict, at its current load, the request's TTFT and TPOT and the joules it
would add (`Curves.marginal_j`: its own tokens, the slowdown of the others, none of the idle
power the engine burns anyway). The policy takes the endpoint with the fewest marginal joules
among those not full; when every one is full, the one with the best predicted latency
relative to the SLO. Since J per token falls steeply with batch, the cheapest endpoint is
usually an efficient one that is already busy: load packs onto efficient engines while
headroom lasts and spills to the next when it runs out.

Until every candidate's curves are learnt (none `cold`), the policy spreads load as
`least_load` does: priors say where to start, not where to pack.

Hysteresis: an endpoint becomes full when its predicted latency exceeds `slo_margin` x the
SLO, and stays full until the prediction falls below (1 - band) x that, so an engine at the
edge does not flip in and out of the packing order with every request.

Bursts: an endpoint not full is still passed over for one request when the prefill pending
on it (`Curves.pending_prefill_tokens`, a burst's prompts not yet prefilled) would push that
request's or its short streams' predicted latency past the margin (`burst_ratio`). This is
per request and outside the hysteresis: it lapses as the pending prefill drains.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.base import Candidate, RoutingContext
from gateway.routing.models import Curves


def slo_ratio(c: Candidate, curves: Curves, ctx: RoutingContext, extra_load: float = 0.0
              ) -> float:
    """Predicted latency over the SLO, the worse of TTFT and TPOT (1.0: exactly at it; 0 when
    the SLO class sets no limit)."""
    load = c.load + extra_load
    ratio = 0.0
    if ctx.ttft_slo_s is not None:
        ratio = curves.ttft(load, ctx.prompt_tokens) / ctx.ttft_slo_s
    if ctx.tpot_slo_s is not None:
        ratio = max(ratio, curves.tpot(load) / ctx.tpot_slo_s)
    return ratio


def burst_ratio(c: Candidate, curves: Curves, ctx: RoutingContext) -> float:
    """`slo_ratio` with the prefill pending on the endpoint (`Curves.pending_prefill_tokens`)
    added: queued ahead of the request's prompt (TTFT) and sharing the decode steps (TPOT,
    spread over the output of the request or of a short stream resident there, whichever is
    shorter: sending more of a burst to an engine slows the short streams it holds too).
    Equal to `slo_ratio` with none pending; non-decreasing in the pending prefill."""
    pending = curves.pending_prefill_tokens
    out = min(ctx.output_tokens, curves.short_output_tokens)
    ratio = 0.0
    if ctx.ttft_slo_s is not None:
        ratio = curves.ttft_burst(c.load, ctx.prompt_tokens, pending) / ctx.ttft_slo_s
    if ctx.tpot_slo_s is not None:
        ratio = max(ratio, curves.tpot_burst(c.load, pending, out)
                    / ctx.tpot_slo_s)
    return ratio


def next_full(previous: frozenset[str], candidates: Sequence[Candidate], ctx: RoutingContext,
              band: float) -> frozenset[str]:
    """The endpoints full now, given those that were: enter above the margin, leave only
    below (1 - band) x the margin. Endpoints without curves are never full."""
    full = set()
    for c in candidates:
        curves = ctx.curves.get(c.name)
        if curves is None:
            continue
        r = slo_ratio(c, curves, ctx) / ctx.slo_margin
        if r > 1.0 or (c.name in previous and r > 1.0 - band):
            full.add(c.name)
    return frozenset(full)


def slo_energy(candidates: Sequence[Candidate], ctx: RoutingContext) -> int:
    """Index of the endpoint with the fewest predicted marginal joules among those not full;
    if all are full, the best predicted latency; without curves, the least loaded."""
    known = [i for i, c in enumerate(candidates) if c.name in ctx.curves]
    if not known or any(ctx.curves[candidates[i].name].cold for i in known):
        # No learner wired in, or an endpoint still on its cold-start prior: spread load
        # (least loaded) so every endpoint is measured before any is packed. Packing on
        # priors alone sent a demo's load to INT4 and met the SLO for 51-61 % of requests.
        return min(range(len(candidates)), key=lambda i: (candidates[i].load, i))
    # Open: not held full by the hysteresis (latency by load), and not predicted to miss
    # because of the prefill a burst has queued on it (per request: a short stream cannot
    # average out a lump a long one can).
    open_ = [i for i in known if candidates[i].name not in ctx.full
             and burst_ratio(candidates[i], ctx.curves[candidates[i].name], ctx)
             <= ctx.slo_margin]

    def joules(i: int) -> tuple[float, float, str]:
        c = candidates[i]
        j = ctx.curves[c.name].marginal_j(c.load, ctx.prompt_tokens, ctx.output_tokens)
        return (j, -c.load, c.name)

    if open_:
        return min(open_, key=joules)
    return min(known, key=lambda i: (burst_ratio(candidates[i], ctx.curves[candidates[i].name],
                                                 ctx), joules(i)))
