"""An allowance's renewal (gateway/tenancy/renewal.py): once it nears its end, the next
allowance is taken in a transaction in the background while the old one goes on admitting,
so no request waits for it; every request's reservation is in the ledger once, neither
twice nor not at all, whether the renewal commits, fails, or a flush runs while it waits
(a real SQLite ledger)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from accounting.ledger.base import LedgerError
from accounting.ledger.sqlite import SqliteLedger
from accounting.pricing import Pricing
from gateway.tenancy.allowance import LIFE_S, RENEW_SHARE
from gateway.tenancy.budget import estimate
from gateway.tenancy.store import TenancyStore
from tests.accounting.test_budget_allowance import NOW, _held, _opened, _tenant

pytestmark = pytest.mark.timeout(60)


class _Gated:
    """A ledger whose admission transactions wait for `gate`, and fail while `fail` is set."""

    def __init__(self, ledger: SqliteLedger) -> None:
        self.ledger = ledger
        self.transactions = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False

    async def locked(self, *args: Any) -> None:
        self.transactions += 1
        await self.gate.wait()
        if self.fail:
            raise LedgerError("down")
        await self.ledger.locked(*args)

    async def settle_reservations(self, *args: Any) -> None:
        await self.ledger.settle_reservations(*args)


def _setup(ledger: SqliteLedger) -> tuple[_Gated, TenancyStore, Any, list[float]]:
    cfg = _tenant(budgets=[{"period": "day", "j": 1e9}], limits={"max_concurrent": 100_000})
    gated = _Gated(ledger)
    clock = [NOW]
    store = TenancyStore(gated, "r", cfg.tenant_controls, Pricing(),  # type: ignore[arg-type]
                         lambda: clock[0])
    return gated, store, cfg.tenants[0], clock


async def _admit(store: TenancyStore, tenant: Any, rid: str) -> None:
    """Admitted at once: a request that waited for a transaction would time out here."""
    verdict = await asyncio.wait_for(store.admit(tenant, rid, 100, 100, "bf16", ()), 0.5)
    assert verdict.allowed


async def _exactly(ledger: SqliteLedger, store: TenancyStore, rids: list[str]) -> None:
    """Every request's own reservation, once, and nothing else, once all is given back."""
    await store.flush(give_back=True)
    each = estimate(100, 100, store.rates_of("tenant-a", "bf16", 100, NOW)).j
    held = await _held(ledger)
    assert held[0] == pytest.approx(each * len(rids)) and held[3] == len(rids)
    rows = await ledger._fetch("SELECT request_id FROM reservations ORDER BY request_id", ())
    assert sorted(r[0] for r in rows) == sorted(rids)


async def test_a_renewal_runs_in_the_background_and_counts_each_request_once(
        tmp_path: Path) -> None:
    async with _opened(tmp_path) as ledger:
        gated, store, tenant, clock = _setup(ledger)
        rids = ["q0"]
        assert (await store.admit(tenant, "q0", 100, 100, "bf16", ())).allowed
        assert gated.transactions == 1  # the first allowance
        gated.gate.clear()  # the renewal's transaction waits
        clock[0] += LIFE_S * (1.0 - RENEW_SHARE)  # near its end: the next admission renews
        for i in range(1, 20):
            await _admit(store, tenant, f"q{i}")
            rids.append(f"q{i}")
            await asyncio.sleep(0)
            if i == 10:  # a flush while the renewal waits leaves its allowance to it
                await store.flush()
        assert gated.transactions == 2 and store._renewing
        gated.gate.set()
        await asyncio.wait(list(store._renewing.values()))
        for i in range(20, 40):  # from the successor
            await _admit(store, tenant, f"q{i}")
            rids.append(f"q{i}")
        assert gated.transactions == 2
        await _exactly(ledger, store, rids)


async def test_a_renewal_that_fails_loses_no_request_and_is_not_retried(
        tmp_path: Path) -> None:
    async with _opened(tmp_path) as ledger:
        gated, store, tenant, clock = _setup(ledger)
        rids = ["q0"]
        assert (await store.admit(tenant, "q0", 100, 100, "bf16", ())).allowed
        gated.fail = True
        clock[0] += LIFE_S * (1.0 - RENEW_SHARE)
        for i in range(1, 20):
            await _admit(store, tenant, f"q{i}")
            rids.append(f"q{i}")
            await asyncio.sleep(0.001)
        assert gated.transactions == 2 and not store._renewing  # one renewal, failed
        gated.fail = False
        await _exactly(ledger, store, rids)


