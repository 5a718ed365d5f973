"""The accounting service on a real SQLite ledger: conservation, accuracy, restart, one
apportioner per file, late records, and the chargeback report."""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
import sqlite3
import statistics
from collections.abc import Sequence
from pathlib import Path

import pytest

from accounting.coefficients import Coefficients
from accounting.config import AccountingConfig, EngineMeterConfig
from accounting.ledger import sql
from accounting.ledger.base import (
    EngineState,
    EngineWork,
    Ledger,
    RequestRow,
    ShareRow,
    engine_work,
)
from accounting.ledger.sqlite import SqliteLedger
from accounting.metering import MeteredEngine
from accounting.report import IDLE_TENANT, build_report
from accounting.service import AccountingService, EngineInfo
from accounting.work import WorkRow, interval_index, work_rows
from engines.meters.base import EnergyReading
from engines.meters.registry import MeterSpec
from tests.accounting.test_accounting_accuracy import T0_WALL, EngineRun, run_engine

IDLE_W = 90.0


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class ReplayMeter:
    """Serves a run's recorded counter as it stood at the clock's time."""

    kind = "replay"
    estimated = False

    def __init__(self, readings: Sequence[tuple[float, float]], clock: Clock):
        self._t = [r[0] for r in readings]
        self._e = [r[1] for r in readings]
        self._clock = clock

    async def read(self) -> EnergyReading:
        i = max(0, bisect.bisect_right(self._t, self._clock()) - 1)
        return EnergyReading(self._t[i], (self._e[i],))

    async def close(self) -> None:
        return None


def make_config(**kw: float) -> AccountingConfig:
    meter = EngineMeterConfig(MeterSpec(kind="sim"), idle_power_w=IDLE_W,
                              coefficients=Coefficients(0.004 / 0.12, 1.0))
    return AccountingConfig(interval_s=1.0, flush_s=0.5, settle_s=kw.get("settle_s", 2.0),
                            meters=(("e0", meter),))


def make_service(ledger: Ledger, run: EngineRun, clock: Clock, **kw: float) -> AccountingService:
    return AccountingService(make_config(**kw), [EngineInfo("e0", "m", "bf16", 1)],
                             ledger=ledger, meters={"e0": ReplayMeter(run.readings, clock)},
                             clock=clock)


async def drive(svc: AccountingService, run: EngineRun, clock: Clock, until_s: float,
                *, step_s: float = 0.25, hold: frozenset[str] = frozenset()) -> None:
    """Advance the clock, hand records over as requests finish, run the service's steps."""
    recs = sorted((r for r in run.records if r.request_id not in hold),
                  key=lambda r: r.wall(r.finished_s))
    i = 0
    while clock.t < until_s:
        clock.t += step_s
        while i < len(recs) and recs[i].wall(recs[i].finished_s) <= clock.t:
            if recs[i].wall(recs[i].finished_s) > clock.t - 10 * step_s:
                svc.record(recs[i])
            i += 1
        await svc.step()


async def conservation(ledger: Ledger, engine: str = "e0") -> tuple[float, float, float, int]:
    """(sum of interval energy, sum of shares + idle, metered boundary delta, intervals)."""
    state = (await ledger.states())[engine]
    first = interval_index(T0_WALL, 1.0)  # the engine's first reading is at T0_WALL
    intervals = await ledger.intervals(engine, list(range(first, state.next_interval)))
    usage = await ledger.usage(0.0, 1e12, None)
    shares = math.fsum(r[5] for r in usage.energy)
    idle = math.fsum(r[4] for r in usage.idle)
    return (math.fsum(i.energy_j for i in intervals), shares + idle,
            state.boundary_j, len(intervals))


def truth_energy_at(run: EngineRun, t: float) -> float:
    ts = [r[0] for r in run.readings]
    i = bisect.bisect_left(ts, t)
    if i == 0:
        return run.readings[0][1]
    (t0, e0), (t1, e1) = run.readings[i - 1], run.readings[i]
    return e0 + (e1 - e0) * (t - t0) / (t1 - t0)


