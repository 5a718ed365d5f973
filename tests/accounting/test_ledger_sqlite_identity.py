"""A SQLite ledger whose file is deleted or replaced while open refuses all work (LedgerError,
`fault` set, logged once) instead of writing into a file no reader will see again; the
accounting loop counts the failures."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from accounting.config import AccountingConfig, LedgerConfig
from accounting.ledger import sqlite as sqlite_ledger
from accounting.ledger.base import LedgerError
from accounting.ledger.sqlite import SqliteLedger
from accounting.mode import RECORDER_ONLY
from accounting.service import AccountingService

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check the file's identity before every operation (not once a second)."""
    monkeypatch.setattr(sqlite_ledger, "IDENTITY_CHECK_S", 0.0)


async def test_an_intact_ledger_works_and_has_no_fault(tmp_path: Path, every_time: None) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.db")
    await ledger.open()
    try:
        assert await ledger.states() == {}
        assert await ledger.states() == {}
        assert ledger.fault is None
    finally:
        await ledger.close()


async def test_a_deleted_ledger_file_fails_every_operation_and_logs_once(
        tmp_path: Path, every_time: None, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path)
    await ledger.open()
    try:
        path.unlink()
        with caplog.at_level(logging.ERROR, logger="wattgate.accounting"):
            for _ in range(3):
                with pytest.raises(LedgerError, match="was deleted while open"):
                    await ledger.states()
        assert ledger.fault is not None and "deleted" in ledger.fault
        assert len([r for r in caplog.records if "deleted" in r.getMessage()]) == 1
        # a fresh file at the path (e.g. made by a restarted apportioner) does not heal it
        fresh = SqliteLedger(path)
        await fresh.open()
        await fresh.close()
        with pytest.raises(LedgerError):
            await ledger.states()
    finally:
        await ledger.close()


async def test_a_replaced_ledger_file_is_refused(tmp_path: Path, every_time: None) -> None:
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path)
    await ledger.open()
    try:
        other = tmp_path / "other.db"
        other.write_bytes(path.read_bytes())
        other.replace(path)
        with pytest.raises(LedgerError, match="replaced by another file"):
            await ledger.states()
    finally:
        await ledger.close()


async def test_the_check_runs_at_most_once_a_second(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path)
    await ledger.open()
    try:
        path.unlink()
        assert await ledger.states() == {}  # opened < 1 s ago: not checked yet
        await asyncio.sleep(sqlite_ledger.IDENTITY_CHECK_S + 0.1)
        with pytest.raises(LedgerError, match="deleted"):
            await ledger.states()
    finally:
        await ledger.close()


async def test_the_accounting_loop_counts_the_ghost_as_ledger_errors(
        tmp_path: Path, every_time: None) -> None:
    path = tmp_path / "ledger.db"
    config = AccountingConfig(poll_s=0.05, ledger=LedgerConfig(kind="sqlite", path=str(path)))
    registry = CollectorRegistry()
    service = AccountingService(config, [], registry=registry, mode=RECORDER_ONLY)
    await service.start()
    try:
        await asyncio.wait_for(service.first_step(), 5.0)
        assert (registry.get_sample_value("wattgate_ledger_errors_total") or 0.0) == 0.0
        path.unlink()
        for _ in range(100):
            if (registry.get_sample_value("wattgate_ledger_errors_total") or 0.0) > 0.0:
                break
            await asyncio.sleep(0.05)
        assert (registry.get_sample_value("wattgate_ledger_errors_total") or 0.0) > 0.0
        assert service.ledger.fault is not None  # type: ignore[attr-defined]
    finally:
        await service.stop()
