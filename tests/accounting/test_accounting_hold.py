"""The apportioner waits for requests in flight over an interval (every replica's watermark)
instead of apportioning the interval again each time one of them finishes; a stuck request or
a replica that went silent holds it back for a bounded time only."""

from __future__ import annotations

import asyncio
import logging
import math
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from accounting.apportioner import REPLICA_STALE_S
from accounting.ledger.base import LedgerError, Watermark
from accounting.ledger.sqlite import SqliteLedger
from accounting.recorder import INGEST_SLICES
from accounting.service import AccountingService, EngineInfo
from core.records import RequestRecord
from tests.accounting.test_accounting_accuracy import T0_WALL, EngineRun, run_engine
from tests.accounting.test_ledger_sqlite import (
    Clock,
    ReplayMeter,
    conservation,
    drive,
    make_config,
    truth_energy_at,
)


class OpenRequests:
    """What the proxy tells the service: the arrival of the oldest request of the run that
    has arrived by the clock's time and not yet finished."""

    def __init__(self, run: EngineRun, clock: Clock):
        self._recs = sorted(run.records, key=lambda r: r.arrived_wall_s)
        self._clock = clock

    def __call__(self) -> float | None:
        now = self._clock()
        for r in self._recs:
            if r.arrived_wall_s > now:
                return None
            if r.wall(r.finished_s) > now:
                return r.arrived_wall_s
        return None


def service(path: Path, run: EngineRun, clock: Clock, registry: CollectorRegistry,
            **kw: Any) -> AccountingService:
    cfg = make_config()
    if kw:
        from dataclasses import replace

        cfg = replace(cfg, **kw)
    return AccountingService(cfg, [EngineInfo("e0", "m", "bf16", 1)],
                             ledger=SqliteLedger(path), clock=clock, registry=registry,
                             meters={"e0": ReplayMeter(run.readings, clock)})


