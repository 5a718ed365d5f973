"""Prometheus series of tenant controls. Labels: configured tenant names only (bounded),
a reason out of four, a period out of three and a unit out of three."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REASONS: tuple[str, ...] = ("requests", "tokens", "concurrency", "budget")


class TenancyMetrics:
    def __init__(self, registry: CollectorRegistry, *, shared_store: bool = False):
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
        # only with a shared store: a 0 without one would read as a store down
        self.rate_store_up = Gauge(
            "wattgate_tenant_rate_store_up", "1 while the shared rate-limit store answers "
            "this replica's leases, else 0 (tenant_controls.shared_store.on_store_down "
            "applies)", registry=registry) if shared_store else None
        self.rate_lease_waits = Counter(
            "wattgate_tenant_rate_lease_waits", "Requests that waited for a lease from the "
            "shared rate-limit store (their replica's lease was short)",
            registry=registry) if shared_store else None
        self.rate_store_statements = Counter(
            "wattgate_tenant_rate_store_statements", "Statements this replica sent the shared "
            "rate-limit store (leases, give-backs, heartbeats)",
            registry=registry) if shared_store else None
        self.active = Gauge("wattgate_tenant_requests_active", "Requests of a tenant with "
                            "limits in flight in this process", ("tenant",), registry=registry)
