"""Budget arithmetic (pure): periods, cost estimates per precision, and the admission check.

A request is admitted when, for every budget of its tenant, what the ledger has charged in
the period + what open reservations hold + this request's estimate stays within the limit.
The estimate is (prompt tokens + max_tokens) x the precision's energy, carbon and cost per
token: live from the ledger's recent bills where there are enough of them, else the default
below, priced as the bill is (kWh x PUE x intensity, kWh x PUE x price; no GPU-hour share).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.accounting.pricing import Pricing
from gateway.tenancy.config import Budget

HOUR_S = 3600.0
# Budgets count cost-weighted tokens: a completion token is one, a prompt token
# PROMPT_TOKEN_WEIGHT of one. A decoded token costs 20-50x a prompt token on a GPU (a decode
# step reads every weight for a few tokens; a prefill step for thousands), so counting both
# alike made a chat request's reservation a fraction of its bill, and a burst of them
# overspent a budget by up to 86 %.
PROMPT_TOKEN_WEIGHT = 0.05
# Joules per weighted token when the ledger has no recent bill for a precision: an 8B model
# on one H100 at light load (batch 1-8), idle share included, rounded up (a reservation that
# is too big refuses early; one too small lets a budget overshoot). Recent bills replace it.
DEFAULT_J_PER_TOKEN: dict[str, float] = {
    "bf16": 1.5, "fp16": 1.5, "fp8": 1.8, "int8": 1.5, "int4": 1.0,
}


def weighted_tokens(prompt_tokens: float, completion_tokens: float) -> int:
    """The tokens a budget counts for a request (see PROMPT_TOKEN_WEIGHT)."""
    return math.ceil(completion_tokens + PROMPT_TOKEN_WEIGHT * prompt_tokens)
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


@dataclass(frozen=True, slots=True)
class Cost:
    """An amount in each budget unit."""

    j: float = 0.0
    gco2e: float = 0.0
    usd: float = 0.0

    def of(self, unit: str) -> float:
        return {"j": self.j, "gco2e": self.gco2e, "usd": self.usd}[unit]

    def plus(self, other: Cost) -> Cost:
        return Cost(self.j + other.j, self.gco2e + other.gco2e, self.usd + other.usd)


def per_token_default(precision: str, pricing: Pricing, now_s: float) -> Cost:
    energy_j = DEFAULT_J_PER_TOKEN.get(precision, DEFAULT_J_PER_TOKEN["bf16"])
    carbon, cost = pricing.charges((energy_j,), (0.0,), now_s)
    return Cost(energy_j, carbon[0], cost[0])


def estimate(tokens: int, per_token: Cost) -> Cost:
    return Cost(tokens * per_token.j, tokens * per_token.gco2e, tokens * per_token.usd)


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


def choose_precision(standing: Sequence[Spend], tokens: int, first: str,
                     cheaper: Sequence[str], per_token: Mapping[str, Cost]
                     ) -> tuple[str, Cost] | None:
    """The precision to admit at: `first` if its estimate fits, else the first of `cheaper`
    that fits (the downgrade), else None."""
    for precision in (first, *cheaper):
        cost = estimate(tokens, per_token[precision])
        if first_over(standing, cost) is None:
            return precision, cost
    return None
