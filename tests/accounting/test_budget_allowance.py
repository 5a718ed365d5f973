"""Allowances (gateway/tenancy/allowance.py): far from its limits a tenant's requests are
admitted from room its replica reserved ahead, without a ledger transaction each; their rows
reach the ledger at the next flush, taken out of the allowance in the same transaction; near
the limits there is none and admission stays exact, in arrival order; another replica counts
an allowance as held (never admits against the same room) and gets the room back once it is
given back (a real SQLite ledger)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from accounting.ledger.base import LedgerError
from accounting.ledger.sqlite import SqliteLedger
from accounting.pricing import Pricing
from gateway.config import parse_config
from gateway.tenancy.allowance import HEADROOM, LIFE_S, MIN_REQUESTS
from gateway.tenancy.budget import estimate
from gateway.tenancy.store import TenancyStore
from tests.support.gateway import raw_config

EP = [{"name": "e", "url": "http://127.0.0.1:1", "precision": "bf16"}]
NOW = 1.7e9
pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def _opened(tmp_path: Path) -> AsyncIterator[SqliteLedger]:
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    try:
        yield ledger
    finally:
        await ledger.close()


def _tenant(**fields: Any) -> Any:
    raw = raw_config(EP, accounting={"ledger": {"kind": "sqlite", "path": "/tmp/unused.db"}})
    raw["tenants"][0].update(fields)
    return parse_config(raw, env={})


class _Counting:
    """A ledger that counts its admission transactions."""

    def __init__(self, ledger: SqliteLedger) -> None:
        self.ledger = ledger
        self.transactions = 0

    async def locked(self, *args: Any) -> None:
        self.transactions += 1
        await self.ledger.locked(*args)

    async def settle_reservations(self, *args: Any) -> None:
        await self.ledger.settle_reservations(*args)


def _each() -> float:
    store = TenancyStore(None, "r", _tenant().tenant_controls, Pricing(),  # type: ignore[arg-type]
                         lambda: NOW)
    return estimate(100, 100, store.rates_of("tenant-a", "bf16", 100, NOW)).j


async def _store(ledger: SqliteLedger, cfg: Any, replica: str = "r"
                 ) -> tuple[_Counting, TenancyStore]:
    counting = _Counting(ledger)
    store = TenancyStore(counting, replica, cfg.tenant_controls, Pricing(),  # type: ignore[arg-type]
                         lambda: NOW)
    return counting, store


async def _held(ledger: SqliteLedger) -> tuple[float, float, float, int]:
    return await ledger.reservations_held("tenant-a", 0, 0, 0)


async def test_far_from_the_limits_requests_are_admitted_without_a_transaction_each(
        tmp_path: Path) -> None:
    each = _each()
    cfg = _tenant(budgets=[{"period": "day", "j": each * 1e6}],
                  limits={"max_concurrent": 100_000})
    async with _opened(tmp_path) as ledger:
        counting, store = await _store(ledger, cfg)
        verdicts = [await store.admit(cfg.tenants[0], f"q{i}", 100, 100, "bf16", ())
                    for i in range(300)]
        assert all(v.allowed for v in verdicts)
        assert counting.transactions <= math.ceil(300 / MIN_REQUESTS)  # one each before
        await store.flush(give_back=True)
        held = await _held(ledger)  # every request's own reservation, nothing more
        assert held[0] == pytest.approx(each * 300) and held[3] == 300
        rows = await ledger._fetch("SELECT COUNT(*) FROM reservations", ())
        assert rows[0][0] == 300


async def test_near_the_limit_admission_stays_exact_and_in_order(tmp_path: Path) -> None:
    each = _each()
    room = 4 * HEADROOM * MIN_REQUESTS + 3  # room enough for allowances at first
    cfg = _tenant(budgets=[{"period": "day", "j": each * (room + 0.5)}])
    async with _opened(tmp_path) as ledger:
        counting, store = await _store(ledger, cfg)
        tenant = cfg.tenants[0]
        first = [await store.admit(tenant, f"a{i}", 100, 100, "bf16", ()) for i in range(room - 40)]
        crowd = await asyncio.gather(*(store.admit(tenant, f"b{i}", 100, 100, "bf16", ())
                                       for i in range(100)))
        allowed = [v.allowed for v in first + crowd]
        assert allowed == [True] * room + [False] * (len(allowed) - room)
        assert counting.transactions < room // 2  # allowances were used on the way
        await store.flush(give_back=True)
        held = await _held(ledger)
        assert held[0] == pytest.approx(each * room) and held[3] == room


async def test_another_replica_counts_an_allowance_as_held_until_it_is_given_back(
        tmp_path: Path) -> None:
    each = _each()
    room = 2 * HEADROOM * MIN_REQUESTS
    cfg = _tenant(budgets=[{"period": "day", "j": each * (room + 0.5)}])
    async with _opened(tmp_path) as ledger:
        _, one = await _store(ledger, cfg, "r1")
        _, two = await _store(ledger, cfg, "r2")
        tenant = cfg.tenants[0]
        assert (await one.admit(tenant, "first", 100, 100, "bf16", ())).allowed
        held = await _held(ledger)
        ahead = round(held[0] / each) - 1  # what r1's allowance holds, in requests
        assert ahead >= MIN_REQUESTS
        others = [await two.admit(tenant, f"q{i}", 100, 100, "bf16", ()) for i in range(room)]
        assert sum(v.allowed for v in others) == room - 1 - ahead  # never r1's room
        await one.flush(give_back=True)  # r1 admitted nothing more: all its room goes back
        more = [await two.admit(tenant, f"m{i}", 100, 100, "bf16", ()) for i in range(ahead + 5)]
        assert sum(v.allowed for v in more) == ahead
        await two.flush(give_back=True)
        held = await _held(ledger)
        assert held[0] == pytest.approx(each * room) and held[3] == room


async def test_a_request_admitted_from_an_allowance_is_settled_after_its_row_is_written(
        tmp_path: Path) -> None:
    """Its row waits in the allowance until that goes back (LIFE_S after it was taken); a
    request that ended by then is written settled, one that never ran not at all."""
    each = _each()
    cfg = _tenant(budgets=[{"period": "day", "j": each * 1e6}])
    clock = [NOW]
    async with _opened(tmp_path) as ledger:
        store = TenancyStore(ledger, "r", cfg.tenant_controls, Pricing(), lambda: clock[0])
        tenant = cfg.tenants[0]
        for i in range(3):
            assert (await store.admit(tenant, f"q{i}", 100, 100, "bf16", ())).allowed
        assert len(await ledger._fetch("SELECT request_id FROM reservations", ())) == 2  # q0
        store.settle("tenant-a", "q1", None, "", None)  # left before it ran
        store.settle("tenant-a", "q2", estimate(100, 7, store.rates_of(
            "tenant-a", "bf16", 100, NOW)), "e", 5)
        held = await _held(ledger)
        await store.flush()  # the allowance is young: it keeps its requests
        assert await _held(ledger) == held
        clock[0] += LIFE_S
        await store.flush()
        rows = await ledger._fetch(
            "SELECT request_id, open, engine FROM reservations WHERE engine IS NOT NULL "
            "OR request_id LIKE 'q%' ORDER BY request_id", ())
        assert rows == [("q0", 1, None), ("q2", 0, "e")]


async def test_an_allowances_slots_count_against_the_cap_on_every_replica(tmp_path: Path
                                                                         ) -> None:
    """Its slots are open requests to the other replicas, also while its replica is not yet
    heard from (young reservations are counted by their `open`, not as one each)."""
    cap = 200
    cfg = _tenant(limits={"max_concurrent": cap})
    async with _opened(tmp_path) as ledger:
        _, one = await _store(ledger, cfg, "r1")
        _, two = await _store(ledger, cfg, "r2")
        tenant = cfg.tenants[0]
        assert (await one.admit(tenant, "first", 1, 1, "bf16", ())).allowed
        slots = (await _held(ledger))[3] - 1
        assert slots >= MIN_REQUESTS
        others = [await two.admit(tenant, f"q{i}", 1, 1, "bf16", ()) for i in range(cap)]
        assert sum(v.allowed for v in others) == cap - 1 - slots
        assert {v.reason for v in others if not v.allowed} == {"concurrency"}


async def test_a_crashed_replicas_allowance_expires_as_its_reservations_do(tmp_path: Path
                                                                          ) -> None:
    each = _each()
    room = 2 * HEADROOM * MIN_REQUESTS
    cfg = _tenant(budgets=[{"period": "day", "j": each * (room + 0.5)}])
    clock = [NOW]
    async with _opened(tmp_path) as ledger:
        crashed = TenancyStore(ledger, "r1", cfg.tenant_controls, Pricing(), lambda: clock[0])
        tenant = cfg.tenants[0]
        assert (await crashed.admit(tenant, "first", 100, 100, "bf16", ())).allowed
        assert (await _held(ledger))[0] > 2 * each  # an allowance beside its request
        # r1 is gone (never flushed nor stopped); past the TTL its rows hold nothing
        clock[0] += cfg.tenant_controls.reservation_ttl_s + 1
        two = TenancyStore(ledger, "r2", cfg.tenant_controls, Pricing(), lambda: clock[0])
        verdicts = [await two.admit(tenant, f"q{i}", 100, 100, "bf16", ()) for i in range(room + 1)]
        assert sum(v.allowed for v in verdicts) == room


class _FailingOnce:
    """A ledger whose next settlement flush fails (the ledger unreachable for a moment)."""

    def __init__(self, ledger: SqliteLedger) -> None:
        self.ledger = ledger
        self.fail = False

    async def locked(self, *args: Any) -> None:
        await self.ledger.locked(*args)

    async def settle_reservations(self, *args: Any) -> None:
        if self.fail:
            self.fail = False
            raise LedgerError("connection refused")
        await self.ledger.settle_reservations(*args)


async def test_a_flush_that_fails_writes_nothing_and_the_next_writes_it_all(tmp_path: Path
                                                                           ) -> None:
    """Requests admitted from an allowance and ended before the flush are written settled,
    the allowance shrinks by their estimates; a failed flush loses none of it."""
    each = _each()
    cfg = _tenant(budgets=[{"period": "day", "j": each * 1e6}])
    async with _opened(tmp_path) as ledger:
        failing = _FailingOnce(ledger)
        store = TenancyStore(failing, "r", cfg.tenant_controls, Pricing(),  # type: ignore[arg-type]
                             lambda: NOW)
        tenant = cfg.tenants[0]
        for i in range(4):
            assert (await store.admit(tenant, f"q{i}", 100, 100, "bf16", ())).allowed
        used = estimate(100, 7, store.rates_of("tenant-a", "bf16", 100, NOW))
        store.settle("tenant-a", "q1", None, "", None)
        store.settle("tenant-a", "q2", used, "e", 5)
        before = await _held(ledger)
        failing.fail = True
        with pytest.raises(LedgerError):
            await store.flush(give_back=True)
        assert await _held(ledger) == before
        await store.flush(give_back=True)
        rows = await ledger._fetch(
            "SELECT request_id, open, engine FROM reservations ORDER BY request_id", ())
        assert rows == [("q0", 1, None), ("q2", 0, "e"), ("q3", 1, None)]
        held = await _held(ledger)
        assert held[0] == pytest.approx(2 * each + used.j) and held[3] == 2


async def test_workers_of_one_node_never_admit_past_the_cap_from_their_allowances(
        tmp_path: Path) -> None:
    """`wattgate serve --workers N`: the workers share their node's replica name; each
    holds allowances of its own. One takes an allowance, the other fills the cap, then the
    first admits from its own: never past the cap (one shared id overwrote and deleted the
    first's row, and 211 of 200 were admitted)."""
    cap = 200
    cfg = _tenant(limits={"max_concurrent": cap})
    async with _opened(tmp_path) as ledger:
        w1 = TenancyStore(ledger, "host:1", cfg.tenant_controls, Pricing(), lambda: NOW)
        w2 = TenancyStore(ledger, "host:1", cfg.tenant_controls, Pricing(), lambda: NOW)
        tenant = cfg.tenants[0]
        allowed = int((await w1.admit(tenant, "a0", 1, 1, "bf16", ())).allowed)
        allowed += sum([(await w2.admit(tenant, f"b{i}", 1, 1, "bf16", ())).allowed
                        for i in range(cap)])
        allowed += sum([(await w1.admit(tenant, f"a{i}", 1, 1, "bf16", ())).allowed
                        for i in range(1, 40)])
        await w1.flush(give_back=True)
        await w2.flush(give_back=True)
        rows = await ledger._fetch("SELECT COUNT(*), SUM(open) FROM reservations", ())
        assert allowed <= cap and rows == [(allowed, allowed)]


async def test_workers_of_one_node_never_admit_past_a_budget_from_their_allowances(
        tmp_path: Path) -> None:
    """As above for a budget (one shared id: 424 admitted against room for 400)."""
    each = _each()
    room = 400
    cfg = _tenant(budgets=[{"period": "day", "j": each * (room + 0.5)}])
    async with _opened(tmp_path) as ledger:
        w1 = TenancyStore(ledger, "host:1", cfg.tenant_controls, Pricing(), lambda: NOW)
        w2 = TenancyStore(ledger, "host:1", cfg.tenant_controls, Pricing(), lambda: NOW)
        tenant = cfg.tenants[0]
        allowed = int((await w1.admit(tenant, "a0", 100, 100, "bf16", ())).allowed)
        allowed += sum([(await w2.admit(tenant, f"b{i}", 100, 100, "bf16", ())).allowed
                        for i in range(room)])
        allowed += sum([(await w1.admit(tenant, f"a{i}", 100, 100, "bf16", ())).allowed
                        for i in range(1, 40)])
        await w1.flush(give_back=True)
        await w2.flush(give_back=True)
        held = await _held(ledger)
        assert held[0] == pytest.approx(each * allowed)
        assert allowed <= room


class _SlowCommit:
    """A ledger whose settlement flush is in flight for a while; `commits`: whether a
    flush cancelled meanwhile still commits (SQLite: the worker thread runs on) or not
    (PostgreSQL: the transaction is rolled back)."""

    def __init__(self, ledger: Any, commits: bool) -> None:
        self.ledger = ledger
        self.commits = commits
        self.slow = False
        self.writes: list[asyncio.Future[None]] = []

    async def locked(self, *args: Any) -> None:
        await self.ledger.locked(*args)

    async def settle_reservations(self, *args: Any) -> None:
        if not self.slow:
            await self.ledger.settle_reservations(*args)
            return
        self.slow = False

        async def write() -> None:
            await asyncio.sleep(0.2)
            await self.ledger.settle_reservations(*args)

        if self.commits:
            fut = asyncio.ensure_future(write())
            self.writes.append(fut)
            await asyncio.shield(fut)
        else:
            await write()


@pytest.mark.parametrize("commits", [True, False])
async def test_a_stop_during_a_flush_settles_every_request_and_gives_the_allowance_back(
        tmp_path: Path, commits: bool) -> None:
    """stop() lets a flush under way finish before it cancels the loop and flushes the
    rest: every request ends settled and no allowance is left. (Cancelled, the flush's write
    committed or not, and the requests it moved, or the allowance it gave back, were held
    until they expired.)"""
    each = _each()
    cfg = _tenant(budgets=[{"period": "day", "j": each * 1e6}],
                  limits={"max_concurrent": 100_000})
    async with _opened(tmp_path) as ledger:
        slow = _SlowCommit(ledger, commits)
        store = TenancyStore(slow, "r", cfg.tenant_controls, Pricing(),  # type: ignore[arg-type]
                             lambda: NOW)
        tenant = cfg.tenants[0]
        for i in range(3):
            assert (await store.admit(tenant, f"q{i}", 100, 100, "bf16", ())).allowed
        slow.slow = True
        store._task = asyncio.get_running_loop().create_task(store.flush(give_back=True))
        await asyncio.sleep(0.05)  # the flush is in flight, q1 and q2 moved
        used = estimate(100, 7, store.rates_of("tenant-a", "bf16", 100, NOW))
        for i in range(3):  # every request ends; then the gateway stops
            store.settle("tenant-a", f"q{i}", used, "e", 5)
        await store.stop()
        for fut in slow.writes:
            await fut
        rows = await ledger._fetch(
            "SELECT request_id, open, energy_j FROM reservations ORDER BY request_id", ())
        assert [r[:2] for r in rows] == [("q0", 0), ("q1", 0), ("q2", 0)]