async def test_a_request_the_old_allowance_cannot_take_waits_for_the_renewal(
        tmp_path: Path) -> None:
    """Past its life the old allowance admits none: that request's transaction comes after
    the renewal's, and gives back both the old allowance and its successor first."""
    async with _opened(tmp_path) as ledger:
        gated, store, tenant, clock = _setup(ledger)
        assert (await store.admit(tenant, "q0", 100, 100, "bf16", ())).allowed
        gated.gate.clear()
        clock[0] += LIFE_S * (1.0 - RENEW_SHARE)
        await _admit(store, tenant, "q1")
        await asyncio.sleep(0)
        clock[0] += LIFE_S
        late = asyncio.ensure_future(store.admit(tenant, "q2", 100, 100, "bf16", ()))
        await asyncio.sleep(0.01)
        assert not late.done()
        gated.gate.set()
        assert (await asyncio.wait_for(late, 5)).allowed
        await _exactly(ledger, store, ["q0", "q1", "q2"])


async def test_a_renewal_cancelled_before_it_ran_leaves_nothing_to_wait_for(
        tmp_path: Path) -> None:
    """A stop (or an admission) waits for renewals under way: one cancelled before its
    first step must not be waited for ever, and its allowance still goes back whole."""
    async with _opened(tmp_path) as ledger:
        gated, store, tenant, clock = _setup(ledger)
        assert (await store.admit(tenant, "q0", 100, 100, "bf16", ())).allowed
        clock[0] += LIFE_S * (1.0 - RENEW_SHARE)
        assert (await store.admit(tenant, "q1", 100, 100, "bf16", ())).allowed  # no yield
        store._renewing["tenant-a"].cancel()
        await asyncio.wait_for(store.stop(), 5)
        assert not store._renewing and gated.transactions == 1
        await _exactly(ledger, store, ["q0", "q1"])


async def test_a_stop_lets_admissions_under_way_finish_and_refuses_new_ones(
        tmp_path: Path) -> None:
    """An admission waiting for a renewal's transaction when the store stops gets its answer;
    one arriving during the stop is refused; no allowance outlives the stop's give-back."""
    async with _opened(tmp_path) as ledger:
        gated, store, tenant, clock = _setup(ledger)
        assert (await store.admit(tenant, "q0", 100, 100, "bf16", ())).allowed
        gated.gate.clear()  # the renewal's transaction waits
        clock[0] += LIFE_S * (1.0 - RENEW_SHARE)
        await _admit(store, tenant, "q1")  # starts the renewal
        await asyncio.sleep(0)
        clock[0] += LIFE_S  # the allowance takes no more: q2 waits for a transaction
        waiting = asyncio.ensure_future(store.admit(tenant, "q2", 100, 100, "bf16", ()))
        await asyncio.sleep(0.01)
        stopping = asyncio.ensure_future(store.stop())
        await asyncio.sleep(0.01)
        with pytest.raises(LedgerError, match="stopped"):
            await store.admit(tenant, "q3", 100, 100, "bf16", ())
        gated.gate.set()
        await asyncio.wait_for(stopping, 10)
        assert (await asyncio.wait_for(waiting, 1)).allowed
        rows = await ledger._fetch("SELECT request_id FROM reservations ORDER BY 1", ())
        assert [r[0] for r in rows] == ["q0", "q1", "q2"]


async def test_requests_that_queued_behind_a_transaction_are_admitted_from_its_allowance(
        tmp_path: Path) -> None:
    """Those that came while a transaction ran are admitted from the allowance it took, in
    arrival order: no second transaction for them (under load each transaction's newcomers
    waited for the next one, and the tenant never went back to its allowance)."""
    async with _opened(tmp_path) as ledger:
        gated, store, tenant, _ = _setup(ledger)
        gated.gate.clear()
        first = asyncio.ensure_future(store.admit(tenant, "q0", 100, 100, "bf16", ()))
        await asyncio.sleep(0.01)  # its transaction has its batch and waits
        later = [asyncio.ensure_future(store.admit(tenant, f"q{i}", 100, 100, "bf16", ()))
                 for i in range(1, 10)]
        await asyncio.sleep(0.01)
        gated.gate.set()
        verdicts = await asyncio.wait_for(asyncio.gather(first, *later), 5)
        assert all(v.allowed for v in verdicts) and gated.transactions == 1
        await _exactly(ledger, store, [f"q{i}" for i in range(10)])
