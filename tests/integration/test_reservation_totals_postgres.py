"""Budget reservations' totals on a real PostgreSQL server (the checks are
tests/accounting/reservation_checks.py): kept by the PL/pgSQL triggers, and started from the
reservations of a ledger migrated from schema version 11."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from accounting.ledger import sql
from accounting.ledger.postgres import PostgresLedger
from tests.accounting.reservation_checks import (
    check_totals_follow_every_change,
    check_v11_ledger_starts_its_totals,
)
from tests.accounting.test_reservation_totals import RESERVATION_COLUMNS
from tests.support.postgres import fresh_database

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]
_names = itertools.count()


async def test_totals_follow_every_change(pg: str) -> None:
    ledger = PostgresLedger(await fresh_database(pg, f"totals{next(_names)}"))
    await ledger.open()
    try:
        await check_totals_follow_every_change(ledger)
    finally:
        await ledger.close()


async def test_a_v11_ledger_starts_its_totals(pg: str) -> None:
    import asyncpg

    dsn = await fresh_database(pg, f"totals{next(_names)}")

    async def write_v11(rows: list[tuple[Any, ...]]) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(sql.CREATE_VERSION)
            for number, statements in sql.schema("postgres"):
                if number > 11:
                    break
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", number)
            marks = ", ".join(f"${i + 1}" for i in range(10))
            await conn.executemany(
                f"INSERT INTO reservations ({RESERVATION_COLUMNS}) VALUES ({marks})", rows)
        finally:
            await conn.close()

    await check_v11_ledger_starts_its_totals(PostgresLedger(dsn), write_v11)
