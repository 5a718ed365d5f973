"""Records on disk while no accounting child runs (link.py's spill journal): a dead child's
unacknowledged records and every record shipped until a successor is attached are written to
the gateway's own journal; the successor's acknowledgement releases them; a gateway that stops
first leaves them for the next start's recovery; a full disk is retried, never dropped (and
the accounting child's own journal, which stops on one, says so)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from accounting import link as link_mod
from accounting.config import JournalConfig
from accounting.journal import Journal, recover
from accounting.link import RecordLink
from accounting.metrics import RecorderMetrics
from accounting.recorder import LedgerRecorder
from tests.accounting.test_accounting_accuracy import T0_WALL
from tests.accounting.test_accounting_recorder import FlakyLedger
from tests.accounting.test_ledger_sqlite import Clock, make_config
from tests.unit.test_record_link import OPENED, child, gateway_end, records, until

pytestmark = pytest.mark.timeout(30)


def closes(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Close what the test opened, passed or not (test_record_link's `closes`, with the
    test's fixtures)."""
    @functools.wraps(test)
    async def run(**fixtures: Any) -> None:
        try:
            await test(**fixtures)
        finally:
            while OPENED:
                OPENED.pop()()
    return run


def spill_journal(directory: Path, *, retry_s: float | None = 0.05) -> Journal:
    journal = Journal(directory, 0.001, owner="gateway-test", fsync=False, retry_s=retry_s)
    journal.open()
    OPENED.append(journal.close)
    return journal


def ids_on_disk(directory: Path) -> list[str]:
    got = recover(directory)
    got.abandon()
    return sorted(r.request_id for r in got.records)


@closes
async def test_records_of_a_dead_child_and_after_it_wait_on_disk_until_a_successor_has_them(
        tmp_path: Path) -> None:
    recs = records(30)
    journal = spill_journal(tmp_path)
    gw: RecordLink = gateway_end()
    gw.spill_to(journal)
    ours, theirs = socket.socketpair()
    gw.attach(ours)
    for rec in recs[:10]:
        gw.record(rec)
    await asyncio.sleep(0.1)  # shipped to a child that never acknowledges
    theirs.close()  # it dies
    await until(lambda: not gw.attached, "the dead child's socket let go")
    for rec in recs[10:]:
        gw.record(rec)  # no child: shipped to the spill
    await until(lambda: gw.spilled == 30, "30 records spilled")
    await until(lambda: journal.records_written == 30, "30 records on disk")
    journal.close()  # the gateway gone (its lock released): the next start replays them
    assert ids_on_disk(tmp_path) == sorted(r.request_id for r in recs)


@closes
async def test_a_successor_that_acknowledges_releases_the_spilled_segments(
        tmp_path: Path) -> None:
    recs = records(20)
    journal = spill_journal(tmp_path)
    gw = gateway_end()
    gw.spill_to(journal)
    for rec in recs:
        gw.record(rec)  # no child yet
    await until(lambda: journal.records_written == 20, "20 records on disk")
    intake, ours = await child(FlakyLedger(fail=0))
    gw.attach(ours)  # the successor: it gets everything held
    await until(lambda: len(intake.recorder._pending) == 20, "the records in the child")
    await intake.recorder.stop()  # written: acknowledged
    await until(lambda: gw.unwritten == 0, "the acknowledgement")
    await until(lambda: not list(tmp_path.glob("gateway-test.*.jsonl")), "segments deleted")
    journal.close()
    assert ids_on_disk(tmp_path) == []


@closes
async def test_a_full_disk_keeps_the_records_and_retries_until_it_writes(
        tmp_path: Path) -> None:
    recs = records(5)
    (tmp_path / "gateway-test.00000000.jsonl").symlink_to("/dev/full")  # writes: ENOSPC
    journal = spill_journal(tmp_path)
    gw = gateway_end()
    gw.spill_to(journal)
    for rec in recs:
        gw.record(rec)
    await until(lambda: journal.failing and journal.failures >= 2, "the write failing")
    assert journal.records_written == 0 and not journal.failed
    os.unlink(tmp_path / "gateway-test.00000000.jsonl")  # space again
    await until(lambda: not journal.failing, "the write retried")
    assert journal.records_written == 5
    journal.close()
    assert ids_on_disk(tmp_path) == sorted(r.request_id for r in recs)


async def test_the_childs_journal_on_a_full_disk_says_so_and_the_ledger_still_gets_all(
        tmp_path: Path) -> None:
    """The accounting child's own journal (no retry): a write that fails stops it, logged and
    shown by wattgate_accounting_journal_failed; the records still reach the ledger."""
    recs = records(8)
    registry = CollectorRegistry()
    config = dataclasses.replace(make_config(), journal=JournalConfig(
        enabled=True, path=str(tmp_path), fsync_s=0.001))
    ledger = FlakyLedger(fail=0)
    recorder = LedgerRecorder(config, ledger, "gw-1",  # type: ignore[arg-type]
                              clock=Clock(T0_WALL), metrics=RecorderMetrics(registry))
    assert recorder.journal is not None
    recorder.journal.owner = "full"
    (tmp_path / "full.00000000.jsonl").symlink_to("/dev/full")  # writes: ENOSPC
    await recorder.replay_journal()
    assert registry.get_sample_value("wattgate_accounting_journal_failed") == 0.0
    for rec in recs:
        recorder.record(rec)
    journal = recorder.journal
    await until(lambda: journal.failed, "the journal failing")
    assert registry.get_sample_value("wattgate_accounting_journal_failed") == 1.0
    await recorder.stop()
    assert sorted(r.request_id for r in ledger.requests) == sorted(r.request_id for r in recs)


@closes
async def test_spilled_records_forgotten_in_memory_stay_on_disk_after_a_successor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_HELD_RECORDS the oldest spilled records are no longer in memory, so no
    successor gets them: their segments are kept for the next start, not released."""
    monkeypatch.setattr(link_mod, "MAX_HELD_RECORDS", 20)
    recs = records(30)
    journal = spill_journal(tmp_path)
    gw = gateway_end()
    gw.spill_to(journal)
    for batch in (recs[:10], recs[10:20], recs[20:]):  # three frames: the first is forgotten
        for rec in batch:
            gw.record(rec)
        await until(lambda n=gw.spilled: gw.spilled == n + 10, "a frame spilled")
    assert gw.forgotten == 10
    await until(lambda: journal.records_written == 30, "30 records on disk")
    intake, ours = await child(FlakyLedger(fail=0))
    gw.attach(ours)
    await until(lambda: len(intake.recorder._pending) == 20, "the twenty held, in the child")
    await intake.recorder.stop()
    await until(lambda: gw.unwritten == 0, "the acknowledgement")
    await asyncio.sleep(0.05)
    journal.close()
    assert ids_on_disk(tmp_path) == sorted(r.request_id for r in recs)  # all kept
