"""The failed account through the accounting service on a real SQLite ledger: a replayed
engine run where some requests failed (an engine that hung before its first token, streams
that stalled after some), some were refused and some cancelled. Under both settings of
`accounting.failed_energy`: meters = tenants + idle + failed in the ledger, the report and
the budgets' hourly charges; by default the failed requests' energy is off their tenants'
bills and in the failed account, with the tenant switch it is on them."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from accounting.ledger.base import Ledger
from accounting.ledger.sqlite import SqliteLedger
from accounting.report import FAILED_TENANT, IDLE_TENANT, build_report
from accounting.service import AccountingService, EngineInfo
from core.records import RequestRecord
from core.vocab import FailedEnergy
from tests.accounting.test_accounting_accuracy import T0_WALL, EngineRun, run_engine
from tests.accounting.test_ledger_sqlite import Clock, ReplayMeter, conservation, drive, make_config

pytestmark = pytest.mark.timeout(90)


def hung(rec: RequestRecord) -> RequestRecord:
    """The engine never sent a token: a 504 after the first-byte timeout."""
    return dataclasses.replace(rec, status="upstream_timeout", http_status=504,
                               first_byte_s=None, first_token_s=None, read_times=(),
                               read_events=(), completion_tokens=0, engine_done_s=None)


def stalled(rec: RequestRecord) -> RequestRecord:
    """The stream stalled after half its token events: an error event after the 200."""
    n = max(1, len(rec.read_times) // 2)
    return dataclasses.replace(rec, status="upstream_timeout", http_status=200,
                               read_times=rec.read_times[:n], read_events=rec.read_events[:n],
                               completion_tokens=sum(rec.read_events[:n]))


def faulty_run() -> tuple[EngineRun, dict[str, str]]:
    """A run with every 6th request hung, every 6th (offset 3) stalled, one refused by the
    gateway and one cancelled; returns it with each changed request's kind."""
    run = run_engine(11, duration_s=20.0)
    kinds: dict[str, str] = {}
    recs = []
    for i, rec in enumerate(run.records):
        if i % 6 == 0:
            rec, kinds[rec.request_id] = hung(rec), "hung"
        elif i % 6 == 3 and len(rec.read_times) >= 2:
            rec, kinds[rec.request_id] = stalled(rec), "stalled"
        elif i == 1:
            rec, kinds[rec.request_id] = dataclasses.replace(
                rec, status="client_disconnected", http_status=499), "cancelled"
        recs.append(rec)
    refused = dataclasses.replace(recs[2], request_id="refused-0", engine="", precision="",
                                  status="rate_limited", http_status=429, dispatched_s=None,
                                  read_times=(), read_events=(), completion_tokens=0)
    kinds[refused.request_id] = "refused"
    return dataclasses.replace(run, records=[*recs, refused]), kinds


async def serve(tmp_path: Path, setting: FailedEnergy, ledger: Ledger | None = None
                ) -> tuple[AccountingService, EngineRun, dict[str, str]]:
    """The faulty run through a service on `ledger` (default: SQLite in `tmp_path`)."""
    run, kinds = faulty_run()
    clock = Clock(T0_WALL)
    cfg = dataclasses.replace(make_config(), failed_energy=setting)
    svc = AccountingService(cfg, [EngineInfo("e0", "m", "bf16", 1)],
                            ledger=ledger or SqliteLedger(tmp_path / f"{setting}.db"),
                            meters={"e0": ReplayMeter(run.readings, clock)}, clock=clock)
    await svc.ledger.open()
    await drive(svc, run, clock, run.readings[-1][0] + 4.0)
    return svc, run, kinds


async def books(svc: AccountingService) -> dict[str, Any]:
    ledger: Any = svc.ledger
    intervals_j, _, _, _ = await conservation(ledger)
    usage = await ledger.usage(0.0, 1e12, None)
    report = build_report(usage, ["tenant"], 0.0, 1e12)
    hours = await ledger._fetch("SELECT COALESCE(SUM(energy_j), 0) FROM tenant_hours", ())
    return {"intervals_j": intervals_j,
            "billed_j": math.fsum(r[5] for r in usage.energy),
            "idle_j": math.fsum(r[4] for r in usage.idle),
            "failed_j": math.fsum(r[4] for r in usage.failed),
            "hours_j": float(hours[0][0]), "report": report}


