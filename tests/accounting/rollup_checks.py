"""Checks both ledger stores share: the hourly rollups against the per-request rows, and a
ledger written by schema version 9 (tests/accounting/fixtures) migrated in place."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from accounting.ledger import sql
from accounting.ledger.base import HOUR_S, Ledger
from accounting.ledger.postgres import PostgresLedger
from accounting.ledger.sqlite import SqliteLedger
from accounting.report import GROUP_KEYS, build_report
from accounting.service import AccountingService, EngineInfo
from tests.accounting.fixtures.make_ledger_v9 import HOUR, SHIFT_S, shifted_run, windows
from tests.accounting.test_accounting_accuracy import T0_WALL
from tests.accounting.test_ledger_sqlite import Clock, ReplayMeter, drive, make_config

FIXTURES = Path(__file__).parent / "fixtures"
SqlLedger = SqliteLedger | PostgresLedger
REL = 1e-9


def expected_bills() -> dict[str, Any]:
    """The bills schema version 9's code read from fixtures/ledger_v9.db."""
    out: dict[str, Any] = orjson.loads((FIXTURES / "ledger_v9.json").read_bytes())
    return out


def same(got: Any, want: Any, where: str) -> None:
    """Equal, numbers to REL relative (and 1e-12 J, g, USD absolute, for sums that are 0)."""
    if isinstance(want, float) or (isinstance(got, float) and isinstance(want, int)):
        assert got == pytest.approx(want, rel=REL, abs=1e-12), where
    elif isinstance(want, dict):
        assert set(got) == set(want), where
        for k in want:
            same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


async def report(ledger: Ledger, since: float, until: float, tenant: str | None, *,
                 per_request: bool = False, group_by: tuple[str, ...] = GROUP_KEYS
                 ) -> dict[str, Any]:
    data = await ledger.usage(since, until, tenant, per_request=per_request,
                              group_by=group_by)
    got = build_report(data, group_by, since, until)
    # the JSON the fixture was written with: tuples become lists, as they were read back
    out: dict[str, Any] = orjson.loads(orjson.dumps({"rows": got.rows, "total": got.total}))
    return out


async def served_with_revisions(ledger: SqlLedger) -> AccountingService:
    """The fixture's run (two hours, every outcome class) through a service on `ledger`,
    with its longest request recorded late, so its intervals are apportioned twice."""
    run, _ = shifted_run()
    late = max(run.records, key=lambda r: r.finished_s - r.arrived_s)
    clock = Clock(T0_WALL + SHIFT_S)
    svc = AccountingService(make_config(), [EngineInfo("e0", "m", "bf16", 1)], ledger=ledger,
                            meters={"e0": ReplayMeter(run.readings, clock)}, clock=clock)
    await ledger.open()
    await drive(svc, run, clock, run.readings[-1][0], hold=frozenset({late.request_id}))
    svc.record(late)
    for _ in range(3):
        await svc.step()
        await svc.flush()
    clock.t += 4.0
    await svc.step()
    revised = await ledger._fetch("SELECT MAX(version) FROM work_versions", ())
    assert int(revised[0][0]) > 1  # the late record's intervals were apportioned again
    return svc


async def check_rollups_equal_rows(ledger: Any) -> None:
    """Every window's report from the rollups equals the one from the per-request rows, and
    what budgets read (tenant_hours) equals the shares' sums."""
    wins = {**windows(), "first hour": ((HOUR - 1) * HOUR_S, HOUR * HOUR_S),
            "an edge and an hour": (HOUR * HOUR_S - 6.5, (HOUR + 1) * HOUR_S)}
    groupings = (GROUP_KEYS, ("tenant",), ("hour", "precision"), ())
    for name, (since, until) in wins.items():
        for tenant in (None, "t1"):
            for group_by in groupings:
                got = await report(ledger, since, until, tenant, group_by=group_by)
                want = await report(ledger, since, until, tenant, per_request=True,
                                    group_by=group_by)
                assert want["total"]["requests"] > 0
                same(got, want, f"{name}:{tenant}:{group_by}")
    rows = await ledger._fetch(
        "SELECT r.tenant, s.hour_idx, SUM(s.energy_j), SUM(s.carbon_g), SUM(s.cost_usd) "
        "FROM shares s JOIN requests r ON r.request_id = s.request_id "
        "GROUP BY r.tenant, s.hour_idx", ())
    assert len(rows) == 6  # three tenants, two hours
    for tenant, hour, energy, carbon, cost in rows:
        got = {h: v for h, *v in await ledger.tenant_hours(tenant, 0)}[int(hour)]
        same(got, [float(energy), float(carbon), float(cost)], f"{tenant}@{hour}")


