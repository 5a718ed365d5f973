"""Hourly rollups on a real PostgreSQL server: equal to the per-request rows they cover,
through revisions and after the rows are pruned (rows not final kept); and a ledger written
by schema version 9 (the SQLite fixture's rows, in tables made by version 9's statements)
migrated in place with its bills unchanged."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import asyncpg
import pytest

from accounting.ledger import sql
from accounting.ledger.postgres import PostgresLedger
from tests.accounting.rollup_checks import (
    FIXTURES,
    check_migrated_bills,
    check_pruned_bills_unchanged,
    check_rollups_equal_rows,
    check_unfinal_rows_kept,
    served_with_revisions,
)
from tests.support.postgres import fresh_database, postgres_server

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]
_names = itertools.count()
V9_TABLES = ("requests", "work", "work_versions", "intervals", "shares", "engine_state",
             "replicas", "tenant_hours", "reservations")


@pytest.fixture(scope="module")
def pg() -> Iterator[str]:
    with postgres_server() as dsn:
        yield dsn


async def test_rollups_equal_the_per_request_rows_through_revisions_on_postgres(
        pg: str) -> None:
    ledger = PostgresLedger(await fresh_database(pg, f"r{next(_names)}"))
    svc = await served_with_revisions(ledger)
    try:
        await check_rollups_equal_rows(ledger)
    finally:
        await svc.stop()


@pytest.mark.parametrize("check", [check_pruned_bills_unchanged, check_unfinal_rows_kept])
async def test_pruning_on_postgres(pg: str, check: Callable[[Any], Awaitable[None]]) -> None:
    ledger = PostgresLedger(await fresh_database(pg, f"p{next(_names)}"))
    svc = await served_with_revisions(ledger)
    try:
        await check(ledger)
    finally:
        await svc.stop()


async def _write_v9(dsn: str) -> None:
    """Version 9's schema, by its own statements, holding the SQLite fixture's rows."""
    conn = await asyncpg.connect(dsn)
    src = sqlite3.connect(FIXTURES / "ledger_v9.db")
    try:
        await conn.execute(sql.CREATE_VERSION)
        for version, statements in sql.schema("postgres"):
            if version > 9:
                break
            for statement in statements:
                await conn.execute(statement)
            await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", version)
        for table in V9_TABLES:
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


async def test_a_v9_ledger_on_postgres_is_migrated_in_place_with_its_bills_unchanged(
        pg: str) -> None:
    dsn = await fresh_database(pg, f"m{next(_names)}")
    await _write_v9(dsn)
    ledger = PostgresLedger(dsn)
    await ledger.open()
    try:
        await check_migrated_bills(ledger)
    finally:
        await ledger.close()
