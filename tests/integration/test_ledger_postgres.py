"""The ledger on a real PostgreSQL server: service conservation, one apportioner by advisory
lock, and the same report from SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from accounting.ledger.base import EngineState, Ledger, Watermark, engine_work
from accounting.ledger.postgres import PostgresLedger
from accounting.ledger.sql import MIGRATIONS
from accounting.ledger.sqlite import SqliteLedger
from accounting.report import build_report, render
from accounting.work import WorkRow
from core.vocab import FailedEnergy
from tests.accounting.test_accounting_accuracy import T0_WALL, run_engine
from tests.accounting.test_ledger_failed import check_books, serve
from tests.accounting.test_ledger_sqlite import Clock, conservation, drive, make_service
from tests.support.postgres import fresh_database

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]
_names = itertools.count()


async def _ledger(pg: str) -> PostgresLedger:
    ledger = PostgresLedger(await fresh_database(pg, f"t{next(_names)}"))
    await ledger.open()
    return ledger


async def test_service_on_postgres_conserves_energy(pg: str) -> None:
    run = run_engine(11, duration_s=15.0)
    clock = Clock(T0_WALL)
    svc = make_service(await _ledger(pg), run, clock)
    await drive(svc, run, clock, run.readings[-1][0])
    intervals_j, shares_idle_j, _, n = await conservation(svc.ledger)
    assert n >= 15
    assert shares_idle_j == pytest.approx(intervals_j, rel=1e-9)
    rid = run.records[0].request_id
    got = await svc.ledger.request(rid)
    assert got is not None and got["final"]
    assert got["energy_j"] == pytest.approx(run.truth_j[rid], rel=0.15)
    await svc.stop()


@pytest.mark.parametrize("setting", ["failed_account", "tenant"])
async def test_failed_requests_on_postgres_keep_meters_equal_tenants_idle_failed(
        pg: str, tmp_path: Path, setting: FailedEnergy) -> None:
    """The faulty run of tests/accounting/test_ledger_failed.py on PostgreSQL: the same books."""
    svc, _, kinds = await serve(tmp_path, setting, await _ledger(pg))
    await check_books(svc, kinds, setting)


async def test_advisory_lock_admits_exactly_one_apportioner(pg: str) -> None:
    a = await _ledger(pg)
    b = PostgresLedger(a._dsn)
    await b.open()
    assert await a.acquire_apportioner()
    assert await a.acquire_apportioner()  # re-entrant for the holder
    assert not await b.acquire_apportioner()
    await a.close()  # the holder goes away: its session ends and the lock is free
    assert await b.acquire_apportioner()
    await b.close()


async def test_migrations_are_idempotent_and_versioned(pg: str) -> None:
    a = await _ledger(pg)
    b = PostgresLedger(a._dsn)
    await b.open()  # a second replica starting on a migrated schema changes nothing
    rows = await b._fetch("SELECT version FROM schema_version ORDER BY version", ())
    assert rows == [(version,) for version, _ in MIGRATIONS]  # each applied exactly once
    await a.close()
    await b.close()


async def test_replica_watermarks_on_postgres(pg: str) -> None:
    """Each replica's watermark is one row, replaced by its next; the earliest of the replicas
    heard from recently holds, a silent one does not, and None holds nothing."""
    a = await _ledger(pg)
    b = PostgresLedger(a._dsn)
    await b.open()
    assert await a.open_since(0.0) is None
    await a.append([], [], Watermark("a:1", 100.0, 200.0))
    await b.append([], [], Watermark("b:1", 150.0, 210.0))
    assert await b.open_since(190.0) == 100.0
    assert await b.open_since(205.0) == 150.0  # a not heard from since 200
    await a.append([], [], Watermark("a:1", None, 220.0))
    assert await b.open_since(190.0) == 150.0
    await b.append([], [], Watermark("b:1", 180.0, 230.0))
    assert await a.open_since(190.0) == 180.0
    assert (await a._fetch("SELECT COUNT(*) FROM replicas", ()))[0][0] == 2
    await a.close()
    await b.close()


async def test_work_written_after_the_apportioners_read_keeps_its_interval_dirty(
        pg: str) -> None:
    a = await _ledger(pg)
    first = WorkRow("r1", 7, 10.0, 2.0, 0.5, 0.0, 20.0)
    await a.append([], engine_work("e0", [first]))
    snap = await a.snapshot("e0", [(5, 9)])
    assert [p.row for p in snap.rows] == [first] and snap.versions == {7: 1}
    late = WorkRow("r2", 7, 0.0, 1.0, 0.2, 0.1, 3.0)
    await a.append([], engine_work("e0", [late]))  # between the read and the commit
    await a.commit("e0", [], [], [(7, 1)], EngineState("e0", 8, 8.0, 0.0))
    assert await a.dirty("e0", 8) == [7]
    snap = await a.snapshot("e0", [(7, 7)])
    assert snap.versions == {7: 2} and {p.row for p in snap.rows} == {first, late}
    await a.commit("e0", [], [], [(7, 2)], None)
    assert await a.dirty("e0", 8) == []
    await a.close()


async def test_report_from_sqlite_and_postgres_agrees(pg: str, tmp_path: Path) -> None:
    run = run_engine(12, duration_s=20.0)
    reports = []
    ledgers: list[Ledger] = [SqliteLedger(tmp_path / "l.db"),
                             PostgresLedger(await fresh_database(pg, "agree"))]
    for ledger in ledgers:
        clock = Clock(T0_WALL)
        svc = make_service(ledger, run, clock)
        await ledger.open()
        await drive(svc, run, clock, run.readings[-1][0])
        for group_by in (["tenant"], ["tenant", "hour"], ["engine", "precision", "model"]):
            data = await ledger.usage(T0_WALL, T0_WALL + 600, None)
            reports.append(build_report(data, group_by, T0_WALL, T0_WALL + 600))
        tenant_only = await ledger.usage(T0_WALL, T0_WALL + 600, "t1")
        reports.append(build_report(tenant_only, ["tenant"], T0_WALL, T0_WALL + 600))
        await svc.stop()
    half = len(reports) // 2
    for lite, post in zip(reports[:half], reports[half:], strict=True):
        assert len(lite.rows) == len(post.rows)
        for a, b in zip([*lite.rows, lite.total], [*post.rows, post.total], strict=True):
            assert a.keys() == b.keys()
            for k, v in a.items():
                if isinstance(v, float):
                    assert b[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
                else:
                    assert b[k] == v, k
    assert render(reports[0], "csv").count("\n") == len(reports[0].rows) + 2
    assert math.isclose(reports[0].total["energy_j"], reports[half].total["energy_j"],
                        rel_tol=1e-9)


@pytest.mark.slow
async def test_ten_minute_day_bills_sum_to_meters_on_both_stores(pg: str, tmp_path: Path) -> None:
    """A 10-minute simulated day: tenants' bills plus idle equal the metered energy, and the
    report by tenant and hour is the same from SQLite and PostgreSQL."""
    run = run_engine(13, duration_s=600.0, rate=3.0)
    reports = []
    for ledger in (SqliteLedger(tmp_path / "day.db"),
                   PostgresLedger(await fresh_database(pg, "day"))):
        clock = Clock(T0_WALL)
        svc = make_service(ledger, run, clock)
        await ledger.open()
        await drive(svc, run, clock, run.readings[-1][0], step_s=0.5)
        intervals_j, shares_idle_j, _, n = await conservation(ledger)
        assert n >= 600
        assert shares_idle_j == pytest.approx(intervals_j, rel=1e-9)
        data = await ledger.usage(T0_WALL, T0_WALL + 3600, None)
        report = build_report(data, ["tenant", "hour"], T0_WALL, T0_WALL + 3600)
        tenants = math.fsum(r["energy_j"] for r in report.rows if r["account"] == "requests")
        idle = math.fsum(r["energy_j"] for r in report.rows if r["account"] == "idle")
        assert tenants + idle == pytest.approx(intervals_j, rel=1e-9)
        assert idle > 0.0 and tenants > 0.0
        reports.append(report)
        await svc.stop()
    lite, post = reports
    print("\n" + render(lite, "table"))
    assert [r["tenant"] for r in lite.rows] == [r["tenant"] for r in post.rows]
    for a, b in zip([*lite.rows, lite.total], [*post.rows, post.total], strict=True):
        for k, v in a.items():
            assert b[k] == (pytest.approx(v, rel=1e-9, abs=1e-12) if isinstance(v, float) else v)


async def test_a_version_2_ledger_migrates_with_the_span_of_each_requests_work(
        pg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Version 3 on a ledger in use: existing requests get the span of their work, the index
    of shares by request goes, and a request's totals are still exactly its shares."""
    from accounting.ledger import sql

    monkeypatch.setattr(sql, "MIGRATIONS", MIGRATIONS[:2])
    old = await _ledger(pg)
    await old._transaction([
        ("INSERT INTO requests (request_id, tenant, model, engine, precision, slo_class, status, "
         "stream, arrived_s, finished_s, finished_hour, prompt_tokens, completion_tokens, "
         "slo_met, last_interval, replica) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
         [("r0", "t", "m", "e0", "bf16", "d", "ok", 1, 10.0, 11.5, 0, 5, 6, 1, 11, "x"),
          ("r1", "t", "m", "e0", "bf16", "d", "ok", 1, 12.0, 12.5, 0, 5, 6, 1, 12, "x")]),
        # the work table's columns at version 2 (sql.INSERT_WORK names later ones)
        ("INSERT INTO work (request_id, interval_idx, prefill, decode, residency_s, start_s, "
         "kv, engine, apportioned) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
         [("r0", 10, 5.0, 1.0, 1.0, 0.0, 2.0, "e0"),
          ("r0", 13, 0.0, 1.0, 0.0, 0.0, 2.0, "e0"),  # stamped after finish
          ("r1", 12, 5.0, 1.0, 0.5, 0.0, 2.0, "e0")]),
        ("INSERT INTO shares (request_id, engine, interval_idx, start_s, hour_idx, energy_j, "
         "static_j, dynamic_j, gpu_s, carbon_g, cost_usd, estimated) "
         "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
         [("r0", "e0", 10, 10.0, 0, 2.5, 1.0, 1.5, 0.5, 1e-3, 1e-5, 0),
                            ("r0", "e0", 13, 13.0, 0, 0.25, 0.0, 0.25, 0.0, 1e-4, 1e-6, 0),
                            ("r1", "e0", 12, 12.0, 0, 7.0, 1.0, 6.0, 0.5, 1e-3, 1e-5, 0)]),
    ])
    await old.close()
    monkeypatch.setattr(sql, "MIGRATIONS", MIGRATIONS)
    new = PostgresLedger(old._dsn)
    await new.open()
    rows = await new._fetch("SELECT version FROM schema_version ORDER BY version", ())
    assert rows == [(version,) for version, _ in MIGRATIONS]
    assert not await new._fetch("SELECT 1 FROM pg_indexes WHERE indexname = 'shares_request'", ())
    r0, r1 = await new.request("r0"), await new.request("r1")
    assert r0 is not None and r1 is not None
    assert (r0["first_interval"], r0["last_interval"], r0["intervals"]) == (10, 13, 2)
    assert r0["energy_j"] == pytest.approx(2.75, rel=1e-12)
    assert (r1["first_interval"], r1["last_interval"], r1["energy_j"]) == (12, 12, 7.0)
    # version 9: an old request's class from its status, nothing in the failed account
    assert (r0["outcome"], r0["http_status"], r0["failed_energy_j"]) == ("served", None, 0.0)
    await new.close()