@pytest.mark.timeout(60)
async def test_service_on_sqlite_conserves_energy_and_matches_truth(tmp_path: Path) -> None:
    run = run_engine(5, duration_s=30.0)
    clock = Clock(T0_WALL)
    svc = make_service(SqliteLedger(tmp_path / "l.db"), run, clock)
    await svc.ledger.open()
    end = run.readings[-1][0]
    await drive(svc, run, clock, end)
    intervals_j, shares_idle_j, boundary_j, n = await conservation(svc.ledger)
    first_boundary = interval_index(T0_WALL, 1.0) * 1.0
    assert shares_idle_j == pytest.approx(intervals_j, rel=1e-9)
    assert intervals_j == pytest.approx(boundary_j - truth_energy_at(run, first_boundary), rel=1e-9)
    assert n >= 30
    errs = []
    for rid, truth in run.truth_j.items():
        got = await svc.ledger.request(rid)
        assert got is not None and got["final"] and not got["estimated"]
        errs.append(abs(got["energy_j"] - truth) / truth)
    assert statistics.median(errs) <= 0.05
    await svc.stop()


@pytest.mark.timeout(60)
async def test_restart_resumes_where_apportioning_stopped(tmp_path: Path) -> None:
    """Stop half way, start a new service on the same file: every interval exactly once."""
    run = run_engine(6, duration_s=20.0)
    clock = Clock(T0_WALL)
    svc = make_service(SqliteLedger(tmp_path / "l.db"), run, clock)
    await svc.ledger.open()
    await drive(svc, run, clock, T0_WALL + 10.0)
    await svc.stop()
    stopped_at = (await _states(tmp_path / "l.db"))["e0"].next_interval
    clock.t += 3.0  # down for a while: the meter keeps counting
    svc2 = make_service(SqliteLedger(tmp_path / "l.db"), run, clock)
    await svc2.ledger.open()
    await drive(svc2, run, clock, run.readings[-1][0])
    intervals_j, shares_idle_j, boundary_j, n = await conservation(svc2.ledger)
    state = (await svc2.ledger.states())["e0"]
    first = interval_index(T0_WALL, 1.0)
    assert n == state.next_interval - first > stopped_at - first
    assert shares_idle_j == pytest.approx(intervals_j, rel=1e-9)
    assert intervals_j == pytest.approx(boundary_j - truth_energy_at(run, first * 1.0), rel=1e-9)
    await svc2.stop()


async def _states(path: Path) -> dict[str, EngineState]:
    ledger = SqliteLedger(path)
    await ledger.open()
    try:
        return dict(await ledger.states())
    finally:
        await ledger.close()


async def test_only_one_apportioner_per_sqlite_file(tmp_path: Path) -> None:
    a, b = SqliteLedger(tmp_path / "l.db"), SqliteLedger(tmp_path / "l.db")
    await a.open()
    await b.open()
    assert await a.acquire_apportioner()
    assert not await b.acquire_apportioner()
    await a.release_apportioner()
    assert await b.acquire_apportioner()
    await a.close()
    await b.close()


@pytest.mark.timeout(60)
async def test_late_record_revises_its_intervals_and_keeps_conservation(tmp_path: Path) -> None:
    run = run_engine(7, duration_s=15.0)
    late = max(run.records, key=lambda r: r.finished_s - r.arrived_s)
    clock = Clock(T0_WALL)
    svc = make_service(SqliteLedger(tmp_path / "l.db"), run, clock)
    await svc.ledger.open()
    await drive(svc, run, clock, run.readings[-1][0], hold=frozenset({late.request_id}))
    svc.record(late)
    await svc.step()
    await svc.flush()
    await svc.step()
    got = await svc.ledger.request(late.request_id)
    assert got is not None and got["final"]
    assert got["energy_j"] == pytest.approx(run.truth_j[late.request_id], rel=0.15)
    intervals_j, shares_idle_j, _, _ = await conservation(svc.ledger)
    assert shares_idle_j == pytest.approx(intervals_j, rel=1e-9)
    await svc.stop()