async def check_migrated_bills(ledger: Any) -> None:
    """A ledger written by schema 9 (the fixture's data), opened by this code: migrated in
    place, every bill as schema 9's code read it."""
    want = expected_bills()
    version = await ledger._fetch("SELECT MAX(version) FROM schema_version", ())
    assert int(version[0][0]) == sql.SCHEMA_VERSION
    for name, (since, until) in windows().items():
        for tenant in (None, "t1"):
            key = f"{name}:{tenant or '*'}"
            same(await report(ledger, since, until, tenant), want["reports"][key], key)
            same(await report(ledger, since, until, tenant, per_request=True),
                 want["reports"][key], f"{key} per request")
    for rid, detail in want["requests"].items():
        same(await ledger.request(rid), detail, rid)
    for tenant, hours in want["tenant_hours"].items():
        same(await ledger.tenant_hours(tenant, 0), hours, tenant)
    hour_rows = await ledger._fetch("SELECT COUNT(*) FROM request_hours", ())
    assert int(hour_rows[0][0]) >= 3


async def count(ledger: SqlLedger, table: str, *params: Any) -> int:
    rows = await ledger._fetch(f"SELECT COUNT(*) FROM {table}", params)
    return int(rows[0][0])


async def check_pruned_bills_unchanged(ledger: SqlLedger) -> None:
    """Pruning every final row (in batches of 50) leaves the whole hours' bills and what
    budgets read as they were; a request's own row is gone with its shares."""
    hours = {"first hour": ((HOUR - 1) * HOUR_S, HOUR * HOUR_S),
             "hour": (HOUR * HOUR_S, (HOUR + 1) * HOUR_S),
             "all": (0.0, 1e12)}
    before = {(name, t): await report(ledger, *win, t) for name, win in hours.items()
              for t in (None, "t1")}
    budgets = {t: await ledger.tenant_hours(t, 0) for t in ("t0", "t1", "t2")}
    rid = (await ledger._fetch("SELECT request_id FROM requests LIMIT 1", ()))[0][0]
    assert await count(ledger, "requests") > 100
    batches = 1
    while await ledger.prune((HOUR + 2) * HOUR_S, 1.0, 50):
        batches += 1
    assert batches > 5  # in small batches
    # what is left: the last interval apportioned, whose requests are not final yet (the
    # interval after it is not apportioned), and the intervals after it, not apportioned
    (nxt,), = await ledger._fetch("SELECT next_interval FROM engine_state", ())
    for table in ("work", "work_packs", "shares", "intervals", "work_versions"):
        old = await ledger._fetch(f"SELECT COUNT(*) FROM {table} WHERE interval_idx < ?",
                                  (int(nxt) - 1,))
        assert int(old[0][0]) == 0, table
    assert await count(ledger, "intervals") == 1
    assert await count(ledger, "requests") == await count(ledger, "requests r WHERE "
                                                          "r.last_interval >= ?", int(nxt) - 1)
    for (name, tenant), want in before.items():
        same(await report(ledger, *hours[name], tenant), want, f"{name}:{tenant}")
    same({t: await ledger.tenant_hours(t, 0) for t in budgets}, budgets, "tenant_hours")
    assert await ledger.request(rid) is None


async def check_unfinal_rows_kept(ledger: SqlLedger) -> None:
    """An interval waiting for late work keeps itself, every later interval, and every
    request whose work reaches it."""
    (lo, hi), = await ledger._fetch("SELECT MIN(interval_idx), MAX(interval_idx) FROM work_packs",
                                    ())
    waiting = (int(lo) + int(hi)) // 2
    await ledger._transaction([("UPDATE work_versions SET dirty = 1 WHERE interval_idx = ?",
                                [(waiting,)])])
    reaching = await ledger._fetch(
        "SELECT COUNT(*) FROM requests WHERE last_interval >= ?", (waiting,))
    while await ledger.prune((HOUR + 2) * HOUR_S, 1.0, 50):
        pass
    left = await ledger._fetch("SELECT MIN(interval_idx) FROM intervals", ())
    assert int(left[0][0]) == waiting
    assert await count(ledger, "requests") == int(reaching[0][0]) > 0
    pruned = await ledger._fetch("SELECT COUNT(*) FROM work_packs WHERE interval_idx < ?", (waiting,))
    assert int(pruned[0][0]) == 0


async def write_old_postgres_ledger(dsn: str, version: int, fixture: str,
                                    tables: Sequence[str]) -> None:
    """Schema `version` on PostgreSQL, by that version's own statements, holding the rows of
    the SQLite fixture `fixture` (a ledger written by that version's code)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    src = sqlite3.connect(FIXTURES / fixture)
    try:
        await conn.execute(sql.CREATE_VERSION)
        for number, statements in sql.schema("postgres"):
            if number > version:
                break
            for statement in statements:
                await conn.execute(statement)
            await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", number)
        for table in tables:
            cur = src.execute(f"SELECT * FROM {table}")
            columns = [d[0] for d in cur.description]
            rows = cur.fetchall()
            if rows:
                marks = ", ".join(f"${i + 1}" for i in range(len(columns)))
                await conn.executemany(
                    f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)
    finally:
        src.close()
        await conn.close()
