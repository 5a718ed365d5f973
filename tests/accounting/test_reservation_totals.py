"""Budget reservations' totals on SQLite (reservation_checks.py has the checks)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from accounting.ledger import sql
from accounting.ledger.sqlite import SqliteLedger
from tests.accounting.reservation_checks import (
    check_totals_follow_every_change,
    check_v11_ledger_starts_its_totals,
)

pytestmark = pytest.mark.timeout(120)

RESERVATION_COLUMNS = ("request_id, tenant, replica, created_s, energy_j, carbon_g, cost_usd, "
                       "open, engine, last_interval")


async def test_totals_follow_every_change(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    try:
        await check_totals_follow_every_change(ledger)
    finally:
        await ledger.close()


async def test_a_v11_ledger_starts_its_totals(tmp_path: Path) -> None:
    path = tmp_path / "l.db"

    async def write_v11(rows: list[tuple[Any, ...]]) -> None:
        conn = sqlite3.connect(path)
        conn.execute(sql.CREATE_VERSION)
        for number, statements in sql.schema("sqlite"):
            if number > 11:
                break
            for statement in statements:
                conn.execute(statement)
            conn.execute(sql.SET_VERSION, (number,))
        conn.executemany(f"INSERT INTO reservations ({RESERVATION_COLUMNS}) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.commit()
        conn.close()

    await check_v11_ledger_starts_its_totals(SqliteLedger(path), write_v11)
