"""Work in packs (schema version 11, ledger/packs.py): one row per (engine, interval) and
append, read back bit for bit, a request written twice keeping its first rows; and a ledger
that schema version 10 left half way through a run, its last work in per-row `work` rows,
finished by this code with the bills that schema version 10's code made."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from accounting.ledger import sql
from accounting.ledger.base import EngineWork, RequestRow
from accounting.ledger.packs import pack_params, unpack
from accounting.ledger.sqlite import SqliteLedger
from accounting.work import Work, WorkRow
from tests.accounting.fixtures.make_ledger_v10 import second_half
from tests.accounting.rollup_checks import FIXTURES, same

pytestmark = pytest.mark.timeout(120)


def _request(rid: str, engine: str = "e0") -> RequestRow:
    return RequestRow(rid, "t0", "m", engine, "bf16", "c", "ok", 1, 10.0, 12.0, 0, 5, 7, 1, 10,
                      12, "rep")


def _work(rid: str, k: int, x: float) -> Work:
    # values whose every bit matters: a float rounded anywhere reads back unequal
    return (rid, k, x / 3.0, x / 7.0, 0.1 + x * 1e-17, x * 1e300, 2.0 ** -1074 * k,
            x / 11.0, x / 13.0)


async def test_an_append_writes_one_pack_per_interval_read_back_bit_for_bit(
        tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    try:
        rids = [f"r{i}" for i in range(50)]
        work = {"e0": [_work(r, k, i + 0.5) for i, r in enumerate(rids) for k in (10, 11, 12)],
                "e1": [_work("x", 11, 9.25)]}
        await ledger.append([_request(r) for r in rids] + [_request("x", "e1")], work)
        packs = await ledger._fetch("SELECT engine, interval_idx, version, n_rows FROM "
                                    "work_packs ORDER BY engine, interval_idx", ())
        assert packs == [("e0", 10, 1, 50), ("e0", 11, 1, 50), ("e0", 12, 1, 50),
                         ("e1", 11, 1, 1)]
        got = await ledger.snapshot("e0", [(10, 12)])
        assert sorted(w.row for w in got.rows) == sorted(WorkRow._make(w) for w in work["e0"])
        assert {w.tenant for w in got.rows} == {"t0"}
        assert got.versions == {10: 1, 11: 1, 12: 1}
    finally:
        await ledger.close()


async def test_a_request_written_twice_keeps_its_first_rows(tmp_path: Path) -> None:
    """A replayed journal writes a request again, its work maybe placed otherwise (prefill
    rates are learnt anew): the first rows stay, as per-row inserts that did nothing kept
    them; rows the first did not have, in other intervals, are added."""
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    try:
        await ledger.append([_request("a")], {"e0": [_work("a", 10, 1.0), _work("a", 11, 2.0)]})
        # as an older release wrote them: per row
        await ledger._transaction([(sql.INSERT_WORK, [EngineWork(*_work("b", 11, 4.0), "e0")])])
        await ledger.append([_request("a"), _request("b")],
                            {"e0": [_work("a", 11, 3.0), _work("a", 12, 3.0),
                                    _work("b", 11, 5.0), _work("b", 11, 6.0)]})
        got = await ledger.snapshot("e0", [(10, 12)])
        assert sorted(w.row for w in got.rows) == sorted(map(WorkRow._make, [
            _work("a", 10, 1.0), _work("a", 11, 2.0), _work("a", 12, 3.0), _work("b", 11, 4.0)]))
        assert got.versions == {10: 1, 11: 2, 12: 1}  # each append bumped what it wrote
    finally:
        await ledger.close()


def test_packs_keep_each_intervals_rows_in_the_order_given() -> None:
    rows = [_work("a", 11, 1.0), _work("a", 10, 2.0), _work("b", 11, 3.0), _work("a", 11, 4.0)]
    params = pack_params({"e0": rows})
    assert [(p[0], p[1], p[4]) for p in params] == [("e0", 10, 1), ("e0", 11, 3)]
    got = unpack([], [(p[5],) for p in params])
    assert got == [WorkRow._make(rows[1]), WorkRow._make(rows[0]), WorkRow._make(rows[2])]


async def test_a_v10_ledger_half_way_through_a_run_is_finished_with_the_same_bills(
        tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    shutil.copy(FIXTURES / "ledger_v10.db", path)
    want: dict[str, Any] = orjson.loads((FIXTURES / "ledger_v10.json").read_bytes())
    legacy = await _count(path, "work")
    assert legacy > 0  # per-row work the version 10 code wrote and had not apportioned
    got = await second_half(SqliteLedger(path))
    assert await _count(path, "work_packs") > 0
    for bills in (got, want):  # which process wrote a request is no bill (its pid)
        for detail in bills["requests"].values():
            if detail is not None:
                detail.pop("replica")
    for key in ("shares", "intervals", "requests", "reports", "tenant_hours"):
        same(orjson.loads(orjson.dumps(got[key])), want[key], key)
    # conservation: per interval, the shares plus idle and failed are the energy
    by_interval: dict[int, float] = {}
    for share in got["shares"]:
        by_interval[share[2]] = by_interval.get(share[2], 0.0) + share[5]
    for k, energy, idle, failed in got["intervals"]:
        assert by_interval.get(k, 0.0) + idle + failed == pytest.approx(energy, rel=1e-9)


async def _count(path: Path, table: str) -> int:
    ledger = SqliteLedger(path)
    await ledger.open()
    try:
        return int((await ledger._fetch(f"SELECT COUNT(*) FROM {table}", ()))[0][0])
    finally:
        await ledger.close()
