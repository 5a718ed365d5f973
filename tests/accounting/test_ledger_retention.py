"""Retention on SQLite: final per-request rows pruned in small batches, the hourly rollups'
bills unchanged; rows not final kept; the apportioner prunes as configured."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from accounting.config import LedgerConfig, parse_accounting
from accounting.ledger.sqlite import SqliteLedger
from accounting.report import GROUP_KEYS, build_report
from accounting.service import AccountingService, EngineInfo
from core.errors import ConfigError
from tests.accounting.fixtures.make_ledger_v9 import HOUR, SHIFT_S, shifted_run
from tests.accounting.rollup_checks import (
    check_pruned_bills_unchanged,
    check_unfinal_rows_kept,
    count,
    same,
    served_with_revisions,
)
from tests.accounting.test_accounting_accuracy import T0_WALL
from tests.accounting.test_ledger_sqlite import Clock, ReplayMeter, drive, make_config

pytestmark = pytest.mark.timeout(120)


async def test_pruning_final_rows_leaves_the_hours_bills_unchanged(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    svc = await served_with_revisions(ledger)
    try:
        await check_pruned_bills_unchanged(ledger)
    finally:
        await svc.stop()


async def test_rows_not_final_are_kept(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    svc = await served_with_revisions(ledger)
    try:
        await check_unfinal_rows_kept(ledger)
    finally:
        await svc.stop()


async def _served(path: Path, retention_days: float | None
                  ) -> tuple[AccountingService, SqliteLedger]:
    run, _ = shifted_run()
    clock = Clock(T0_WALL + SHIFT_S)
    cfg = make_config()
    cfg = dataclasses.replace(cfg, ledger=LedgerConfig(retention_days=retention_days))
    ledger = SqliteLedger(path)
    svc = AccountingService(cfg, [EngineInfo("e0", "m", "bf16", 1)], ledger=ledger,
                            meters={"e0": ReplayMeter(run.readings, clock)}, clock=clock)
    await svc.ledger.open()
    await drive(svc, run, clock, run.readings[-1][0] + 4.0)
    clock.t += 120.0  # past the retention of 10 s, and the pruner's minute
    for _ in range(40):
        await svc.step()
    return svc, ledger


async def test_the_apportioner_prunes_past_the_configured_retention(tmp_path: Path) -> None:
    kept, kept_ledger = await _served(tmp_path / "kept.db", None)
    pruned, pruned_ledger = await _served(tmp_path / "pruned.db", 10.0 / 86400.0)
    try:
        assert await count(kept_ledger, "requests") > 100
        assert await count(pruned_ledger, "requests") == 0
        assert await count(pruned_ledger, "shares") == 0
        for since, until in (((HOUR - 1) * 3600.0, (HOUR + 1) * 3600.0), (0.0, 1e12)):
            want = build_report(await kept.ledger.usage(since, until, None), GROUP_KEYS,
                                since, until)
            got = build_report(await pruned.ledger.usage(since, until, None), GROUP_KEYS,
                               since, until)
            same(got.total, want.total, "total")
            same(list(got.rows), list(want.rows), "rows")
    finally:
        await kept.stop()
        await pruned.stop()


def test_retention_is_thirty_days_in_a_config_file_and_for_ever_at_zero_or_null() -> None:
    assert parse_accounting({}).ledger.retention_days == 30.0
    assert parse_accounting({"ledger": {"retention_days": 7}}).ledger.retention_days == 7.0
    for forever in (0, None):
        cfg = parse_accounting({"ledger": {"retention_days": forever}})
        assert cfg.ledger.retention_days is None
    with pytest.raises(ConfigError, match=r"accounting\.ledger\.retention_days"):
        parse_accounting({"ledger": {"retention_days": -1}})
    with pytest.raises(ConfigError, match=r"accounting\.ledger\.retention_days"):
        parse_accounting({"ledger": {"retention_days": "a month"}})
    assert parse_accounting({"ledger": {"retention_days": 1 / 24}}).ledger.retention_days


def test_a_retention_under_an_hour_is_refused() -> None:
    """The hour under way is read from the per-request rows: with 1e-6 days (86 ms) every
    report until now showed the current hour's requests pruned, /admin/v1/usage 0 requests."""
    for days in (1e-6, 0.04):
        with pytest.raises(ConfigError, match=r"retention_days: must be at least 1/24"):
            parse_accounting({"ledger": {"retention_days": days}})


async def test_a_retention_longer_than_the_clock_prunes_nothing_and_never_fails(
        tmp_path: Path) -> None:
    """retention_days 1e300 is a valid "keep about for ever" (the config takes any finite
    number): the cut-off before the epoch must not overflow SQLite's integers or floor()."""
    for days in (1e300, 1e308):
        svc, ledger = await _served(tmp_path / f"long-{days:g}.db", days)
        try:
            assert await count(ledger, "requests") > 100
        finally:
            await svc.stop()
