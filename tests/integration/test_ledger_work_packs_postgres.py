"""Work in packs on a real PostgreSQL server: a ledger that schema version 10 left half way
through a run (the SQLite fixture's rows, in tables made by version 10's statements, its last
work in per-row `work` rows) migrated in place and finished by this code with the bills that
version 10's code made; and a request written twice keeping its first rows."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest

from accounting.ledger import sql
from accounting.ledger.postgres import PostgresLedger
from accounting.work import WorkRow
from tests.accounting.fixtures.make_ledger_v10 import second_half
from tests.accounting.rollup_checks import FIXTURES, same, write_old_postgres_ledger
from tests.accounting.test_ledger_work_packs import _request, _work
from tests.support.postgres import fresh_database

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]
_names = itertools.count()
# request_hours is not copied: the trigger on requests fills it as their rows go in
V10_TABLES = ("requests", "work", "work_versions", "intervals", "shares", "engine_state",
              "replicas", "reservations", "share_hours", "engine_hours")


async def _write_v10(dsn: str) -> None:
    await write_old_postgres_ledger(dsn, 10, "ledger_v10.db", V10_TABLES)


async def test_a_v10_ledger_on_postgres_is_finished_with_the_same_bills(pg: str) -> None:
    dsn = await fresh_database(pg, f"v{next(_names)}")
    await _write_v10(dsn)
    want: dict[str, Any] = orjson.loads((FIXTURES / "ledger_v10.json").read_bytes())
    ledger = PostgresLedger(dsn)
    got = await second_half(ledger)
    check = PostgresLedger(dsn)
    await check.open()
    try:
        packs = await check._fetch("SELECT COUNT(*) FROM work_packs", ())
        versions = await check._fetch("SELECT MAX(version) FROM schema_version", ())
    finally:
        await check.close()
    assert int(packs[0][0]) > 0 and int(versions[0][0]) == sql.SCHEMA_VERSION
    for bills in (got, want):  # which process wrote a request is no bill (its pid)
        for detail in bills["requests"].values():
            if detail is not None:
                detail.pop("replica")
    for key in ("shares", "intervals", "requests", "reports", "tenant_hours"):
        same(orjson.loads(orjson.dumps(got[key])), want[key], key)


async def test_a_request_written_twice_keeps_its_first_rows_on_postgres(pg: str) -> None:
    ledger = PostgresLedger(await fresh_database(pg, f"d{next(_names)}"))
    await ledger.open()
    try:
        await ledger.append([_request("a")], {"e0": [_work("a", 10, 1.0), _work("a", 11, 2.0)]})
        await ledger.append([_request("a")], {"e0": [_work("a", 11, 3.0), _work("a", 12, 3.0)]})
        got = await ledger.snapshot("e0", [(10, 12)])
        assert sorted(w.row for w in got.rows) == sorted(map(WorkRow._make, [
            _work("a", 10, 1.0), _work("a", 11, 2.0), _work("a", 12, 3.0)]))
        assert got.versions == {10: 1, 11: 2, 12: 1}
    finally:
        await ledger.close()
