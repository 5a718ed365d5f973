"""What a tenant's tokens cost, learnt from that tenant's own bills (pure).

A budget reserves a request's estimate before it runs: prompt tokens x the cost of a prompt
token + max_tokens x the cost of an output token. Both rates are learnt per precision and
prompt-length band from the tenant's own recent, final bills (a request's energy and its
prompt and completion tokens), never from other tenants' traffic: a neighbour's cheap
short-prompt traffic says nothing of what this tenant's 16k-token prompts cost. A band in
which the tenant has too few bills of its own uses the conservative prior below.

The fit is least squares of energy = a x prompt + b x completion over the band's bills (a,
b >= 0; where the bills cannot tell a from b, as when every request has the same shape, the
prior's ratio of a to b is scaled to the bills), then scaled up by the worst under-estimate
among those bills (at most MAX_MARGIN): the estimate of a request shaped like one already
billed is at least its bill. A budget can then overshoot by what one request costs beyond
its estimate (a shape the tenant never sent before, at the prior), not by a multiple of it.

A fit says nothing past the bills it was learnt from: bills with 1-30 output tokens give an
output rate near 0 (least squares puts their cost on the prompt), and a request of the same
prompts with max_tokens 2,000 would be reserved at its prompt's cost alone. So the learnt
rates apply up to the most prompt and output tokens a bill of the band held, and the tokens
beyond are reserved at the prior's rates.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from accounting.pricing import Pricing
from gateway.tenancy.budget import Cost, Rates, priced

# Prompt-length bands (tokens): a prompt token of a long context costs more (attention), and
# a tenant's short and long requests are learnt apart.
PROMPT_BANDS: tuple[int, ...] = (512, 2048, 8192)
# The prior, J per output token where a band has no bills of the tenant's own (or past the
# tokens its bills held): what a lone stream's token costs an 8B model on one H100, a step's
# weight reads and the static power over it carried by that one token (the simulator: 2.0 J
# at vLLM BF16, 3.2 at FP8, 1.9 at INT8, 1.0 at INT4; TensorRT-LLM less), rounded up. A
# reservation too big refuses early; one too small lets a budget overshoot.
PRIOR_J_PER_OUTPUT_TOKEN: dict[str, float] = {
    "bf16": 2.2, "fp16": 2.2, "fp8": 3.6, "int8": 2.1, "int4": 1.1,
}
# J per prompt token at the prior: an 8B model's prefill is ~16 GFLOP a token, a third more at
# a 10k-token context (attention); an H100 at 700 W doing 300-400 TFLOP/s spends 0.02-0.04 J
# on it (the simulator: 0.021 at BF16, 0.016 at FP8, 0.040 at INT4, whose GEMMs dequantise).
PRIOR_J_PER_PROMPT_TOKEN: dict[str, float] = {
    "bf16": 0.05, "fp16": 0.05, "fp8": 0.05, "int8": 0.05, "int4": 0.06,
}
MIN_BILLS = 3  # fewer bills of its own in a band: the prior
MAX_MARGIN = 2.0  # the most the worst under-estimate among the bills scales the fit by


class Bill(NamedTuple):
    """One final request of a tenant: its precision, tokens and charges (a tuple: a refresh
    makes thousands of them, and a frozen dataclass costs four times as much)."""

    precision: str
    prompt_tokens: int
    completion_tokens: int
    energy_j: float
    carbon_g: float
    cost_usd: float


def band_of(prompt_tokens: float) -> int:
    return bisect.bisect_right(PROMPT_BANDS, prompt_tokens)


def prior_j(precision: str) -> tuple[float, float]:
    """(J per prompt token, J per output token) when nothing is learnt."""
    output = PRIOR_J_PER_OUTPUT_TOKEN.get(precision, PRIOR_J_PER_OUTPUT_TOKEN["bf16"])
    return PRIOR_J_PER_PROMPT_TOKEN.get(precision, PRIOR_J_PER_PROMPT_TOKEN["bf16"]), output


_PRIORS: dict[tuple[str, float, float, float], Rates] = {}  # by precision and the prices


def prior(precision: str, pricing: Pricing, now_s: float) -> Rates:
    """The prior's rates at `precision`, priced as at `now_s` (kept per precision and the
    carbon intensity and price that apply: every admission asks for them)."""
    key = (precision, pricing.pue, pricing.intensity_g_per_kwh.at(now_s),
           pricing.price_usd_per_kwh.at(now_s))
    got = _PRIORS.get(key)
    if got is None:
        if len(_PRIORS) > 1024:  # a price series that steps often: start again
            _PRIORS.clear()
        a, b = prior_j(precision)
        got = _PRIORS[key] = Rates(priced(a, pricing, now_s), priced(b, pricing, now_s))
    return got


def fit_j(bills: Sequence[Bill], prior_ratio: float) -> tuple[float, float] | None:
    """(J per prompt token, J per output token) fitted to `bills`, margin included; None when
    they are too few. `prior_ratio`: a / b where the bills cannot tell them apart."""
    rows = [(float(b.prompt_tokens), float(b.completion_tokens), b.energy_j) for b in bills
            if b.energy_j > 0 and b.prompt_tokens + b.completion_tokens > 0]
    if len(rows) < MIN_BILLS:
        return None
    spp = math.fsum(p * p for p, _, _ in rows)
    scc = math.fsum(c * c for _, c, _ in rows)
    spc = math.fsum(p * c for p, c, _ in rows)
    spe = math.fsum(p * e for p, _, e in rows)
    sce = math.fsum(c * e for _, c, e in rows)
    det = spp * scc - spc * spc
    if det > 1e-6 * spp * scc:  # the shapes differ enough to tell a prompt token from an output one
        a, b = (spe * scc - sce * spc) / det, (sce * spp - spe * spc) / det
        if a < 0 or b < 0:  # the best non-negative fit has one of them 0: the closer one
            only_a, only_b = (spe / spp, 0.0), (0.0, sce / scc)
            a, b = min(only_a, only_b, key=lambda ab: math.fsum(
                (e - ab[0] * p - ab[1] * c) ** 2 for p, c, e in rows))
    else:  # one shape: one rate, in the prior's proportion (energy = s x (ratio x p + c))
        w = [(prior_ratio * p + c, e) for p, c, e in rows]
        s = math.fsum(x * e for x, e in w) / math.fsum(x * x for x, _ in w)
        a, b = s * prior_ratio, s
    worst = max(e / (a * p + b * c) for p, c, e in rows if a * p + b * c > 0)
    margin = min(max(worst, 1.0), MAX_MARGIN)
    return a * margin, b * margin


class TenantRates:
    """One tenant's learnt rates per (precision, prompt band), each up to the most prompt
    and output tokens its bills held, and the prior elsewhere and beyond."""

    __slots__ = ("_joined", "learnt")

    def __init__(self, learnt: Mapping[tuple[str, int], Rates] | None = None):
        self.learnt = dict(learnt or {})
        # (precision, band) -> (the prior, the learnt rates with it beyond): every admission
        # and settlement asks, and a dataclass copy each time cost more than the estimate
        self._joined: dict[tuple[str, int], tuple[Rates, Rates]] = {}

    @classmethod
    def from_bills(cls, bills: Iterable[Bill]) -> TenantRates:
        groups: dict[tuple[str, int], list[Bill]] = {}
        for b in bills:
            groups.setdefault((b.precision, band_of(b.prompt_tokens)), []).append(b)
        learnt: dict[tuple[str, int], Rates] = {}
        for key, group in groups.items():
            a0, b0 = prior_j(key[0])
            fitted = fit_j(group, a0 / b0)
            if fitted is None:
                continue
            energy = math.fsum(x.energy_j for x in group)
            # carbon and cost per joule as these bills were priced
            g_per_j = math.fsum(x.carbon_g for x in group) / energy if energy > 0 else 0.0
            usd_per_j = math.fsum(x.cost_usd for x in group) / energy if energy > 0 else 0.0
            prompt_j, output_j = fitted
            learnt[key] = Rates(Cost(prompt_j, prompt_j * g_per_j, prompt_j * usd_per_j),
                                Cost(output_j, output_j * g_per_j, output_j * usd_per_j),
                                float(max(x.prompt_tokens for x in group)),
                                float(max(x.completion_tokens for x in group)))
        return cls(learnt)

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any]]) -> TenantRates:
        """From the ledger's bill rows (`tenant_bills`: Bill's fields in order). Milliseconds
        of Python for a busy tenant's rows: the store runs it on a worker thread."""
        return cls.from_bills(map(Bill._make, rows))

    def describe(self) -> list[dict[str, object]]:
        """The learnt rates, for `/v1/usage`: per precision and prompt band (tokens, the
        upper bound exclusive, None: unbounded), J per prompt token and per output token, and
        the most prompt and output tokens they apply to (the prior's rates beyond)."""
        edges = (0, *PROMPT_BANDS, None)
        return [{"precision": precision, "prompt_tokens": [edges[band], edges[band + 1]],
                 "j_per_prompt_token": r.prompt.j, "j_per_output_token": r.output.j,
                 "learnt_up_to": {"prompt_tokens": int(r.prompt_upto),
                                  "output_tokens": int(r.output_upto)}}
                for (precision, band), r in sorted(self.learnt.items())]

    def rates(self, precision: str, prompt_tokens: float, pricing: Pricing, now_s: float
              ) -> Rates:
        base = prior(precision, pricing, now_s)
        key = (precision, band_of(prompt_tokens))
        got = self.learnt.get(key)
        if got is None:
            return base
        joined = self._joined.get(key)
        if joined is None or joined[0] is not base:  # the prior is re-priced (prior() keeps one)
            joined = self._joined[key] = (base, replace(got, beyond=base))
        return joined[1]