@pytest.mark.parametrize("setting", ["failed_account", "tenant"])
async def test_meters_are_tenants_plus_idle_plus_failed_in_the_ledger_and_report(
        tmp_path: Path, setting: FailedEnergy) -> None:
    svc, _run, kinds = await serve(tmp_path, setting)
    await check_books(svc, kinds, setting)


async def check_books(svc: AccountingService, kinds: dict[str, str],
                      setting: FailedEnergy) -> None:
    """The ledger's books of the faulty run (any store), as the test above states them."""
    got = await books(svc)
    assert got["intervals_j"] > 100.0
    assert got["billed_j"] + got["idle_j"] + got["failed_j"] == pytest.approx(
        got["intervals_j"], rel=1e-9)
    assert got["hours_j"] == pytest.approx(got["billed_j"], rel=1e-9)  # what budgets read
    report = got["report"]
    assert report.total["energy_j"] == pytest.approx(got["intervals_j"], rel=1e-9)
    accounts = {r["tenant"]: r for r in report.rows if r["account"] != "requests"}
    tenant_rows = [r for r in report.rows if r["account"] == "requests"]
    assert accounts[IDLE_TENANT]["energy_j"] == pytest.approx(got["idle_j"])
    # counts by outcome class, per tenant and in all
    want = {"failed": sum(k in ("hung", "stalled") for k in kinds.values()),
            "refused": 1, "cancelled": 1}
    for cls, n in want.items():
        assert report.total[cls] == n
    assert report.total["served"] == report.total["requests"] - sum(want.values())
    assert sum(r["failed"] for r in tenant_rows) == want["failed"]
    hung_ids = [rid for rid, k in kinds.items() if k == "hung"]
    stalled_ids = [rid for rid, k in kinds.items() if k == "stalled"]
    details = {rid: await svc.ledger.request(rid) for rid in (*hung_ids, *stalled_ids)}
    assert all(d is not None and d["final"] and d["outcome"] == "failed"
               for d in details.values())
    if setting == "failed_account":
        assert got["failed_j"] > 1.0
        assert accounts[FAILED_TENANT]["energy_j"] == pytest.approx(got["failed_j"])
        assert math.fsum(r["failed_energy_j"] for r in tenant_rows) == pytest.approx(
            got["failed_j"], rel=1e-9)
        for rid in hung_ids:  # delivered nothing: billed nothing, visible as failed
            d = details[rid]
            assert d is not None and d["energy_j"] == 0.0 and d["cost_usd"] == 0.0
            assert d["failed_energy_j"] > 0.0
        for rid in stalled_ids:  # billed its tokens, the stall after them is failed
            d = details[rid]
            assert d is not None and d["energy_j"] > 0.0 and d["failed_energy_j"] > 0.0
    else:
        assert got["failed_j"] == 0.0 and FAILED_TENANT not in accounts
        for d in details.values():
            assert d is not None and d["energy_j"] > 0.0 and d["failed_energy_j"] == 0.0
    await svc.stop()


async def test_the_failed_account_is_what_the_tenants_no_longer_pay(tmp_path: Path) -> None:
    """Same run, both settings: the idle account does not move, and each tenant's bill
    drops by its failed requests' energy, which the failed account holds."""
    by: dict[str, dict[str, Any]] = {}
    settings: tuple[FailedEnergy, ...] = ("failed_account", "tenant")
    for setting in settings:
        svc, _, _ = await serve(tmp_path, setting)
        by[setting] = await books(svc)
        await svc.stop()
    default, billed = by["failed_account"], by["tenant"]
    assert default["intervals_j"] == pytest.approx(billed["intervals_j"], rel=1e-12)
    assert default["idle_j"] == pytest.approx(billed["idle_j"], rel=1e-12)
    assert billed["billed_j"] - default["billed_j"] == pytest.approx(default["failed_j"],
                                                                     rel=1e-9)
    rows_d = {r["tenant"]: r for r in default["report"].rows if r["account"] == "requests"}
    rows_t = {r["tenant"]: r for r in billed["report"].rows if r["account"] == "requests"}
    for tenant, row in rows_d.items():
        assert rows_t[tenant]["energy_j"] - row["energy_j"] == pytest.approx(
            row["failed_energy_j"], rel=1e-9, abs=1e-9)
