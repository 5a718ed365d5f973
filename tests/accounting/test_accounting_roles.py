"""Accounting split by role over one ledger: a recorder-only gateway (its apportioner runs in
another process) and an apportioner-only process give the books of one inline service, and the
gateway learns the apportioned boundaries from the ledger."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from accounting.ledger.sqlite import SqliteLedger
from accounting.mode import APPORTIONER_ONLY, RECORDER_ONLY
from accounting.service import AccountingService, EngineInfo
from tests.accounting.test_accounting_accuracy import T0_WALL, run_engine
from tests.accounting.test_ledger_sqlite import Clock, ReplayMeter, conservation, make_config

ENGINES = [EngineInfo("e0", "m", "bf16", 1)]


@pytest.mark.timeout(60)
async def test_recorder_and_apportioner_processes_keep_the_books_of_one_service(
        tmp_path: Path) -> None:
    run = run_engine(17, duration_s=10.0)
    clock = Clock(T0_WALL)
    path = tmp_path / "l.db"
    gateway = AccountingService(make_config(), ENGINES, ledger=SqliteLedger(path), clock=clock,
                                mode=RECORDER_ONLY)
    apportioner = AccountingService(make_config(), ENGINES, ledger=SqliteLedger(path),
                                    meters={"e0": ReplayMeter(run.readings, clock)},
                                    clock=clock, mode=APPORTIONER_ONLY)
    # the gateway polls no meter and apportions nothing
    assert gateway.poller is None and gateway.apportioner is None and not gateway.engines
    assert apportioner.recorder is None
    await gateway.ledger.open()
    await apportioner.ledger.open()
    recs = sorted(run.records, key=lambda r: r.wall(r.finished_s))
    i = 0
    while clock.t < run.readings[-1][0]:
        clock.t += 0.25
        while i < len(recs) and recs[i].wall(recs[i].finished_s) <= clock.t:
            gateway.record(recs[i])
            i += 1
        await gateway.step()
        await apportioner.step()
    assert apportioner.is_apportioner and not gateway.is_apportioner
    intervals_j, shares_idle_j, boundary_j, n = await conservation(apportioner.ledger)
    assert n > 5 and shares_idle_j == pytest.approx(intervals_j, rel=1e-12)
    assert boundary_j - run.readings[0][1] == pytest.approx(intervals_j, rel=1e-9)
    final = [await apportioner.ledger.request(r.request_id) for r in recs[:20]]
    assert all(f is not None and f["energy_j"] > 0.0 for f in final)
    # the gateway's routing models see the apportioner's boundary, read from the ledger
    clock.t += 1.0
    await gateway.step()
    assert gateway.boundary("e0") == apportioner.boundary("e0") is not None
    assert gateway.energy_check() is None and apportioner.energy_check() is not None
    assert gateway.estimated("e0") is False
    await gateway.stop()
    await apportioner.stop()


@pytest.mark.timeout(60)
async def test_a_request_not_yet_written_is_shown_pending_by_the_recorder(
        tmp_path: Path) -> None:
    run = run_engine(3, duration_s=2.0)
    gateway = AccountingService(make_config(), ENGINES, ledger=SqliteLedger(tmp_path / "l.db"),
                                mode=RECORDER_ONLY)
    rec = run.records[0]
    gateway.record(rec)
    got = gateway.pending_request(rec.request_id)
    assert got is not None and got["final"] is False and got["energy_j"] == 0.0
    assert math.isclose(got["finished_s"], rec.wall(rec.finished_s))
    # the fields of a written request's detail, as far as they are known before apportioning
    assert (got["outcome"], got["http_status"], got["failed_energy_j"]) == (
        rec.outcome, rec.http_status, 0.0)
    assert gateway.pending_request("no-such-id") is None