_NO_RATES = TenantRates()


class RatesMemo:
    """`TenantRates.rates` per tenant, precision and prompt band, kept while they cannot
    change: the same learnt rates (the mapping a refresh replaces) and the same prices (the
    step of each pricing series that `now_s` is in). Every admission asks for its candidate
    precisions' and every settlement for its own; worked out each time, they were a fifth of
    the admission's Python."""

    __slots__ = ("_from_s", "_got", "_learnt", "_until_s", "pricing")

    def __init__(self, pricing: Pricing):
        self.pricing = pricing
        self._got: dict[tuple[str, str, int], Rates] = {}
        self._learnt: Mapping[str, TenantRates] | None = None
        self._from_s, self._until_s = math.inf, -math.inf

    def rates(self, learnt: Mapping[str, TenantRates], tenant: str, precision: str,
              prompt_tokens: float, now_s: float) -> Rates:
        """`tenant`'s rates (`learnt`: every tenant's, replaced whole, never changed in
        place) at `precision` for a prompt of `prompt_tokens`, priced as at `now_s`."""
        if learnt is not self._learnt or not self._from_s <= now_s < self._until_s:
            self._got.clear()
            self._learnt = learnt
            p = self.pricing
            (a, b), (c, d) = p.intensity_g_per_kwh.span(now_s), p.price_usd_per_kwh.span(now_s)
            self._from_s, self._until_s = max(a, c), min(b, d)
        key = (tenant, precision, band_of(prompt_tokens))
        got = self._got.get(key)
        if got is None:
            got = self._got[key] = (learnt.get(tenant) or _NO_RATES).rates(
                precision, prompt_tokens, self.pricing, now_s)
        return got
