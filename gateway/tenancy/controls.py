"""Tenant controls wired for one gateway process: metrics, the admission, the ledger store
and its background loop, and what `/v1/usage` tells a tenant about its limits."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import CollectorRegistry

from accounting.ledger.base import LedgerError
from accounting.metering import make_budget_store
from gateway.config import GatewayConfig, Tenant
from gateway.tenancy.admission import Admission
from gateway.tenancy.config import SharedStoreConfig
from gateway.tenancy.metrics import TenancyMetrics
from gateway.tenancy.rate_store import BucketStore
from gateway.tenancy.ratelimit import TenantRateLimiter
from gateway.tenancy.shared import SharedRates
from gateway.tenancy.store import TenancyStore


class TenantControls:
    def __init__(self, config: GatewayConfig, registry: CollectorRegistry, *,
                 clock: Callable[[], float], replica: str | None = None,
                 wall: Callable[[], float] = time.time, node_store: BucketStore | None = None):
        """`node_store`: a node's rate store (gateway/workers/rates.py), for the rate limits
        where no shared store is configured; this process is then one of its replicas."""
        self.config = config
        shared_cfg = config.tenant_controls.shared_store
        if shared_cfg is None and node_store is not None:
            shared_cfg = SharedStoreConfig(on_store_down="open")
        rated = {t.name: t.limits for t in config.tenants if t.limits.any}
        self.metrics = TenancyMetrics(registry, shared_store=shared_cfg is not None and
                                      bool(rated))
        self.store: TenancyStore | None = None
        self.shared: SharedRates | None = None
        if shared_cfg is not None and rated:
            self.shared = SharedRates(
                shared_cfg, rated, f"{socket.gethostname()}:{os.getpid()}"
                if replica is None or node_store is not None else replica,
                clock=clock, metrics=self.metrics,
                store=node_store if config.tenant_controls.shared_store is None else None)
        acct = config.accounting
        if acct is not None and acct.enabled and replica is not None and any(
                t.limits.any or t.budgets.budgets for t in config.tenants):
            # its own connections: admissions do not queue behind the apportioner's commits
            self.store = TenancyStore(make_budget_store(acct.ledger), replica,
                                      config.tenant_controls, acct.pricing, wall)
            self.store.budgeted = tuple(t.name for t in config.tenants if t.budgets.budgets)
            self.store.interval_s = acct.interval_s
        self.admission = Admission(config, self.metrics, clock=clock, store=self.store,
                                   shared=self.shared)
        if self.shared is not None:  # the live replicas it counts set the shares it falls to
            self.shared.on_replicas = self.admission.set_replicas
        for t in config.tenants:
            if t.budgets.budgets:
                self.metrics.budget_soft.labels(t.name).set(t.budgets.soft_percent / 100.0)
            for b in t.budgets.budgets:
                self.metrics.budget_limit.labels(t.name, b.period, b.unit).set(b.limit)

    async def cleanup_ctx(self, _app: object) -> AsyncIterator[None]:
        shared = self.shared
        if shared is not None:
            await shared.start()
        try:
            store = self.store
            if store is None:
                yield
                return
            await store.ledger.open()
            try:
                store.start(self.refresh)
                yield
                await store.stop()
            finally:  # a failed start or stop must not leave the ledger's connections open
                await store.ledger.close()
        finally:
            if shared is not None:
                await shared.stop()

    async def refresh(self) -> None:
        """After the store's refresh: rate-limit shares and the budget gauges."""
        assert self.store is not None
        if self.shared is None:  # else the shared store counts the replicas
            self.admission.set_replicas(self.store.replicas)
        for t in self.config.tenants:
            for s in await self.store.standing(t) if t.budgets.budgets else ():
                labels = (t.name, s.budget.period, s.budget.unit)
                self.metrics.budget_spent.labels(*labels).set(s.spent + s.held)
                self.metrics.budget_used.labels(*labels).set(s.used_ratio)

    async def status(self, tenant: Tenant) -> dict[str, Any]:
        """A tenant's limits and what remains of them, for `/v1/usage`."""
        limiter = self.admission.limiters.get(tenant.name)
        budgets: list[dict[str, Any]] = []
        rates: list[dict[str, Any]] = []
        if self.store is not None and tenant.budgets.budgets:
            try:
                standing = await self.store.standing(tenant)
            except LedgerError:
                standing = []
            budgets = [{"period": s.budget.period, "unit": s.budget.unit,
                        "limit": s.budget.limit, "spent": s.spent, "held": s.held,
                        "remaining": s.remaining, "used_ratio": s.used_ratio}
                       for s in standing]
            learnt = self.store.rates.get(tenant.name)
            rates = learnt.describe() if learnt is not None else []
        slo = next((c for c in self.config.slo_classes if c.name == tenant.slo_class), None)
        return {
            "tenant": tenant.name,
            # the class the gateway grades this tenant's requests by (seconds; a limit left
            # out is not checked), so a load generator can grade by the same
            "slo_class": {"name": tenant.slo_class, **({k: v for k, v in dataclasses.asdict(
                slo).items() if k != "name" and v is not None} if slo else {})},
            "limits": {k: v for k, v in dataclasses.asdict(tenant.limits).items()
                       if v is not None},
            "rate_limits": self._rate_headers(tenant, limiter),
            "requests_in_flight": self.admission.active.get(tenant.name, 0),
            "budgets": budgets, "on_budget": tenant.budgets.on_budget,
            # what its reservations are estimated at, learnt from its own bills (elsewhere:
            # the prior, docs/operations.md)
            "budget_rates": rates,
            "budget_soft_percent": tenant.budgets.soft_percent,
            "replicas": (self.shared.replicas if self.shared is not None else
                         self.store.replicas if self.store is not None else 1),
        }

    def _rate_headers(self, tenant: Tenant, limiter: TenantRateLimiter | None
                      ) -> dict[str, str]:
        now = self.admission.clock()
        if self.shared is not None and self.shared.up:
            return self.shared.headers(tenant.name, now) if tenant.name in \
                self.shared.leases else {}
        return limiter.headers(now) if limiter else {}
