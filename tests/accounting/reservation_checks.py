"""Checks both ledger stores share for budget reservations: what an admission reads (each
tenant's totals per replica, kept by triggers, after an indexed purge) is what a scan of
every reservation says, through admissions, settlements, drops, finality and expiry on
two replicas, one of them gone; and a ledger migrated from schema version 11 starts its
totals from the reservations it holds."""

from __future__ import annotations

import random
from typing import Any

import pytest

from accounting.ledger import reservation_schema as reservations
from accounting.ledger import sql
from accounting.ledger.base import LedgerError
from accounting.ledger.postgres import PostgresLedger
from accounting.ledger.sqlite import SqliteLedger
from accounting.pricing import Pricing
from gateway.config import parse_config
from gateway.tenancy.budget import Cost
from gateway.tenancy.renewal import NEW_REPLICA_S, REPLICA_LIVE_S
from gateway.tenancy.store import TenancyStore
from tests.support.gateway import raw_config

SqlLedger = SqliteLedger | PostgresLedger
EP = [{"name": "e", "url": "http://127.0.0.1:1", "precision": "bf16"}]
TTL_S = 240.0


class Wall:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _config() -> Any:
    raw = raw_config(EP, accounting={"ledger": {"kind": "sqlite", "path": "/tmp/unused.db"}})
    raw["tenants"][0].update(budgets=[{"period": "hour", "j": 1e12}],
                             limits={"max_concurrent": 10**6})
    raw["tenants"][1].update(budgets=[{"period": "day", "usd": 1e9}])
    raw.setdefault("tenant_controls", {})["reservation_ttl_s"] = TTL_S
    return parse_config(raw, env={})


async def _totals(ledger: SqlLedger) -> dict[tuple[str, str], tuple[float, ...]]:
    rows = await ledger._fetch("SELECT tenant, replica, energy_j, carbon_g, cost_usd, open_n, "
                               "rows_n, COALESCE(settled_last, -1) FROM reservation_totals", ())
    return {(t, r): tuple(float(v) for v in rest) for t, r, *rest in rows}


async def _scanned(ledger: SqlLedger) -> dict[tuple[str, str], tuple[float, ...]]:
    rows = await ledger._fetch(
        "SELECT tenant, replica, SUM(energy_j), SUM(carbon_g), SUM(cost_usd), SUM(open), "
        "COUNT(*), COALESCE(MAX(CASE WHEN open = 0 THEN last_interval END), -1) "
        "FROM reservations GROUP BY tenant, replica", ())
    return {(t, r): tuple(float(v) for v in rest) for t, r, *rest in rows}


def _close(got: dict[Any, tuple[float, ...]], want: dict[Any, tuple[float, ...]]) -> None:
    """The sums equal; the last interval settled is at least that of the settled rows left
    (it never goes down: higher ones may have gone as final)."""
    assert set(got) == set(want)
    for key, values in want.items():
        assert got[key][:-1] == pytest.approx(values[:-1], rel=1e-9, abs=1e-9), key
        assert got[key][-1] >= values[-1], key


async def _held_by_scan(ledger: SqlLedger, tenant: str, now: float) -> tuple[float, ...]:
    held = await ledger.reservations_held(tenant, now - NEW_REPLICA_S, now - REPLICA_LIVE_S,
                                          now - TTL_S)
    return tuple(float(v) for v in held)


async def _held_by_totals(ledger: SqlLedger, tenant: str, now: float) -> tuple[float, ...]:
    (row,) = await ledger._fetch(reservations.SELECT_HELD_TOTALS,
                                 (now - REPLICA_LIVE_S, now - NEW_REPLICA_S, tenant))
    return tuple(-1.0 if v is None else float(v) for v in row)


