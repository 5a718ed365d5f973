"""Hourly rollups on a real PostgreSQL server: equal to the per-request rows they cover,
through revisions and after the rows are pruned (rows not final kept); and a ledger written
by schema version 9 (the SQLite fixture's rows, in tables made by version 9's statements)
migrated in place with its bills unchanged."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from accounting.ledger.postgres import PostgresLedger
from tests.accounting.rollup_checks import (
    check_migrated_bills,
    check_pruned_bills_unchanged,
    check_rollups_equal_rows,
    check_unfinal_rows_kept,
    served_with_revisions,
    write_old_postgres_ledger,
)
from tests.support.postgres import fresh_database

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]
_names = itertools.count()
V9_TABLES = ("requests", "work", "work_versions", "intervals", "shares", "engine_state",
             "replicas", "tenant_hours", "reservations")


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
    await write_old_postgres_ledger(dsn, 9, "ledger_v9.db", V9_TABLES)


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
