"""Budget arithmetic (pure): periods, cost estimates, and the admission check.

A request is admitted when, for every budget of its tenant, what the ledger has charged in
the period + what reservations hold + this request's estimate stays within the limit. The
estimate is prompt tokens x the cost of a prompt token + max_tokens x the cost of an output
token, at rates learnt from the tenant's own bills (gateway/tenancy/rates.py) for as many
tokens as those bills held, at the prior's beyond.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from accounting.pricing import Pricing
from core.vocab import value_type
from gateway.tenancy.config import Budget

HOUR_S = 3600.0
QUALITY_ORDER: tuple[str, ...] = ("bf16", "fp16", "fp8", "int8", "int4")


def period_start_hour(period: str, now_s: float) -> int:
    """The hour index (Unix hours) at which the UTC period holding `now_s` began."""
    hour = math.floor(now_s / HOUR_S)
    if period == "hour":
        return hour
    if period == "day":
        return hour - hour % 24
    t = datetime.fromtimestamp(now_s, UTC)
    start = datetime(t.year, t.month, 1, tzinfo=UTC)
    return math.floor(start.timestamp() / HOUR_S)


@value_type  # built several times per admission: a frozen dataclass's __init__ cost 3x
class Cost:
    """An amount in each budget unit."""

    j: float = 0.0
    gco2e: float = 0.0
    usd: float = 0.0

    def of(self, unit: str) -> float:
        return {"j": self.j, "gco2e": self.gco2e, "usd": self.usd}[unit]

    def plus(self, other: Cost) -> Cost:
        return Cost(self.j + other.j, self.gco2e + other.gco2e, self.usd + other.usd)

    def times(self, k: float) -> Cost:
        return Cost(self.j * k, self.gco2e * k, self.usd * k)


def priced(energy_j: float, pricing: Pricing, now_s: float) -> Cost:
    """`energy_j` with the carbon and cost the bill gives it (kWh x PUE x intensity, kWh x
    PUE x price; no GPU-hour share)."""
    carbon, cost = pricing.charges((energy_j,), (0.0,), now_s)
    return Cost(energy_j, carbon[0], cost[0])


@dataclass(frozen=True, slots=True)
class Rates:
    """What one prompt and one output token of a request cost: up to `prompt_upto` prompt
    and `output_upto` output tokens (the most the bills they were learnt from held) at
    `prompt` and `output`, the tokens beyond at `beyond`'s (the prior: a learnt rate says
    nothing of shapes past the bills it was learnt from)."""

    prompt: Cost
    output: Cost
    prompt_upto: float = math.inf
    output_upto: float = math.inf
    beyond: Rates | None = None


def estimate(prompt_tokens: float, output_tokens: float, rates: Rates) -> Cost:
    # Cost.times and Cost.plus written out (the same operations in the same order, so the
    # same floats): every admission and settlement estimates, and the intermediate Costs
    # were most of its time.
    p, o = rates.prompt, rates.output
    x, y = min(prompt_tokens, rates.prompt_upto), min(output_tokens, rates.output_upto)
    j, g, usd = p.j * x + o.j * y, p.gco2e * x + o.gco2e * y, p.usd * x + o.usd * y
    # no token beyond what the rates were learnt up to: the rest would add exact zeros
    if rates.beyond is not None and (prompt_tokens > x or output_tokens > y):
        more = estimate(max(0.0, prompt_tokens - rates.prompt_upto),
                        max(0.0, output_tokens - rates.output_upto), rates.beyond)
        j, g, usd = j + more.j, g + more.gco2e, usd + more.usd
    return Cost(j, g, usd)


@dataclass(frozen=True, slots=True)
class Spend:
    """One budget's standing: charged by the ledger in its period, held by reservations."""

    budget: Budget
    spent: float
    held: float

    @property
    def remaining(self) -> float:
        return self.budget.limit - self.spent - self.held

    @property
    def used_ratio(self) -> float:
        return (self.spent + self.held) / self.budget.limit


def spends(budgets: Sequence[Budget], hours: Sequence[tuple[int, float, float, float]],
           held: Cost, now_s: float) -> list[Spend]:
    """Each budget's spend from the tenant's hourly charges (hour, J, gCO2e, USD)."""
    out = []
    for b in budgets:
        start = period_start_hour(b.period, now_s)
        column = {"j": 1, "gco2e": 2, "usd": 3}[b.unit]
        spent = math.fsum(float(h[column]) for h in hours if int(h[0]) >= start)
        out.append(Spend(b, spent, held.of(b.unit)))
    return out


def first_over(standing: Sequence[Spend], cost: Cost) -> Spend | None:
    """The first budget this cost does not fit in (None: it fits in all)."""
    for s in standing:
        if cost.of(s.budget.unit) > s.remaining:
            return s
    return None


def choose_precision(standing: Sequence[Spend], prompt_tokens: float, output_tokens: float,
                     first: str, cheaper: Sequence[str], rates: Mapping[str, Rates]
                     ) -> tuple[str, Cost] | None:
    """The precision to admit at: `first` if its estimate fits, else the first of `cheaper`
    that fits (the downgrade), else None."""
    for precision in (first, *cheaper):
        cost = estimate(prompt_tokens, output_tokens, rates[precision])
        if first_over(standing, cost) is None:
            return precision, cost
    return None
