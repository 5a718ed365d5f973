"""Admission of one request against its tenant's controls, and its release when it ends.

`Admission.admit` runs before routing: the rate limits first (this process's buckets, no I/O;
with a shared store, leases of the replicas' common buckets, shared.py), then, for
a tenant with budgets or a concurrency cap and a ledger, the reservation in the ledger
(store.py); without a ledger the cap is kept in this process. It returns a `Ticket` (headers
for the response, a precision forced by a downgrade) or raises a 429. `release` settles the
tokens and the reservation from the request's record.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

from accounting.ledger.base import LedgerError
from core.errors import OverloadedError, WattgateError
from core.records import RequestRecord
from gateway.config import GatewayConfig, Tenant
from gateway.routing.precision import select_precisions
from gateway.tenancy.budget import HOUR_S, Cost, Spend, estimate
from gateway.tenancy.errors import BudgetExceededError, TenantLimitError
from gateway.tenancy.metrics import TenancyMetrics
from gateway.tenancy.ratelimit import TenantRateLimiter
from gateway.tenancy.renewal import StoreVerdict
from gateway.tenancy.shared import SharedRates
from gateway.tenancy.store import TenancyStore


@dataclass(slots=True)
class Ticket:
    tenant: str
    tokens: int = 0  # reserved in the token bucket
    precision: str | None = None  # forced by a budget downgrade
    headers: dict[str, str] = field(default_factory=dict)
    reserved: bool = False  # a reservation in the ledger
    local_slot: bool = False  # a local concurrency slot
    local_rates: bool = False  # taken from this process's buckets though a store is shared


def seconds_to_next_period(period: str, now_s: float) -> float:
    if period == "hour":
        return HOUR_S - now_s % HOUR_S
    if period == "day":
        return 86400.0 - now_s % 86400.0
    t = datetime.fromtimestamp(now_s, UTC)
    nxt = datetime(t.year + t.month // 12, t.month % 12 + 1, 1, tzinfo=UTC)
    return nxt.timestamp() - now_s


class Admission:
    def __init__(self, config: GatewayConfig, metrics: TenancyMetrics | None, *,
                 clock: Callable[[], float], store: TenancyStore | None = None,
                 shared: SharedRates | None = None):
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.store = store
        self.shared = shared  # None: rate limits per process (limit / live replicas)
        now = clock()
        self.limiters = {t.name: TenantRateLimiter(t.limits, now) for t in config.tenants
                         if t.limits.any}
        self.active: dict[str, int] = {t.name: 0 for t in config.tenants}
        # looked up per request: a set, not the tenant's fields each time
        self._controlled = frozenset(t.name for t in config.tenants
                                     if t.limits.any or t.budgets.budgets)
        if metrics is not None:  # read when scraped, not set twice per request
            for name in sorted(self._controlled):
                metrics.active.labels(name).set_function(partial(self.active.__getitem__, name))
        acct = config.accounting
        self.interval_s = acct.interval_s if acct is not None else 1.0
        # a finished request's energy is final this long after its last interval ends
        self.final_after_s = (self.interval_s + acct.settle_s + acct.poll_s
                              if acct is not None else 0.0)
        self.max_model_len = {m.name: m.max_model_len for m in config.models}

    def controlled(self, tenant: Tenant) -> bool:
        return tenant.name in self._controlled

    def set_replicas(self, replicas: int) -> None:
        """Each process enforces its share of the rate limits."""
        for limiter in self.limiters.values():
            limiter.set_share(1.0 / max(1, replicas))

    def _settle(self, limiter: TenantRateLimiter, ticket: Ticket, used: int) -> None:
        if self.shared is None or ticket.local_rates:
            limiter.settle(ticket.tokens, used)
        else:
            self.shared.settle(ticket.tenant, ticket.tokens, used)

    def _refuse(self, tenant: str, reason: str, err: TenantLimitError) -> TenantLimitError:
        if self.metrics is not None:
            self.metrics.limited.labels(tenant, reason).inc()
        return err

    def output_tokens(self, model: str, prompt_tokens: int, max_tokens: int | None) -> int:
        """The output tokens a request may ask for: its max_tokens, else what the model's
        context leaves after the prompt (as LiteLLM reserves), else the configured default."""
        if max_tokens is not None:
            return max_tokens
        context = self.max_model_len.get(model)
        if context is not None:
            return max(1, context - prompt_tokens)
        return self.config.tenant_controls.default_max_tokens

    async def admit(self, tenant: Tenant, request_id: str, model: str, prompt_tokens: int,
                    max_tokens: int | None, override: str | None, available: Collection[str]
                    ) -> Ticket:
        ticket = Ticket(tenant.name)
        if not self.controlled(tenant):
            return ticket
        output = self.output_tokens(model, prompt_tokens, max_tokens)
        tokens = prompt_tokens + output
        limiter = self.limiters.get(tenant.name)
        now = self.clock()
        if limiter is not None:
            if self.shared is None:
                verdict = limiter.take(now, tokens)
                ticket.headers = limiter.headers(now)
            else:
                taken = await self.shared.take(tenant.name, limiter, now, tokens)
                verdict, ticket.headers, ticket.local_rates = (taken.verdict, taken.headers,
                                                               taken.local)
            if not verdict.allowed:
                what = ("requests" if verdict.reason == "requests"
                        else f"tokens ({tokens} asked)")
                never = not math.isfinite(verdict.retry_after_s)
                raise self._refuse(tenant.name, verdict.reason, TenantLimitError(
                    f"rate limit reached for {what}" + (
                        ": the request asks for more than the limit allows" if never
                        else "; retry after the time in Retry-After"),
                    retry_after_s=verdict.retry_after_s, headers=ticket.headers))
            ticket.tokens = tokens
        try:
            await self._hold(tenant, ticket, request_id, prompt_tokens, output, override,
                             available)
        except WattgateError:  # refused after all: the tokens go back
            if limiter is not None:
                self._settle(limiter, ticket, 0)
            raise
        return ticket

    async def _hold(self, tenant: Tenant, ticket: Ticket, request_id: str,
                    prompt_tokens: int, output_tokens: int, override: str | None,
                    available: Collection[str]) -> None:
        cap = tenant.limits.max_concurrent
        store = self.store
        if store is None or not (tenant.budgets.budgets or cap is not None):
            if cap is not None and self.active[tenant.name] >= cap:
                raise self._refuse(tenant.name, "concurrency", TenantLimitError(
                    f"too many requests in flight (max_concurrent {cap})", retry_after_s=1.0,
                    headers=ticket.headers))
            self.active[tenant.name] += 1
            ticket.local_slot = True
            return
        now_wall = store.wall()
        candidates = select_precisions(tenant.precision, override, available) or (
            (override,) if override else tuple(available) or ("bf16",))
        budgets = tenant.budgets
        downgrade = budgets.on_budget == "downgrade" and (
            override is None or budgets.downgrade_pinned)
        # the precisions a downgrade may move to are priced only where one may happen
        rates = {p: store.rates_of(tenant.name, p, prompt_tokens, now_wall) for p in (
            {*tenant.precision.allowed, *candidates} if downgrade else candidates)}
        cost = {p: estimate(prompt_tokens, output_tokens, r) for p, r in rates.items()} \
            if downgrade or len(candidates) > 1 else {}
        first = candidates[0] if not cost else max(candidates, key=lambda p: cost[p].j)
        cheaper: list[str] = []
        if downgrade:  # the dearest it may get first, then the cheaper ones dearest first
            cheaper = sorted((p for p in tenant.precision.allowed
                              if p in available and cost[p].j < cost[first].j),
                             key=lambda p: -cost[p].j)
        try:
            verdict = await store.admit(tenant, request_id, prompt_tokens, output_tokens, first,
                                        cheaper, rates, cost.get(first))
        except LedgerError:
            # Fail closed: without the ledger no replica can tell what the others admitted.
            raise OverloadedError("the budget ledger is unreachable; retry shortly",
                                  code="ledger_unavailable") from None
        if not verdict.allowed:
            if verdict.reason == "concurrency":
                raise self._refuse(tenant.name, "concurrency", TenantLimitError(
                    f"too many requests in flight (max_concurrent {cap})", retry_after_s=1.0,
                    headers=ticket.headers))
            raise self._refuse(tenant.name, "budget", self._budget_refusal(
                tenant, ticket, verdict, prompt_tokens, output_tokens, first, override,
                now_wall))
        ticket.reserved = True
        self.active[tenant.name] += 1
        if verdict.precision != first:
            ticket.precision = verdict.precision
            ticket.headers["x-wattgate-budget"] = f"downgraded;from={first}"
            if self.metrics is not None:
                self.metrics.downgraded.labels(tenant.name).inc()

    def _budget_refusal(self, tenant: Tenant, ticket: Ticket, verdict: StoreVerdict,
                        prompt_tokens: int, output_tokens: int, first: str,
                        override: str | None, now_wall: float) -> BudgetExceededError:
        """The 429 for a request no budget has room for: which budget, what it holds, when
        to retry, and why no downgrade helped."""
        assert self.store is not None
        need = estimate(prompt_tokens, output_tokens,
                        self.store.rates_of(tenant.name, first, prompt_tokens, now_wall))
        over = [s for s in verdict.standing if need.of(s.budget.unit) > s.remaining] or list(
            verdict.standing)
        b = over[0].budget
        message = (f"the {b.period}ly budget of {b.limit:g} {b.unit} has no room for this "
                   f"request (about {need.of(b.unit):.6g} {b.unit}; {_spent(over[0])})")
        if override is not None and tenant.budgets.on_budget == "downgrade" \
                and not tenant.budgets.downgrade_pinned:
            message += (f"; the request pins precision {override!r}, which on_budget: downgrade "
                        "leaves as asked (budget_downgrade_pinned is off)")
        return BudgetExceededError(
            message, retry_after_s=max(self._retry_after_s(s, need, verdict, now_wall)
                                       for s in over),
            headers={**ticket.headers, "x-wattgate-budget": "exceeded"})

    def _retry_after_s(self, s: Spend, need: Cost, verdict: StoreVerdict, now_wall: float
                       ) -> float:
        """When `s` may have room for `need`: once the requests it holds reservations for
        are billed, if the charges alone leave room (a reservation is an estimate, the bill
        usually less); else when its period ends."""
        period_end_s = seconds_to_next_period(s.budget.period, now_wall)
        if s.held <= 0 or s.budget.limit - s.spent < need.of(s.budget.unit):
            return period_end_s
        wait_s = 0.0
        if verdict.settled_last is not None:  # finished: final once the next interval is billed
            final_at = (verdict.settled_last + 1) * self.interval_s + self.final_after_s
            wait_s = final_at - now_wall
        if verdict.open_now:  # still running: billed at the earliest that long after it ends
            wait_s = max(wait_s, self.interval_s + self.final_after_s)
        return min(max(wait_s, 1.0), period_end_s)

    def release(self, ticket: Ticket | None, rec: RequestRecord) -> None:
        """The request ended (its record): give back what it held, settle what it used."""
        if ticket is None or ticket.tenant != rec.tenant:
            return
        used = rec.prompt_tokens + rec.completion_tokens
        limiter = self.limiters.get(ticket.tenant)
        if limiter is not None and ticket.tokens:
            self._settle(limiter, ticket, used)
        if ticket.local_slot or ticket.reserved:
            self.active[ticket.tenant] -= 1
        if ticket.reserved and self.store is not None:
            ran = bool(rec.engine) and rec.dispatched_s is not None
            last = (math.floor(rec.wall(rec.finished_s) / self.interval_s) if ran else None)
            cost: Cost | None = None
            if ran:
                cost = estimate(rec.prompt_tokens, rec.completion_tokens, self.store.rates_of(
                    rec.tenant, rec.precision, rec.prompt_tokens, rec.wall(rec.finished_s)))
            self.store.settle(rec.tenant, rec.request_id, cost, rec.engine, last)


def _spent(s: Spend) -> str:
    return (f"{s.spent:.6g} charged, {s.held:.6g} reserved for requests running or not yet "
            "billed")
