"""Hourly rollups on SQLite: equal to the per-request rows they cover, through revisions; and
a ledger file written by schema version 9 migrated in place with its bills unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from accounting.ledger.sqlite import SqliteLedger
from tests.accounting.rollup_checks import (
    FIXTURES,
    check_migrated_bills,
    check_rollups_equal_rows,
    served_with_revisions,
)

pytestmark = pytest.mark.timeout(120)


async def test_rollups_equal_the_per_request_rows_through_revisions(tmp_path: Path) -> None:
    svc = await served_with_revisions(SqliteLedger(tmp_path / "l.db"))
    try:
        await check_rollups_equal_rows(svc.ledger)
    finally:
        await svc.stop()


async def test_a_v9_ledger_file_is_migrated_in_place_with_its_bills_unchanged(
        tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    shutil.copy(FIXTURES / "ledger_v9.db", path)
    ledger = SqliteLedger(path)
    await ledger.open()
    try:
        await check_migrated_bills(ledger)
    finally:
        await ledger.close()
    again = SqliteLedger(path)  # a second open finds it migrated and changes nothing
    await again.open()
    try:
        await check_migrated_bills(again)
    finally:
        await again.close()