@pytest.mark.timeout(60)
async def test_report_bills_add_up_to_metered_energy_with_idle_separate(tmp_path: Path) -> None:
    run = run_engine(8, duration_s=20.0)
    clock = Clock(T0_WALL)
    svc = make_service(SqliteLedger(tmp_path / "l.db"), run, clock)
    await svc.ledger.open()
    await drive(svc, run, clock, run.readings[-1][0])
    intervals_j, _, _, _ = await conservation(svc.ledger)
    report = build_report(await svc.ledger.usage(0.0, 1e12, None), ["tenant"], 0.0, 1e12)
    tenants = {r["tenant"]: r for r in report.rows}
    assert set(tenants) == {"t0", "t1", "t2", IDLE_TENANT}
    assert math.fsum(r["energy_j"] for r in report.rows) == pytest.approx(intervals_j, rel=1e-9)
    assert report.total["energy_j"] == pytest.approx(intervals_j, rel=1e-9)
    assert tenants[IDLE_TENANT]["idle_share"] == 1.0
    assert sum(r["requests"] for r in report.rows) == len(run.records)
    for t in ("t0", "t1", "t2"):
        truth = math.fsum(e for rid, e in run.truth_j.items() if run.tenant_of[rid] == t)
        assert tenants[t]["energy_j"] == pytest.approx(truth, rel=0.02)
    await svc.stop()


@pytest.mark.timeout(30)
async def test_request_stays_not_final_while_its_work_is_pending(tmp_path: Path) -> None:
    """A request is final once every interval of its span is apportioned from what was last
    written to it: an interval written to after the apportioner read it stays dirty, so the
    late work is apportioned (a revision) before the request's share is final."""
    run = run_engine(3, duration_s=6.0)
    rec = run.records[0]
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    rows = [WorkRow._make(r) for r in work_rows(rec, 1.0)]
    assert len(rows) >= 2
    await ledger.append([RequestRow.from_record(rec, 1.0, "r1", rows)], engine_work(rec.engine, rows))
    last = interval_index(rec.wall(rec.finished_s), 1.0)
    span = (rows[0].interval_idx, rows[-1].interval_idx)
    state = EngineState(rec.engine, last + 2, (last + 2) * 1.0, 0.0)
    await ledger.commit(rec.engine, [], [], [], state)
    got = await ledger.request(rec.request_id)
    assert got is not None and not got["final"]
    assert await ledger.dirty(rec.engine, last + 2) == [r.interval_idx for r in rows]
    snap = await ledger.snapshot(rec.engine, [span])
    assert [p.row for p in snap.rows] == rows and [p.tenant for p in snap.rows] == [rec.tenant] * len(rows)
    assert snap.versions == {r.interval_idx: 1 for r in rows}
    await ledger.commit(rec.engine, [], [], [(r.interval_idx, 1) for r in rows[:-1]], None)
    got = await ledger.request(rec.request_id)
    assert got is not None and not got["final"]
    # Another request's work lands in the last interval after the apportioner's read: the
    # clean mark for what it read does not take, the interval stays dirty.
    other = WorkRow("other", rows[-1].interval_idx, 1.0, 1.0, 0.1, 0.0, 1.0)
    await ledger.append([], engine_work(rec.engine, [other]))
    await ledger.commit(rec.engine, [], [], [(rows[-1].interval_idx, 1)], None)
    got = await ledger.request(rec.request_id)
    assert got is not None and not got["final"]
    assert await ledger.dirty(rec.engine, last + 2) == [rows[-1].interval_idx]
    snap = await ledger.snapshot(rec.engine, [(rows[-1].interval_idx,) * 2])
    assert snap.versions == {rows[-1].interval_idx: 2} and len(snap.rows) == 2
    await ledger.commit(rec.engine, [], [], [(rows[-1].interval_idx, 2)], None)
    got = await ledger.request(rec.request_id)
    assert got is not None and got["final"] and got["stream"] is rec.stream
    assert await ledger.dirty(rec.engine, last + 2) == []
    await ledger.close()