def revised(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("wattgate_accounting_revised_intervals_total",
                                     {"engine": "e0"}) or 0.0


async def books(tmp_path: Path, name: str, run: EngineRun, *, watch: bool
                ) -> tuple[float, AccountingService, CollectorRegistry]:
    clock = Clock(T0_WALL)
    registry = CollectorRegistry()
    svc = service(tmp_path / name, run, clock, registry)
    if watch:
        svc.watch(OpenRequests(run, clock))
    await svc.ledger.open()
    # Until 5 s after the last reading: every interval apportioned, every request final.
    await drive(svc, run, clock, run.readings[-1][0] + 5.0)
    return revised(registry), svc, registry


@pytest.mark.timeout(120)
async def test_requests_in_flight_hold_their_intervals_so_none_is_apportioned_twice(
        tmp_path: Path) -> None:
    # Outputs of up to 400 tokens at 25 ms a step: streams of several seconds, longer than
    # settle_s, so without the hold their intervals are apportioned before they finish.
    run = run_engine(41, duration_s=20.0)
    assert max(r.finished_s - r.arrived_s for r in run.records) > 3 * 2.0
    without, svc0, _ = await books(tmp_path, "a.db", run, watch=False)
    held, svc1, _ = await books(tmp_path, "b.db", run, watch=True)
    assert without > 10  # the case the hold exists for
    assert held == 0
    # The same books either way: every request final, energy conserved per interval, the
    # same interval energies and the same shares up to rounding.
    for svc in (svc0, svc1):
        intervals_j, shares_idle_j, boundary_j, _ = await conservation(svc.ledger)
        assert shares_idle_j == pytest.approx(intervals_j, rel=1e-9)
        state = (await svc.ledger.states())["e0"]
        assert boundary_j == pytest.approx(truth_energy_at(run, state.boundary_s), rel=1e-9)
    for rec in run.records[::7]:
        a = await svc0.ledger.request(rec.request_id)
        b = await svc1.ledger.request(rec.request_id)
        assert a is not None and b is not None and a["final"] and b["final"]
        assert b["energy_j"] == pytest.approx(a["energy_j"], rel=1e-9, abs=1e-9)
    await svc0.stop()
    await svc1.stop()


@pytest.mark.timeout(60)
async def test_a_request_open_longer_than_hold_s_holds_no_longer(tmp_path: Path) -> None:
    run = run_engine(42, duration_s=20.0)
    clock = Clock(T0_WALL)
    registry = CollectorRegistry()
    svc = service(tmp_path / "l.db", run, clock, registry, hold_s=4.0)
    stuck = T0_WALL + 1.0  # a request that arrived then and never ends
    svc.watch(lambda: stuck)
    await svc.ledger.open()
    await drive(svc, run, clock, T0_WALL + 12.0)
    state = (await svc.ledger.states())["e0"]
    # Apportioned up to hold_s before now (not settle_s: the hold is the tighter bound).
    assert state.boundary_s == math.floor(clock.t - 4.0)
    assert registry.get_sample_value("wattgate_accounting_held_seconds") == pytest.approx(2.0)
    svc.watch(lambda: None)  # it ended (and was recorded)
    clock.t += 0.5
    await svc.step()
    assert (await svc.ledger.states())["e0"].boundary_s == math.floor(clock.t - 2.0)
    await svc.stop()


@pytest.mark.timeout(60)
async def test_hold_s_zero_apportions_on_settle_alone(tmp_path: Path) -> None:
    run = run_engine(43, duration_s=20.0)
    clock = Clock(T0_WALL)
    svc = service(tmp_path / "l.db", run, clock, CollectorRegistry(), hold_s=0.0)
    svc.watch(lambda: T0_WALL + 1.0)
    await svc.ledger.open()
    await drive(svc, run, clock, T0_WALL + 10.0)
    assert (await svc.ledger.states())["e0"].boundary_s == math.floor(clock.t - 2.0)
    await svc.stop()


@pytest.mark.timeout(60)
async def test_another_replicas_watermark_holds_until_it_goes_silent(tmp_path: Path) -> None:
    """Replicas share the ledger: one that has a request open holds the apportioner back, one
    not heard from for REPLICA_STALE_S (killed) no longer does, and one that stops cleanly
    releases its hold at once."""
    run = run_engine(44, duration_s=30.0)
    clock = Clock(T0_WALL)
    svc = service(tmp_path / "l.db", run, clock, CollectorRegistry())
    other = SqliteLedger(tmp_path / "l.db")
    await svc.ledger.open()
    await other.open()
    since = T0_WALL + 3.0
    await other.append([], [], Watermark("other:1", since, T0_WALL + 5.0))
    await drive(svc, run, clock, T0_WALL + 5.0 + REPLICA_STALE_S - 1.0)
    assert (await svc.ledger.states())["e0"].boundary_s == math.floor(since)
    await drive(svc, run, clock, T0_WALL + 5.0 + REPLICA_STALE_S + 1.0)
    assert (await svc.ledger.states())["e0"].boundary_s == math.floor(clock.t - 2.0)
    # Heard from again, with a request open since just after what is apportioned: held again.
    before = (await svc.ledger.states())["e0"].boundary_s
    await other.append([], [], Watermark("other:1", before + 0.5, clock.t))
    await drive(svc, run, clock, clock.t + 3.0)
    assert (await svc.ledger.states())["e0"].boundary_s == before
    await other.append([], [], Watermark("other:1", None, clock.t))
    await drive(svc, run, clock, clock.t + 1.0)
    assert (await svc.ledger.states())["e0"].boundary_s == math.floor(clock.t - 2.0)
    assert await svc.ledger.open_since(clock.t - REPLICA_STALE_S) is None
    await other.close()
    await svc.stop()


def _record(i: int, t: float) -> RequestRecord:
    from core.timing import Latency

    return RequestRecord(
        request_id=f"r{i}", tenant="t", model="m", engine="e0", precision="bf16",
        slo_class="d", status="ok", http_status=200, stream=False, arrived_wall_s=t,
        arrived_s=t, dispatched_s=t, first_byte_s=None, first_token_s=None, finished_s=t + 0.1,
        read_times=(), read_events=(), prompt_tokens=8, completion_tokens=8, attempts=1,
        latency=Latency(None, None, None, (), ()), slo_met=True)


@pytest.mark.timeout(60)
async def test_the_watermark_counts_records_not_yet_written(tmp_path: Path) -> None:
    """A request recorded after the rows of a flush were taken is not in that flush: the
    watermark published with it must still cover it."""
    clock = Clock(T0_WALL + 50.0)
    run = run_engine(45, duration_s=2.0)
    svc = service(tmp_path / "l.db", run, clock, CollectorRegistry())
    await svc.ledger.open()
    svc.record(_record(1, T0_WALL + 40.0))
    svc.ingest()
    svc.record(_record(2, T0_WALL + 45.0))  # recorded, not yet ingested
    await svc.flush()
    assert await svc.ledger.open_since(T0_WALL) == T0_WALL + 45.0
    svc.ingest()
    await svc.flush()
    assert await svc.ledger.open_since(T0_WALL) is None
    await svc.stop()


async def _service_with_records(db: Path, n: int, spacing_s: float) -> AccountingService:
    """An open service holding `n` recorded requests not yet ingested."""
    svc = service(db, run_engine(46, duration_s=2.0), Clock(T0_WALL + 50.0), CollectorRegistry())
    await svc.ledger.open()
    for i in range(n):
        svc.record(_record(i, T0_WALL + 40.0 + i * spacing_s))
    return svc


@pytest.mark.timeout(60)
async def test_stopping_in_the_middle_of_an_ingest_loses_no_record(tmp_path: Path) -> None:
    svc = await _service_with_records(tmp_path / "l.db", 200, 0.01)
    task = asyncio.create_task(svc.ingest_chunked(chunk=16))
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert svc.recorder is not None
    assert 0 < svc.recorder.unwritten < 200  # stopped half way
    await svc.stop()
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    for i in (0, 100, 199):
        assert await ledger.request(f"r{i}") is not None
    await ledger.close()


@pytest.mark.timeout(60)
async def test_a_backlog_is_ingested_within_a_bounded_number_of_loop_turns(
        tmp_path: Path) -> None:
    """On a saturated gateway every loop turn lasts milliseconds: a backlog of records must not
    take one turn per 32 records (the ledger then lagged the requests by seconds)."""
    svc = await _service_with_records(tmp_path / "l.db", 2000, 0.001)
    task = asyncio.create_task(svc.ingest_chunked())
    turns = 0
    while not task.done():
        await asyncio.sleep(0)
        turns += 1
    await task
    assert svc.recorder is not None and svc.recorder.unwritten == 2000
    assert turns <= INGEST_SLICES + 1  # 2000 records in 32-record chunks took 63
    await svc.stop()


class _UnwritableLedger(SqliteLedger):
    async def append(self, *args: object, **kw: object) -> None:
        raise LedgerError("disk I/O error")


@pytest.mark.timeout(60)
async def test_stopping_with_an_unwritable_ledger_says_how_many_records_are_lost(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(T0_WALL + 50.0)
    run = run_engine(47, duration_s=2.0)
    svc = AccountingService(make_config(), [EngineInfo("e0", "m", "bf16", 1)],
                            ledger=_UnwritableLedger(tmp_path / "l.db"), clock=clock,
                            meters={"e0": ReplayMeter(run.readings, clock)})
    await svc.ledger.open()
    for i in range(3):
        svc.record(_record(i, T0_WALL + 40.0))
    with caplog.at_level(logging.ERROR, logger="wattgate.accounting"):
        await svc.stop()
    assert "stopping with 3 request records not written to the ledger: disk I/O error" in (
        caplog.text)
