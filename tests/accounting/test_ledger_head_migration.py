"""A ledger migrated by a development build to version 13 (a `prefill_s` work column, packs of
eight fields) opens at today's version: its packs read their prefill seconds as the head."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest

from accounting.ledger import sql
from accounting.ledger.sqlite import SqliteLedger


@pytest.mark.timeout(30)
async def test_a_ledger_at_the_development_version_13_migrates_and_reads_its_packs(
        tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    conn = sqlite3.connect(path)
    conn.execute(sql.CREATE_VERSION)
    for version, statements in sql.schema("sqlite"):
        if version <= 12:
            for statement in statements:
                conn.execute(statement)
            conn.execute(sql.SET_VERSION, (version,))
    conn.execute("ALTER TABLE work ADD COLUMN prefill_s REAL NOT NULL DEFAULT 0")
    conn.execute(sql.SET_VERSION, (13,))
    # that build's pack: WorkRow's first seven fields and its prefill seconds
    packed = msgspec.msgpack.encode([["r0", 7, 900.0, 3.0, 0.8, 0.1, 30.0, 0.25]])
    conn.execute("INSERT INTO work_versions (engine, interval_idx, version, dirty) "
                 "VALUES ('e0', 7, 1, 1)")
    conn.execute("INSERT INTO work_packs (engine, interval_idx, version, n_rows, packed) "
                 "VALUES ('e0', 7, 1, 1, ?)", (packed,))
    conn.commit()
    conn.close()
    ledger = SqliteLedger(path)
    await ledger.open()
    try:
        versions = await ledger._fetch("SELECT version FROM schema_version ORDER BY version", ())
        assert versions[-2:] == [(13,), (14,)] and versions[-1] == (sql.MIGRATIONS[-1][0],)
        columns = {c[1] for c in await ledger._fetch("PRAGMA table_info(work)", ())}
        assert {"prefill_s", "head_s", "head_decode"} <= columns
        (row,) = [p.row for p in (await ledger.snapshot("e0", [(7, 7)])).rows]
        assert (row.request_id, row.prefill_tokens, row.head_s, row.head_decode) == (
            "r0", 900.0, 0.25, 0.0)
    finally:
        await ledger.close()