@pytest.mark.timeout(30)
async def test_first_version_ledger_migrates_and_keeps_its_rows(tmp_path: Path) -> None:
    """A ledger written by schema version 1 opens at the current version with its rows."""
    path = tmp_path / "l.db"
    conn = sqlite3.connect(path)
    conn.execute(sql.CREATE_VERSION)
    for statement in sql.schema("sqlite")[0][1]:
        conn.execute(statement)
    conn.execute(sql.SET_VERSION, (1,))
    conn.execute("INSERT INTO requests (request_id, tenant, model, engine, precision, slo_class, "
                 "status, stream, arrived_s, finished_s, finished_hour, prompt_tokens, "
                 "completion_tokens, slo_met, last_interval, replica) VALUES "
                 "('r0', 't', 'm', 'e0', 'bf16', 'd', 'ok', 1, 10.0, 11.0, 0, 5, 6, 1, 11, 'x')")
    conn.execute("INSERT INTO work (request_id, engine, interval_idx, prefill, decode, "
                 "residency_s, start_s, kv, apportioned) VALUES "
                 "('r0', 'e0', 11, 5.0, 6.0, 1.0, 0.0, 9.0, 1), "
                 "('r0', 'e0', 13, 0.0, 1.0, 0.0, 0.0, 2.0, 1), "  # a token after the finish
                 "('r2', 'e0', 13, 1.0, 1.0, 0.5, 0.0, 1.0, 0)")  # late, not apportioned yet
    conn.executemany("INSERT INTO shares (request_id, engine, interval_idx, start_s, hour_idx, "
                     "energy_j, static_j, dynamic_j, gpu_s, carbon_g, cost_usd, estimated) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
        ("r0", "e0", 11, 11.0, 0, 2.5, 1.0, 1.5, 0.5, 1e-3, 1e-5, 0),
        ("r0", "e0", 13, 13.0, 0, 0.25, 0.0, 0.25, 0.0, 1e-4, 1e-6, 0),
        ("r1", "e0", 12, 12.0, 0, 7.0, 1.0, 6.0, 0.5, 1e-3, 1e-5, 0)])
    conn.commit()
    conn.close()
    ledger = SqliteLedger(path)
    await ledger.open()
    versions = await ledger._fetch("SELECT version FROM schema_version ORDER BY version", ())
    assert versions == [(v,) for v, _ in sql.MIGRATIONS]
    indexes = await ledger._fetch("SELECT name FROM sqlite_master WHERE tbl_name = 'work' "
                                  "AND type = 'index'", ())
    assert ("work_request",) not in indexes and ("work_pending",) not in indexes
    (table,) = await ledger._fetch("SELECT sql FROM sqlite_master WHERE name = 'work'", ())
    assert "WITHOUT ROWID" in table[0]  # clustered by (engine, interval, request)
    indexes = await ledger._fetch("SELECT name FROM sqlite_master WHERE tbl_name = 'shares' "
                                  "AND type = 'index'", ())
    assert ("shares_request",) not in indexes
    got = await ledger.request("r0")
    assert got is not None and got["tenant"] == "t" and got["slo_met"] is True
    # Version 3 gave the old request the span of its work, so its shares are found by key.
    assert (got["first_interval"], got["last_interval"]) == (11, 13)
    assert (got["intervals"], got["energy_j"]) == (2, 2.75)
    # Version 9: its outcome class from its status, nothing in the failed account.
    assert (got["outcome"], got["http_status"], got["failed_energy_j"]) == ("served", None, 0.0)
    pending = (await ledger.snapshot("e0", [(11, 11)])).rows
    assert [(p.row.request_id, p.row.decode_tokens, p.tenant) for p in pending] == [
        ("r0", 6.0, "t")]
    # Version 5: intervals whose rows were all apportioned are clean, one with a row not yet
    # apportioned is dirty.
    assert await ledger._fetch("SELECT engine, interval_idx, version, dirty FROM work_versions "
                               "ORDER BY interval_idx", ()) == [("e0", 11, 1, 0), ("e0", 13, 1, 1)]
    assert await ledger.dirty("e0", 20) == [13]
    await ledger.close()


