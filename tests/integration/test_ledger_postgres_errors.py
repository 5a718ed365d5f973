"""The PostgreSQL ledger when a statement fails: a LedgerError, and nothing left open that
would keep a shutting-down process (or a test's event loop) waiting."""

from __future__ import annotations

import asyncio
import itertools
import time

import asyncpg
import pytest

from accounting.ledger import postgres, sql
from accounting.ledger.base import LedgerError
from accounting.ledger.postgres import PostgresLedger
from tests.support.postgres import fresh_database

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]
_names = itertools.count()
BROKEN = (sql.SCHEMA_VERSION + 1, ("ALTER TABLE no_such_table ADD COLUMN x INTEGER",))


async def _sessions(pg: str, database: str) -> int:
    """The sessions open on `database`, once those just closed have gone (up to 5 s)."""
    conn = await asyncpg.connect(pg)
    try:
        deadline = time.monotonic() + 5.0
        while True:
            n = await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                                    database)
            if n == 0 or time.monotonic() > deadline:
                return int(n)
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def _until_running(ledger: PostgresLedger, query: str) -> None:
    """Wait (up to 10 s) until the server runs `query`."""
    for _ in range(500):
        if await ledger._fetch("SELECT 1 FROM pg_stat_activity WHERE query = ? AND "
                               "state = 'active'", (query,)):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the server never ran {query}")


async def _database(pg: str) -> tuple[str, str]:
    name = f"errors{next(_names)}"
    return name, await fresh_database(pg, name)


async def test_a_failing_statement_raises_ledger_error_and_close_leaves_no_session(
        pg: str) -> None:
    name, dsn = await _database(pg)
    ledger = PostgresLedger(dsn)
    await ledger.open()
    with pytest.raises(LedgerError, match='column "no_such_column"'):
        await ledger._transaction([("INSERT INTO work (request_id, no_such_column) VALUES (?, ?)",
                                    [("r0", 1)])])
    assert await ledger._fetch("SELECT 1", ()) == [(1,)]  # its connection is usable again
    async with asyncio.timeout(postgres.CLOSE_S + 2.0):
        await ledger.close()
    assert await _sessions(pg, name) == 0


async def test_a_failed_migration_leaves_no_session_and_the_next_open_migrates(
        pg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, dsn = await _database(pg)
    ledger = PostgresLedger(dsn)
    monkeypatch.setattr(sql, "MIGRATIONS", (*sql.MIGRATIONS, BROKEN))
    with pytest.raises(LedgerError, match="no_such_table"):
        await ledger.open()
    assert await _sessions(pg, name) == 0
    monkeypatch.undo()
    await ledger.open()  # not taken for open: it connects and migrates
    rows = await ledger._fetch("SELECT version FROM schema_version ORDER BY version", ())
    assert rows == [(version,) for version, _ in sql.MIGRATIONS]
    await ledger.close()


async def test_close_cuts_a_statement_unanswered_after_close_s_and_the_statement_fails(
        pg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _, dsn = await _database(pg)
    monkeypatch.setattr(postgres, "CLOSE_S", 0.5)
    ledger = PostgresLedger(dsn)
    await ledger.open()
    stuck = asyncio.create_task(ledger._fetch("SELECT pg_sleep(60)", ()))
    await _until_running(ledger, "SELECT pg_sleep(60)")
    began = time.monotonic()
    await ledger.close()
    assert time.monotonic() - began < 3.0
    with pytest.raises(LedgerError):
        await stuck
    # (the server's session runs its pg_sleep on until it notices the connection gone)


async def test_a_closed_or_never_opened_ledger_raises_ledger_error(pg: str) -> None:
    _, dsn = await _database(pg)
    ledger = PostgresLedger(dsn)
    with pytest.raises(LedgerError, match="not open"):
        await ledger.usage(0.0, 1.0, None)
    await ledger.open()
    assert (await ledger.usage(0.0, 1.0, None)) is not None
    await ledger.close()
    with pytest.raises(LedgerError, match="not open"):
        await ledger.usage(0.0, 1.0, None)
    with pytest.raises(LedgerError, match="not open"):
        await ledger._transaction([("DELETE FROM work", [()])])
