"""Admissions of one tenant that arrive together are decided in one transaction, in order,
each against what the ones before it reserved (a real SQLite ledger): a budget with room
for a number of requests admits exactly that many of a crowd, a concurrency cap exactly its
cap, and a request that leaves while it is decided leaves no reservation behind."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from accounting.ledger.base import LedgerError
from accounting.ledger.sqlite import SqliteLedger
from accounting.pricing import Pricing
from gateway.config import parse_config
from gateway.tenancy import learning
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


class _Gated:
    """A ledger whose locked transactions wait for `gate` before they run."""

    def __init__(self, ledger: SqliteLedger) -> None:
        self.ledger = ledger
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def locked(self, *args: Any) -> None:
        self.entered.set()
        await self.gate.wait()
        await self.ledger.locked(*args)

    async def settle_reservations(self, changes: Any) -> None:
        await self.ledger.settle_reservations(changes)


async def _gated_store(tmp_path: Path) -> tuple[SqliteLedger, _Gated, TenancyStore, Any]:
    """A store on a gated SQLite ledger, and its capped tenant."""
    cfg = _tenant(limits={"max_concurrent": 100})
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    gated = _Gated(ledger)
    store = TenancyStore(gated, "r", cfg.tenant_controls, Pricing(),  # type: ignore[arg-type]
                         lambda: 1.7e9)
    return ledger, gated, store, cfg.tenants[0]


async def _ids(ledger: SqliteLedger) -> list[str]:
    rows = await ledger._fetch("SELECT request_id FROM reservations ORDER BY request_id", ())
    return [r[0] for r in rows]


async def test_a_request_that_leaves_holds_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    """One that leaves while queued is never decided; one that leaves while its transaction
    runs is admitted there and its reservation dropped at the next flush; one that leaves
    after its verdict came, before it could act on it, too."""
    ledger, gated, store, tenant = await _gated_store(tmp_path)
    dropped: list[str] = []
    settle = store.settle

    def spy(tenant: str, rid: str, *rest: Any) -> None:
        if rest[0] is None:
            dropped.append(rid)
        settle(tenant, rid, *rest)

    store.settle = spy  # type: ignore[method-assign,assignment]
    try:
        first = asyncio.ensure_future(store.admit(tenant, "a", 1, 1, "bf16", ()))
        await gated.entered.wait()  # a's transaction is waiting to run
        queued = asyncio.ensure_future(store.admit(tenant, "b", 1, 1, "bf16", ()))
        await asyncio.sleep(0)
        queued.cancel()  # b leaves while queued behind a
        gated.gate.set()
        assert (await first).allowed
        assert (await store.admit(tenant, "c", 1, 1, "bf16", ())).allowed
        assert dropped == [] and await _ids(ledger) == ["a", "c"]  # b never decided

        gated.gate.clear()
        gated.entered.clear()
        running = asyncio.ensure_future(store.admit(tenant, "d", 1, 1, "bf16", ()))
        await gated.entered.wait()  # d's own transaction is under way
        running.cancel()
        gated.gate.set()
        await asyncio.gather(*store._drains.values())
        assert dropped == ["d"]
        await store.flush()
        assert await _ids(ledger) == ["a", "c"]

        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[Any]] = []

        class Verdict(asyncio.Future[Any]):
            def set_result(self, result: Any) -> None:
                super().set_result(result)
                tasks[0].cancel()  # the client leaves as the verdict comes, before its turn

        monkeypatch.setattr(loop, "create_future", lambda: Verdict(loop=loop), raising=False)
        tasks.append(asyncio.ensure_future(store.admit(tenant, "e", 1, 1, "bf16", ())))
        await asyncio.sleep(0)
        monkeypatch.undo()
        await asyncio.gather(*store._drains.values())
        outcome = await asyncio.gather(tasks[0], return_exceptions=True)
        assert isinstance(outcome[0], asyncio.CancelledError)
        assert dropped == ["d", "e"]
        await store.flush()
        assert await _ids(ledger) == ["a", "c"]
    finally:
        await ledger.close()


async def test_stopping_answers_every_waiting_request(tmp_path: Path) -> None:
    ledger, _, store, tenant = await _gated_store(tmp_path)
    try:
        waiting = [asyncio.ensure_future(store.admit(tenant, f"q{i}", 1, 1, "bf16", ()))
                   for i in range(3)]
        await asyncio.sleep(0)  # queued; the drain created, not yet run
        await store.stop()
        for w in waiting:
            with pytest.raises(LedgerError):
                await asyncio.wait_for(w, 5)
        assert not store._asks and not store._drains
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
    (10.0, [60.0, 240.0]),  # 600 in the first minute: 4 minutes may hold 2,000
    (0.1, [60.0, 600.0]),  # a quiet one: the whole window
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
    assert learning.RATE_WINDOWS_S[-1] == learning.RATE_WINDOW_S


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


async def test_rates_are_fitted_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy tenant's fit is milliseconds of Python: it runs on a worker thread, so requests
    are not held behind it, and the store gets the same rates as a fit of the same bills."""
    import threading

    from gateway.tenancy.rates import Bill, TenantRates

    fit = TenantRates.from_bills.__func__  # type: ignore[attr-defined]
    threads: list[int] = []

    def from_bills(cls: type[TenantRates], bills: Any) -> TenantRates:
        threads.append(threading.get_ident())
        return fit(cls, bills)  # type: ignore[no-any-return]

    monkeypatch.setattr(TenantRates, "from_bills", classmethod(from_bills))
    cfg = _tenant(budgets=[{"period": "day", "j": 1e9}])
    ledger = _BillsLedger(100.0)
    store = TenancyStore(ledger, "r", cfg.tenant_controls, Pricing(),  # type: ignore[arg-type]
                         lambda: 1.7e9)
    store.budgeted = ("tenant-a",)
    await store.refresh()
    assert threads and threading.get_ident() not in threads
    bills = await ledger.tenant_bills("tenant-a", 1.7e9 - 60.0, 1.0, 2000)
    assert store.rates["tenant-a"].learnt == fit(TenantRates, [Bill(*b) for b in bills]).learnt
    assert store.rates["tenant-a"].learnt  # the bills were enough to learn from
