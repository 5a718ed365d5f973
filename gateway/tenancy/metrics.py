"""Prometheus series of tenant controls. Labels: configured tenant names only (bounded),
a reason out of four, a period out of three and a unit out of three."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REASONS: tuple[str, ...] = ("requests", "tokens", "concurrency", "budget")


class TenancyMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.limited = Counter("wattgate_tenant_limited", "Requests refused with 429 by a "
                               "tenant control, by reason (requests, tokens, concurrency, "
                               "budget)", ("tenant", "reason"), registry=registry)
        self.downgraded = Counter("wattgate_tenant_budget_downgraded", "Requests admitted at "
                                  "a cheaper precision because their budget had no room for "
                                  "the one asked for", ("tenant",), registry=registry)
        self.budget_limit = Gauge("wattgate_tenant_budget_limit", "A tenant's budget for the "
                                  "current period, in its unit (usd, j, gco2e)",
                                  ("tenant", "period", "unit"), registry=registry)
        self.budget_spent = Gauge("wattgate_tenant_budget_spent", "Charged by the ledger in "
                                  "the current period plus held by reservations, in the "
                                  "budget's unit", ("tenant", "period", "unit"),
                                  registry=registry)
        self.budget_used = Gauge("wattgate_tenant_budget_used_ratio", "budget_spent / "
                                 "budget_limit", ("tenant", "period", "unit"), registry=registry)
        self.budget_soft = Gauge("wattgate_tenant_budget_soft_ratio", "The tenant's alert "
                                 "threshold (budget_soft_percent / 100)", ("tenant",),
                                 registry=registry)
        self.active = Gauge("wattgate_tenant_requests_active", "Requests of a tenant with "
                            "limits in flight in this process", ("tenant",), registry=registry)