async def check_totals_follow_every_change(ledger: SqlLedger, seed: int = 7) -> None:
    """Random admissions, settlements and drops by two replicas (the second stops being heard
    from half way), engines apportioning on, reservations expiring: after every step the
    totals equal a scan, and what an admission reads equals what the scan says it holds."""
    rng = random.Random(seed)
    cfg = _config()
    wall = Wall(1.7e9)
    t0 = wall.t
    stores = {name: TenancyStore(ledger, name, cfg.tenant_controls, Pricing(), wall)
              for name in ("r1", "r2")}
    await ledger._transaction([
        (sql.UPSERT_STATE, [(e, 0, 0.0, 0.0, 0, None, None, None, None, None, None)
                            for e in ("e", "f")])])
    open_ids: dict[str, list[tuple[str, str]]] = {"r1": [], "r2": []}
    interval = {"e": 0, "f": 0}
    ids = iter(range(10**6))
    for step in range(400):
        wall.t = t0 + step * 2.0
        seen = [(r, wall.t) for r in ("r1", "r2") if r == "r1" or step < 200]
        await ledger._transaction([(
            "INSERT INTO replicas (replica, open_since_s, seen_s) VALUES (?, ?, ?) "
            "ON CONFLICT (replica) DO UPDATE SET seen_s = excluded.seen_s",
            [(r, None, s) for r, s in seen])])
        replica = "r1" if step >= 200 or rng.random() < 0.5 else rng.choice(("r1", "r2"))
        store = stores[replica]
        tenant = cfg.tenants[rng.randrange(2)]
        for _ in range(rng.randrange(1, 4)):
            rid = f"q{next(ids)}"
            verdict = await store.admit(tenant, rid, rng.uniform(1, 500), rng.uniform(1, 500),
                                        "bf16", ())
            assert verdict.allowed
            open_ids[replica].append((tenant.name, rid))
        # a replica that stopped settles nothing more: its open reservations expire
        if step < 200 or replica == "r1":
            rng.shuffle(open_ids[replica])
            for _ in range(rng.randrange(0, len(open_ids[replica]) + 1)):
                name, rid = open_ids[replica].pop()
                engine = rng.choice(("e", "f"))
                if rng.random() < 0.15:
                    store.settle(name, rid, None, "", None)
                else:
                    cost = Cost(rng.uniform(0, 50), rng.uniform(0, 1), rng.uniform(0, 0.01))
                    store.settle(name, rid, cost, engine,
                                 interval[engine] + rng.randrange(0, 3))
            await store.flush()
        for engine in interval:
            interval[engine] += rng.randrange(0, 3)
        await ledger._transaction([(
            "UPDATE engine_state SET next_interval = ? WHERE engine = ?",
            [(interval[e], e) for e in interval])])
        _close(await _totals(ledger), await _scanned(ledger))
        if step % 10 == 9:  # what the next admission will read, against the scan
            for name in ("tenant-a", "tenant-b"):
                await ledger._transaction([(reservations.PURGE_FINAL, [(name,)]), (
                    reservations.PURGE_EXPIRED, [(name, wall.t - TTL_S)])])
                *held, last = await _held_by_totals(ledger, name, wall.t)
                assert held == pytest.approx(await _held_by_scan(ledger, name, wall.t),
                                             rel=1e-9, abs=1e-9)
                finished = await ledger._fetch(
                    "SELECT MAX(last_interval) FROM reservations WHERE tenant = ? AND open = 0",
                    (name,))
                if finished[0][0] is not None:  # not below the last not yet final
                    assert last >= finished[0][0]
                if last >= 0:  # and no higher than any settled
                    assert last <= max(interval.values()) + 2
    # the gone replica's reservations expired and were purged; its totals row went with them
    assert all(r != "r2" for _, r in await _totals(ledger))
    # no statement may move a reservation to another tenant's or replica's totals
    for column in ("tenant", "replica"):
        with pytest.raises(LedgerError, match="keeps its tenant and replica"):
            await ledger._transaction([(f"UPDATE reservations SET {column} = 'moved'", [()])])
    _close(await _totals(ledger), await _scanned(ledger))


async def check_v11_ledger_starts_its_totals(ledger: SqlLedger, write_v11: Any) -> None:
    """Reservations written under schema version 11 are in the totals once migrated."""
    rows = [(f"q{i}", f"tenant-{'ab'[i % 2]}", f"r{i % 3}", 1.7e9 + i, 1.5 * i, 0.1 * i,
             0.001 * i, i % 2, None if i % 2 else "e", None if i % 2 else 5) for i in range(30)]
    await write_v11(rows)
    await ledger.open()
    try:
        _close(await _totals(ledger), await _scanned(ledger))
        assert {k: v[-1] for k, v in (await _totals(ledger)).items()} == {
            k: v[-1] for k, v in (await _scanned(ledger)).items()}
        assert len(await _totals(ledger)) == 6
    finally:
        await ledger.close()
