"""Reading a budgeted tenant's recent final bills from the ledger and learning its rates
from them (rates.py), for the store's refresh: the I/O shell around the pure fit."""

from __future__ import annotations

import asyncio

from accounting.ledger.budget_store import BudgetStore
from gateway.tenancy.rates import TenantRates

RATE_WINDOW_S = 600.0  # a tenant's rates from its bills of the last ten minutes
RATE_MAX_BILLS = 2000  # at most its latest this many
# The windows read, narrowest first, until one holds RATE_MAX_BILLS: the read scans every
# share of its window (all tenants'), so a busy tenant's is a minute's, not ten minutes'.
# After the first, the narrowest the first one's count says may hold them.
RATE_WINDOWS_S = (60.0, 240.0, RATE_WINDOW_S)
RATE_EVERY_S = 10.0  # re-learnt this often (a scan of the window's shares per tenant)


async def learn(ledger: BudgetStore, tenant: str, now: float, interval_s: float
                ) -> TenantRates:
    """`tenant`'s rates from its latest final bills: requests that arrived in the window,
    with every share of theirs in it."""
    first_s = RATE_WINDOWS_S[0]
    rows = await ledger.tenant_bills(tenant, now - first_s, interval_s, RATE_MAX_BILLS)
    if len(rows) < RATE_MAX_BILLS:
        need_s = first_s * RATE_MAX_BILLS / max(len(rows), 1)
        window_s = next((w for w in RATE_WINDOWS_S[1:] if w >= need_s), RATE_WINDOWS_S[-1])
        rows = await ledger.tenant_bills(tenant, now - window_s, interval_s, RATE_MAX_BILLS)
    # milliseconds of Python for a busy tenant's bills: not on the event loop
    return await asyncio.to_thread(TenantRates.from_rows, rows)