def test_pending_work_queries_use_the_dirty_index_not_a_table_scan(tmp_path: Path) -> None:
    """Dirty intervals and a request's pending intervals are found through the small index of
    dirty intervals (a scan would read the engine's whole history)."""
    conn = sqlite3.connect(tmp_path / "l.db")
    for _, statements in sql.schema("sqlite"):
        for statement in statements:
            conn.execute(statement)
    for query, params in ((sql.SELECT_DIRTY, ("e0", 5)),
                          (sql.SELECT_REQUEST_PENDING, ("e0", 3, 9))):
        plan = " ".join(str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + query, params))
        assert "work_dirty" in plan and "SCAN" not in plan, plan
    # A request's shares: one key look-up per interval of its work, no scan of the intervals.
    steps = [str(row[-1]) for row in conn.execute(
        "EXPLAIN QUERY PLAN " + sql.SELECT_REQUEST_TOTALS, (1, 9, "e0", "r"))]
    assert [st for st in steps if st.split()[:2] in (["SEARCH", "s"], ["SCAN", "s"])] == [
        "SEARCH s USING INDEX sqlite_autoindex_shares_1 "
        "(engine=? AND interval_idx=? AND request_id=?)"], steps
    conn.close()


@pytest.mark.timeout(30)
async def test_a_requests_shares_are_found_over_the_span_of_its_work(tmp_path: Path) -> None:
    """The request row keeps the first and last interval of its work (last: the later of its
    finish and its last token, which clock skew can stamp after it); the request's totals are
    the sum of exactly its shares, among other requests' shares in the same intervals."""
    run = run_engine(5, duration_s=20.0)
    recs = [r for r in run.records if len(work_rows(r, 1.0)) > 2][:3]
    assert len(recs) == 3
    skewed = dataclasses.replace(recs[0], read_times=(*recs[0].read_times, recs[0].finished_s + 2.5),
                                 read_events=(*recs[0].read_events, 1))
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    shares: list[ShareRow] = []
    expected: dict[str, tuple[int, float]] = {}
    for j, rec in enumerate([skewed, *recs[1:]]):
        rows = [WorkRow._make(r) for r in work_rows(rec, 1.0)]
        row = RequestRow.from_record(rec, 1.0, "x", rows)
        ks = sorted(r.interval_idx for r in rows)
        assert (row.first_interval, row.last_interval) == (
            ks[0], max(ks[-1], interval_index(rec.wall(rec.finished_s), 1.0)))
        await ledger.append([row], engine_work(rec.engine, rows))
        for w in rows:
            k = w.interval_idx
            shares.append(ShareRow(rec.request_id, rec.engine, k, k * 1.0, 0, 1.0 + j + k / 64,
                                   0.5, 0.5 + j + k / 64, 0.1, 1e-3, 1e-5, 0))
        expected[rec.request_id] = (len(rows), math.fsum(s.energy_j for s in shares
                                                         if s.request_id == rec.request_id))
    assert max(skewed.read_times) > skewed.finished_s
    await ledger.commit(recs[0].engine, [], shares, [], None)
    for rid, (n, energy) in expected.items():
        got = await ledger.request(rid)
        assert got is not None
        assert got["intervals"] == n and got["energy_j"] == pytest.approx(energy, rel=1e-12)
    await ledger.close()


