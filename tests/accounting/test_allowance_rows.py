"""The rows an allowance's requests leave in the ledger (gateway/tenancy/allowance.py): as it
goes back, those still running get one each, those that ended share one settled row per
engine and last interval holding the sum of their settlements, which the admission's purge
deletes once that interval is final; what the ledger holds is the same as with one row each
(a real SQLite ledger)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from accounting.ledger import reservation_schema as reservations
from accounting.ledger import sql
from accounting.pricing import Pricing
from gateway.tenancy.budget import Cost, estimate
from gateway.tenancy.store import TenancyStore
from tests.accounting.test_budget_allowance import NOW, _each, _held, _opened, _tenant

pytestmark = pytest.mark.timeout(60)


async def test_requests_that_ended_share_one_settled_row_per_engine_and_interval(
        tmp_path: Path) -> None:
    each = _each()
    cfg = _tenant(budgets=[{"period": "day", "j": each * 1e6}],
                  limits={"max_concurrent": 100_000})
    async with _opened(tmp_path) as ledger:
        store = TenancyStore(ledger, "r", cfg.tenant_controls, Pricing(), lambda: NOW)
        tenant = cfg.tenants[0]
        assert (await store.admit(tenant, "first", 100, 100, "bf16", ())).allowed
        rids = [f"q{i:02d}" for i in range(40)]
        for rid in rids:
            assert (await store.admit(tenant, rid, 100, 100, "bf16", ())).allowed
        ends = {**dict.fromkeys(rids[:20], ("e", 5)), **dict.fromkeys(rids[20:30], ("f", 5)),
                **dict.fromkeys(rids[30:35], ("e", 6)), rids[35]: ("f", 6)}
        settled: dict[tuple[str, int], list[float]] = {}
        for k, (rid, (engine, last)) in enumerate(ends.items()):
            cost = Cost(1.0 + k / 7, 0.01 * k, 1e-4 * k)
            store.settle("tenant-a", rid, cost, engine, last)
            settled.setdefault((engine, last), []).append(cost.j)
        for rid in rids[36:38]:  # left before an engine ran them
            store.settle("tenant-a", rid, None, "", None)
        await store.flush(give_back=True)
        rows = await ledger._fetch(
            "SELECT request_id, open, engine, last_interval, energy_j FROM reservations "
            "ORDER BY engine, last_interval, request_id", ())
        running = [r for r in rows if r[1]]
        assert sorted(r[0] for r in running) == ["first", *rids[38:]]
        assert {(r[2], r[3]): (r[0], r[4]) for r in rows if not r[1]} == {
            ("e", 5): ("settled:q00:20", pytest.approx(math.fsum(settled["e", 5]))),
            ("f", 5): ("settled:q20:10", pytest.approx(math.fsum(settled["f", 5]))),
            ("e", 6): ("settled:q30:5", pytest.approx(math.fsum(settled["e", 6]))),
            ("f", 6): ("q35", pytest.approx(settled["f", 6][0]))}  # a group of one: its own
        held = await _held(ledger)
        want = 3 * each + math.fsum(j for js in settled.values() for j in js)
        assert held[0] == pytest.approx(want) and held[3] == 3


async def test_a_shared_settled_row_goes_once_its_interval_is_final(tmp_path: Path) -> None:
    """The purge deletes it when it would have deleted each of its requests' rows."""
    each = _each()
    cfg = _tenant(budgets=[{"period": "day", "j": each * 1e6}])
    async with _opened(tmp_path) as ledger:
        store = TenancyStore(ledger, "r", cfg.tenant_controls, Pricing(), lambda: NOW)
        tenant = cfg.tenants[0]
        assert (await store.admit(tenant, "first", 100, 100, "bf16", ())).allowed
        used = estimate(100, 7, store.rates_of("tenant-a", "bf16", 100, NOW))
        for i in range(12):
            assert (await store.admit(tenant, f"q{i}", 100, 100, "bf16", ())).allowed
            store.settle("tenant-a", f"q{i}", used, "e", 5 + i % 2)
        store.settle("tenant-a", "first", None, "", None)
        await store.flush(give_back=True)
        assert (await _held(ledger))[0] == pytest.approx(12 * used.j)
        await ledger._transaction([(sql.UPSERT_STATE, [
            ("e", 7, 0.0, 0.0, 0, None, None, None, None, None, None)])])  # 5 final, 6 not
        await ledger._transaction([(reservations.PURGE_FINAL, [("tenant-a",)])])
        rows = await ledger._fetch("SELECT request_id, energy_j FROM reservations", ())
        assert rows == [("settled:q1:6", pytest.approx(6 * used.j))]
