"""Admission of one request against its tenant's controls, and its release when it ends.

`Admission.admit` runs before routing: the local rate-limit buckets first (no I/O), then, for
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

from gateway.accounting.ledger.base import LedgerError
from gateway.config import GatewayConfig, Tenant
from gateway.errors import OverloadedError, WattgateError
from gateway.records import RequestRecord
from gateway.routing.precision import select_precisions
from gateway.tenancy.budget import HOUR_S, Cost, Spend, estimate, weighted_tokens
from gateway.tenancy.errors import BudgetExceededError, TenantLimitError
from gateway.tenancy.metrics import TenancyMetrics
from gateway.tenancy.ratelimit import TenantRateLimiter
from gateway.tenancy.store import TenancyStore


@dataclass(slots=True)
class Ticket:
    tenant: str
    tokens: int = 0  # reserved in the token bucket
    precision: str | None = None  # forced by a budget downgrade
    headers: dict[str, str] = field(default_factory=dict)
    reserved: bool = False  # a reservation in the ledger
    local_slot: bool = False  # a local concurrency slot


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
                 clock: Callable[[], float], store: TenancyStore | None = None):
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.store = store
        now = clock()
        self.limiters = {t.name: TenantRateLimiter(t.limits, now) for t in config.tenants
                         if t.limits.any}
        self.active: dict[str, int] = {t.name: 0 for t in config.tenants}
        # looked up per request: a set, not the tenant's fields each time
        self._controlled = frozenset(t.name for t in config.tenants
                                     if t.limits.any or t.budgets.budgets)
        self.interval_s = (config.accounting.interval_s if config.accounting is not None
                           else 1.0)

    def controlled(self, tenant: Tenant) -> bool:
        return tenant.name in self._controlled

    def set_replicas(self, replicas: int) -> None:
        """Each process enforces its share of the rate limits."""
        for limiter in self.limiters.values():
            limiter.set_share(1.0 / max(1, replicas))

    def _refuse(self, tenant: str, reason: str, err: TenantLimitError) -> TenantLimitError:
        if self.metrics is not None:
            self.metrics.limited.labels(tenant, reason).inc()
        return err

    async def admit(self, tenant: Tenant, request_id: str, prompt_tokens: int,
                    max_tokens: int | None, override: str | None, available: Collection[str]
                    ) -> Ticket:
        ticket = Ticket(tenant.name)
        if not self.controlled(tenant):
            return ticket
        tokens = prompt_tokens + (max_tokens if max_tokens is not None
                                  else self.config.tenant_controls.default_max_tokens)
        limiter = self.limiters.get(tenant.name)
        now = self.clock()
        if limiter is not None:
            verdict = limiter.take(now, tokens)
            ticket.headers = limiter.headers(now)
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
            await self._hold(tenant, ticket, request_id,
                             weighted_tokens(prompt_tokens, tokens - prompt_tokens), override,
                             available)
        except WattgateError:  # refused after all: the tokens go back
            if limiter is not None:
                limiter.settle(ticket.tokens, 0)
            raise
        return ticket

    async def _hold(self, tenant: Tenant, ticket: Ticket, request_id: str, tokens: int,
                    override: str | None, available: Collection[str]) -> None:
        cap = tenant.limits.max_concurrent
        store = self.store
        if store is None or not (tenant.budgets.budgets or cap is not None):
            if cap is not None and self.active[tenant.name] >= cap:
                raise self._refuse(tenant.name, "concurrency", TenantLimitError(
                    f"too many requests in flight (max_concurrent {cap})", retry_after_s=1.0,
                    headers=ticket.headers))
            self.active[tenant.name] += 1
            ticket.local_slot = True
            self._gauge(tenant.name)
            return
        now_wall = store.wall()
        candidates = select_precisions(tenant.precision, override, available) or (
            (override,) if override else tuple(available) or ("bf16",))
        rate: dict[str, float] = {p: store.per_token(p, now_wall).j
                                  for p in tenant.precision.allowed}
        first = max(candidates, key=lambda p: rate.get(p, 0.0))  # the dearest it may get
        cheaper: list[str] = []
        if tenant.budgets.on_budget == "downgrade" and override is None:
            cheaper = sorted((p for p in tenant.precision.allowed
                              if p in available and rate[p] < rate.get(first, math.inf)),
                             key=lambda p: -rate[p])
        try:
            verdict = await store.admit(tenant, request_id, tokens, first, cheaper)
        except LedgerError:
            # Fail closed: without the ledger no replica can tell what the others admitted.
            raise OverloadedError("the budget ledger is unreachable; retry shortly",
                                  code="ledger_unavailable") from None
        if not verdict.allowed:
            if verdict.reason == "concurrency":
                raise self._refuse(tenant.name, "concurrency", TenantLimitError(
                    f"too many requests in flight (max_concurrent {cap})", retry_after_s=1.0,
                    headers=ticket.headers))
            over = [s for s in verdict.standing
                    if estimate(tokens, store.per_token(first, now_wall)).of(s.budget.unit)
                    > s.remaining] or list(verdict.standing)
            b = over[0].budget
            raise self._refuse(tenant.name, "budget", BudgetExceededError(
                f"the {b.period}ly budget of {b.limit:g} {b.unit} has no room for this "
                f"request ({_spent(over[0])})", retry_after_s=seconds_to_next_period(
                    b.period, now_wall), headers={**ticket.headers,
                                                  "x-wattgate-budget": "exceeded"}))
        ticket.reserved = True
        self.active[tenant.name] += 1
        self._gauge(tenant.name)
        if verdict.precision != first:
            ticket.precision = verdict.precision
            ticket.headers["x-wattgate-budget"] = f"downgraded;from={first}"
            if self.metrics is not None:
                self.metrics.downgraded.labels(tenant.name).inc()

    def _gauge(self, tenant: str) -> None:
        if self.metrics is not None:
            self.metrics.active.labels(tenant).set(self.active[tenant])

    def release(self, ticket: Ticket | None, rec: RequestRecord) -> None:
        """The request ended (its record): give back what it held, settle what it used."""
        if ticket is None or ticket.tenant != rec.tenant:
            return
        used = rec.prompt_tokens + rec.completion_tokens
        limiter = self.limiters.get(ticket.tenant)
        if limiter is not None and ticket.tokens:
            limiter.settle(ticket.tokens, used)
        if ticket.local_slot or ticket.reserved:
            self.active[ticket.tenant] -= 1
            self._gauge(ticket.tenant)
        if ticket.reserved and self.store is not None:
            ran = bool(rec.engine) and rec.dispatched_s is not None
            last = (math.floor(rec.wall(rec.finished_s) / self.interval_s) if ran else None)
            cost: Cost | None = None
            if ran:
                cost = estimate(weighted_tokens(rec.prompt_tokens, rec.completion_tokens),
                                self.store.per_token(rec.precision, rec.wall(rec.finished_s)))
            self.store.settle(rec.request_id, cost, rec.engine, last)


def _spent(s: Spend) -> str:
    return f"{s.spent:.6g} charged, {s.held:.6g} held by requests in flight"
