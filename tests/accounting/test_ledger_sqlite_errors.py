"""The SQLite ledger when a statement fails: a LedgerError, the transaction rolled back, and
the store closes (its connections and threads) or opens again afterwards."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from accounting.ledger import sql
from accounting.ledger.base import LedgerError, engine_work
from accounting.ledger.sqlite import SqliteLedger
from accounting.work import WorkRow

pytestmark = pytest.mark.timeout(60)
BROKEN = (sql.SCHEMA_VERSION + 1, ("ALTER TABLE no_such_table ADD COLUMN x INTEGER",))


async def test_a_failing_statement_raises_ledger_error_rolls_back_and_close_ends_the_threads(
        tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    work = engine_work("e0", [WorkRow("r0", 7, 10.0, 2.0, 0.5, 0.0, 20.0)])
    with pytest.raises(LedgerError, match="no_such_column"):
        await ledger._transaction([
            (sql.INSERT_WORK, work),
            ("INSERT INTO work (request_id, no_such_column) VALUES (?, ?)", [("r1", 1)])])
    assert await ledger._fetch("SELECT COUNT(*) FROM work", ()) == [(0,)]  # rolled back
    await ledger._fetch_aside("SELECT 1", ())  # the reader's connection and thread too
    threads = [*ledger._pool._threads, *ledger._aside_pool._threads]
    async with asyncio.timeout(5.0):
        await ledger.close()
    assert threads and not any(t.is_alive() for t in threads)


async def test_a_failed_migration_closes_the_connection_and_the_next_open_migrates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    monkeypatch.setattr(sql, "MIGRATIONS", (*sql.MIGRATIONS, BROKEN))
    with pytest.raises(LedgerError, match="no_such_table"):
        await ledger.open()
    assert ledger._conn is None
    monkeypatch.undo()
    await ledger.open()  # not taken for open: it connects and migrates
    rows = await ledger._fetch("SELECT version FROM schema_version ORDER BY version", ())
    assert rows == [(version,) for version, _ in sql.MIGRATIONS]
    await ledger.close()
