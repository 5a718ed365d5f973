"""Allowances against the reservation_totals triggers, on SQLite and a real PostgreSQL: after
every flush the per-(tenant, replica) totals equal the rows (allowance rows with no engine and
many open slots, shrunk, given back; requests written settled or dropped), and once every
allowance is given back the held totals are exactly the open requests'."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from accounting.ledger.postgres import PostgresLedger
from accounting.pricing import Pricing
from gateway.tenancy.budget import estimate
from gateway.tenancy.store import TenancyStore
from tests.accounting.test_budget_allowance import NOW, _each, _opened, _tenant
from tests.support.postgres import fresh_database

pytestmark = pytest.mark.timeout(120)
_names = itertools.count()


async def _totals_match(ledger: Any) -> None:
    totals = await ledger._fetch(
        "SELECT tenant, replica, energy_j, open_n, rows_n FROM reservation_totals "
        "ORDER BY tenant, replica", ())
    rows = await ledger._fetch(
        "SELECT tenant, replica, SUM(energy_j), SUM(open), COUNT(*) FROM reservations "
        "GROUP BY tenant, replica ORDER BY tenant, replica", ())
    assert [(t, r, int(o), int(n)) for t, r, _, o, n in totals] == \
        [(t, r, int(o), int(n)) for t, r, _, o, n in rows]
    for (_, _, total, _, _), (_, _, summed, _, _) in zip(totals, rows, strict=True):
        assert float(total) == pytest.approx(float(summed))


async def _exercise(ledger: Any) -> None:
    each = _each()
    cfg = _tenant(budgets=[{"period": "day", "j": each * 1e6}],
                  limits={"max_concurrent": 100_000})
    tenant = cfg.tenants[0]
    clock = [NOW]
    one = TenancyStore(ledger, "r1", cfg.tenant_controls, Pricing(), lambda: clock[0])
    two = TenancyStore(ledger, "r2", cfg.tenant_controls, Pricing(), lambda: clock[0])
    used = estimate(100, 7, one.rates_of("tenant-a", "bf16", 100, NOW))
    for i in range(60):
        for s, tag in ((one, "a"), (two, "b")):
            assert (await s.admit(tenant, f"{tag}{i}", 100, 100, "bf16", ())).allowed
            if i % 3 == 0:
                s.settle("tenant-a", f"{tag}{i}", used, "e", 5)
            elif i % 3 == 1:
                s.settle("tenant-a", f"{tag}{i}", None, "", None)
        if i % 7 == 6:
            await one.flush()
            await two.flush()
            await _totals_match(ledger)
        if i % 20 == 19:
            clock[0] += 0.3  # allowances due back
    held_live = await one.standing(tenant)
    await _totals_match(ledger)
    await one.flush(give_back=True)
    await two.flush(give_back=True)
    await _totals_match(ledger)
    rows = await ledger._fetch("SELECT COUNT(*) FROM reservations WHERE request_id LIKE "
                               "'allowance:%'", ())
    assert int(rows[0][0]) == 0
    held = await ledger.reservations_held("tenant-a", 0, 0, 0)
    assert held[3] == 40  # 20 of 60 each still open
    assert held[0] == pytest.approx(40 * each + 40 * used.j)
    assert held_live


async def test_allowance_rows_keep_the_totals_exact_on_sqlite(tmp_path: Path) -> None:
    async with _opened(tmp_path) as ledger:
        await _exercise(ledger)


@pytest.mark.postgres
async def test_allowance_rows_keep_the_totals_exact_on_postgres(pg: str) -> None:
    ledger = PostgresLedger(await fresh_database(pg, f"allow{next(_names)}"))
    await ledger.open()
    try:
        await _exercise(ledger)
    finally:
        await ledger.close()
