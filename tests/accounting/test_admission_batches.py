"""Admissions of one tenant that arrive together are decided in one transaction, in order,
each against what the ones before it reserved (a real SQLite ledger): a budget with room
for a number of requests admits exactly that many of a crowd, a concurrency cap exactly its
cap, and a request that leaves while it is decided leaves no reservation behind."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from accounting.ledger.sqlite import SqliteLedger
from accounting.pricing import Pricing
from gateway.config import parse_config
from gateway.tenancy import store as store_module
from gateway.tenancy.store import TenancyStore
from tests.support.gateway import raw_config

EP = [{"name": "e", "url": "http://127.0.0.1:1", "precision": "bf16"}]
pytestmark = pytest.mark.timeout(60)


def _tenant(**fields: Any) -> Any:
    raw = raw_config(EP, accounting={"ledger": {"kind": "sqlite", "path": "/tmp/unused.db"}})
    raw["tenants"][0].update(fields)
    return parse_config(raw, env={})


async def _crowd(tmp_path: Path, n: int, **fields: Any) -> tuple[list[Any], SqliteLedger, Any]:
    cfg = _tenant(**fields)
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    store = TenancyStore(ledger, "r", cfg.tenant_controls, Pricing(), lambda: 1.7e9)
    one = store.rates_of("tenant-a", "bf16", 100, 1.7e9)
    verdicts = await asyncio.gather(*(store.admit(cfg.tenants[0], f"q{i}", 100, 100, "bf16", ())
                                      for i in range(n)))
    return verdicts, ledger, one


async def test_a_crowd_gets_exactly_the_budgets_room(tmp_path: Path) -> None:
    from gateway.tenancy.budget import estimate

    cfg = _tenant()
    store = TenancyStore(None, "r", cfg.tenant_controls, Pricing(),  # type: ignore[arg-type]
                         lambda: 1.7e9)
    each = estimate(100, 100, store.rates_of("tenant-a", "bf16", 100, 1.7e9)).j
    verdicts, ledger, _ = await _crowd(tmp_path, 60, budgets=[{"period": "day", "j": each * 20.5}])
    try:
        assert sum(v.allowed for v in verdicts) == 20
        assert [v.allowed for v in verdicts] == [True] * 20 + [False] * 40  # in arrival order
        assert {v.reason for v in verdicts if not v.allowed} == {"budget"}
        held = await ledger.reservations_held("tenant-a", 0, 0, 0)
        assert held[0] == pytest.approx(each * 20) and held[3] == 20
    finally:
        await ledger.close()


async def test_a_crowd_gets_exactly_the_cap(tmp_path: Path) -> None:
    verdicts, ledger, _ = await _crowd(tmp_path, 30, limits={"max_concurrent": 7})
    try:
        assert sum(v.allowed for v in verdicts) == 7
        assert {v.reason for v in verdicts if not v.allowed} == {"concurrency"}
    finally:
        await ledger.close()


async def test_a_request_that_leaves_while_decided_holds_nothing(tmp_path: Path,
                                                                 monkeypatch: Any) -> None:
    cfg = _tenant(limits={"max_concurrent": 100})
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    store = TenancyStore(ledger, "r", cfg.tenant_controls, Pricing(), lambda: 1.7e9)
    try:
        first = asyncio.ensure_future(store.admit(cfg.tenants[0], "a", 1, 1, "bf16", ()))
        await asyncio.sleep(0)  # its transaction has begun
        left = asyncio.ensure_future(store.admit(cfg.tenants[0], "b", 1, 1, "bf16", ()))
        await asyncio.sleep(0)
        assert (await first).allowed
        stays = asyncio.ensure_future(store.admit(cfg.tenants[0], "c", 1, 1, "bf16", ()))
        left.cancel()  # queued behind the first: never decided
        assert (await stays).allowed
        await store.flush()
        rows = await ledger._fetch("SELECT request_id FROM reservations ORDER BY request_id", ())
        assert [r[0] for r in rows] == ["a", "c"]
        # one that leaves while its own transaction runs is dropped at the next flush
        slow = asyncio.ensure_future(store.admit(cfg.tenants[0], "d", 1, 1, "bf16", ()))
        await asyncio.sleep(0)
        slow.cancel()
        await asyncio.gather(*store._drains.values())  # its transaction ran to the end
        await store.flush()
        rows = await ledger._fetch("SELECT request_id FROM reservations ORDER BY request_id", ())
        assert [r[0] for r in rows] == ["a", "c"]
        assert store_module.MAX_BATCH >= 64
    finally:
        await ledger.close()


class _BillsLedger:
    """Answers tenant_bills with `per_s` bills a second of window (at most the limit)."""

    def __init__(self, per_s: float) -> None:
        self.per_s = per_s
        self.windows: list[float] = []

    async def live_replicas(self, seen_after_s: float) -> int:
        return 1

    async def tenant_bills(self, tenant: str, since_s: float, interval_s: float, limit: int
                           ) -> list[tuple[str, int, int, float, float, float]]:
        window_s = 1.7e9 - since_s
        self.windows.append(window_s)
        n = min(limit, int(window_s * self.per_s))
        return [("bf16", 100, 100, 10.0, 0.001, 0.0001)] * n


@pytest.mark.parametrize(("per_s", "windows"), [
    (100.0, [60.0]),  # a busy tenant: its latest bills are all in the last minute
    (10.0, [60.0, 240.0]),
    (0.1, [60.0, 240.0, 600.0]),  # a quiet one: the whole window
])
async def test_rates_read_the_narrowest_window_that_holds_enough_bills(
        per_s: float, windows: list[float]) -> None:
    cfg = _tenant(budgets=[{"period": "day", "j": 1e9}])
    ledger = _BillsLedger(per_s)
    store = TenancyStore(ledger, "r", cfg.tenant_controls, Pricing(),  # type: ignore[arg-type]
                         lambda: 1.7e9)
    store.budgeted = ("tenant-a",)
    await store.refresh()
    assert ledger.windows == pytest.approx(windows)
    assert store_module.RATE_WINDOWS_S[-1] == store_module.RATE_WINDOW_S


async def test_a_tenants_bills_are_read_while_a_write_holds_the_ledger(tmp_path: Path) -> None:
    """The bills read has a connection and thread of its own: admissions (writes) need not
    queue behind it, and it need not wait for them."""
    import threading

    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    release = threading.Event()

    def hold(c: Any) -> None:
        c.execute("BEGIN IMMEDIATE")
        release.wait(10)
        c.execute("COMMIT")

    try:
        held = asyncio.ensure_future(ledger._run(hold))
        await asyncio.sleep(0.05)
        rows = await asyncio.wait_for(ledger.tenant_bills("tenant-a", 0.0, 1.0, 10), 5)
        assert rows == [] and not held.done()
        release.set()
        await held
    finally:
        release.set()
        await ledger.close()