async def test_appended_requests_need_no_tenant_lookup_and_the_cache_stays_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Appending a request primes the tenant cache, so reading its work back asks the ledger
    for no tenant; the cache keeps its bound, and an evicted request's tenant is read again."""
    ledger = SqliteLedger(tmp_path / "l.db")
    ledger._tenant_cache.limit_n = 5  # two generations: at most 10
    await ledger.open()
    queries: list[str] = []
    fetch = ledger._fetch

    async def counting(query: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
        queries.append(query)
        return await fetch(query, params)

    monkeypatch.setattr(ledger, "_fetch", counting)
    for i in range(30):
        row = RequestRow(f"r{i:02d}", f"t{i % 3}", "m", "e0", "bf16", "d", "ok", 1, 10.0 + i,
                         11.0 + i, 0, 5, 6, 1, i, i, "x")
        work = EngineWork(f"r{i:02d}", i, 5.0, 6.0, 0.5, 0.0, 9.0, 0.0, 0.0, "e0")
        await ledger.append([row], [work])
        assert len(ledger._tenant_cache) <= 10
    newest = (await ledger.snapshot("e0", [(25, 29)])).rows
    assert [(p.row.request_id, p.tenant) for p in sorted(newest, key=lambda p: p.row)] == [
        (f"r{i:02d}", f"t{i % 3}") for i in range(25, 30)]
    assert not [q for q in queries if "FROM requests" in q]  # all five were in the cache
    everything = (await ledger.snapshot("e0", [(0, 29)])).rows
    assert sorted((p.row.request_id, p.tenant) for p in everything) == [
        (f"r{i:02d}", f"t{i % 3}") for i in range(30)]  # evicted ones looked up again
    assert [q for q in queries if "FROM requests" in q]
    await ledger.close()


@pytest.mark.timeout(60)
async def test_apportioning_in_small_chunks_gives_the_same_shares(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Busy intervals are read back in chunks and apportioned apart from their booking, with
    the event loop served in between; at a few rows per chunk the shares and tenant counters
    are exactly those of one pass."""
    from accounting import apportioner, plan
    from accounting.ledger import common

    async def shares_and_counters(path: Path) -> tuple[list[tuple[object, ...]],
                                                       dict[str, list[float]]]:
        run = run_engine(5, duration_s=12.0)
        clock = Clock(T0_WALL)
        svc = make_service(SqliteLedger(path), run, clock)
        tenant_new: dict[str, list[float]] = {}
        book = apportioner.Apportioner._after_commit

        def spying(self: apportioner.Apportioner, eng: MeteredEngine, got: plan.Plan) -> None:
            book(self, eng, got)
            for tenant, acc in got.tenants.items():
                tenant_new[tenant] = [acc.energy_j, acc.carbon_g, acc.cost_usd]

        monkeypatch.setattr(apportioner.Apportioner, "_after_commit", spying)
        await svc.ledger.open()
        await drive(svc, run, clock, run.readings[-1][0])
        rows = await svc.ledger._fetch(  # type: ignore[attr-defined]
            "SELECT request_id, interval_idx, energy_j, carbon_g, cost_usd FROM shares "
            "ORDER BY interval_idx, request_id", ())
        await svc.stop()
        return rows, tenant_new

    whole, whole_tenants = await shares_and_counters(tmp_path / "whole.db")
    monkeypatch.setattr(plan, "BUSY_ROWS", 2)
    monkeypatch.setattr(common, "WORK_CHUNK", 3)
    chunked, chunked_tenants = await shares_and_counters(tmp_path / "chunked.db")
    per_interval = collections.Counter(r[1] for r in whole)
    assert max(per_interval.values()) > 3  # the chunked run did split intervals
    assert len(whole) > 50 and chunked == whole
    assert chunked_tenants == whole_tenants and whole_tenants


async def test_a_gateway_counted_prompt_is_flagged_in_the_ledger(tmp_path: Path) -> None:
    run = run_engine(3, duration_s=2.0)
    counted = dataclasses.replace(run.records[0], prompt_source="gateway")
    plain = run.records[1]
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    for rec in (counted, plain):
        rows = work_rows(rec, 1.0)
        await ledger.append([RequestRow.from_record(rec, 1.0, "r1", rows)],
                            engine_work(rec.engine, rows))
    got, other = await ledger.request(counted.request_id), await ledger.request(plain.request_id)
    assert got is not None and got["prompt_source"] == "gateway"
    assert other is not None and other["prompt_source"] == "engine"
    await ledger.close()
