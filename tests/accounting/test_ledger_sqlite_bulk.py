"""The SQLite ledger's multi-row statements write exactly what row-by-row `executemany` writes."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import pytest

from accounting.ledger import sql
from accounting.ledger.base import EngineWork
from accounting.ledger.sqlite import ROWS_PER_STATEMENT, _blocks, _migrate, execute_rows


def _db(parameters: int | None = None) -> sqlite3.Connection:
    c = sqlite3.connect(":memory:", isolation_level=None)
    if parameters is not None:
        c.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, parameters)
    _migrate(c)
    return c


def _tables(c: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {t: sorted(c.execute(f"SELECT * FROM {t}").fetchall())
            for t in ("requests", "work", "shares", "work_versions")}


def _request(i: int, tenant: str = "a") -> tuple[Any, ...]:
    return (f"r{i:06d}", tenant, "m", "e1", "fp8", "chat", "ok", 1, i * 0.5, i * 0.5 + 0.3,
            0, 10 + i, 20 + i, i % 2, i // 8, i // 7, "rep", "engine", 200, "served",
            None if i % 3 else i * 0.5 + 0.2)


def _work(i: int, k: int, engine: str = "e1") -> EngineWork:
    return EngineWork(f"r{i:06d}", k, 1.0 * i, 2.0 * i, 0.25, 0.125, 3.0 * i, 0.0625, 0.5 * i,
                      engine)


def _share(i: int, k: int) -> tuple[Any, ...]:
    return (f"r{i:06d}", "e1", k, k * 1.0, 0, 0.1 * i, 0.05, 0.05 * i, 0.2, 1e-3 * i, 1e-5, 0,
            0.01 * i)


def _both(batches: Sequence[tuple[str, Sequence[Sequence[Any]]]],
          parameters: int | None = None) -> None:
    rowwise, bulk = _db(), _db(parameters)
    for statement, rows in batches:
        rowwise.executemany(statement, rows)
        execute_rows(bulk, statement, rows)
    assert _tables(bulk) == _tables(rowwise)


@pytest.mark.parametrize("parameters", [None, 999, 40])
@pytest.mark.parametrize("n", [1, 2, 3, 255, 256, 257, 700])
def test_bulk_inserts_and_marks_match_executemany(n: int, parameters: int | None) -> None:
    # None: this build's limit on bound parameters; 999: SQLite before 3.32; 40: tiny.
    requests = [_request(i) for i in range(n)]
    # Work comes per request, each with its intervals: not in key order.
    work = [_work(i, k, f"e{i % 3}") for i in range(n) for k in (i // 100, i // 100 + 1)]
    shares = [_share(i, i // 100) for i in range(n)]
    versions = sorted({(w.engine, w.interval_idx) for w in work})
    clean = [(engine, k, 1) for engine, k in versions[::2]]
    _both([(sql.INSERT_REQUEST, requests), (sql.INSERT_WORK, work),
           (sql.UPSERT_VERSION, versions), (sql.INSERT_SHARE, shares),
           (sql.UPSERT_VERSION, versions[:3]), (sql.CLEAR_DIRTY, clean)], parameters)


def test_conflicting_rows_are_skipped_as_row_by_row() -> None:
    # A request or work row written twice (a retried flush) keeps its first version.
    requests = [_request(i) for i in range(300)] + [_request(5, tenant="b"), _request(299, "b")]
    work = [_work(i, 1) for i in range(300)] + [
        _work(9, 1)._replace(request_id="r000008"), _work(7, 2, engine="e2"), _work(3, 0)]
    _both([(sql.INSERT_REQUEST, requests), (sql.INSERT_WORK, work),
           (sql.INSERT_REQUEST, requests[:10])])


def test_a_duplicate_share_fails_the_statement_as_row_by_row() -> None:
    c = _db()
    with pytest.raises(sqlite3.IntegrityError):
        execute_rows(c, sql.INSERT_SHARE, [_share(1, 1), _share(2, 1), _share(1, 1)])


@pytest.mark.parametrize("n", [0, 1, 5, 256, 300, 1000])
def test_blocks_cover_the_rows_in_order_with_power_of_two_sizes(n: int) -> None:
    rows = list(range(n))
    blocks = list(_blocks(rows))
    assert [x for b in blocks for x in b] == rows
    assert all(len(b) <= ROWS_PER_STATEMENT and len(b) & (len(b) - 1) == 0 for b in blocks)


def test_multi_row_needs_one_values_group() -> None:
    assert sql.multi_row("INSERT INTO t (a, b) VALUES (?, 0) ON CONFLICT DO NOTHING", 2) == (
        "INSERT INTO t (a, b) VALUES (?, 0), (?, 0) ON CONFLICT DO NOTHING")
    with pytest.raises(ValueError, match="one-row INSERT"):
        sql.multi_row("UPDATE t SET a = ?", 2)
