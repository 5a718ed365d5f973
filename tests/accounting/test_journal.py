"""The write-ahead request journal: line format, torn lines, rotation, replay at start-up."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from accounting.config import AccountingConfig, JournalConfig, LedgerConfig, parse_accounting
from accounting.journal import Journal, read_segment, recover
from accounting.ledger.base import LedgerError
from accounting.service import AccountingService, EngineInfo
from core.codec import encode
from core.records import RequestRecord
from tests.accounting.test_accounting_accuracy import run_engine


def records(n: int) -> list[RequestRecord]:
    run = run_engine(41, duration_s=8.0)
    assert len(run.records) >= n
    return run.records[:n]


def wait_written(journal: Journal, n: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while journal.records_written < n:
        assert time.monotonic() < deadline, f"{journal.records_written} of {n} written"
        time.sleep(0.01)


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.jsonl"))


def ledger_ids(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [r[0] for r in db.execute("SELECT request_id FROM requests")]


def test_line_round_trips_every_field_the_ledger_uses(tmp_path: Path) -> None:
    """Every field but the ITL samples (the ledger keeps none) comes back as it was."""
    path = tmp_path / "x.00000000.jsonl"
    for rec in records(20):
        path.write_bytes(encode(rec))
        (back,), skipped = read_segment(path)
        assert skipped == 0
        assert back == dataclasses.replace(rec, latency=back.latency)
        assert back.latency.tpot_s == rec.latency.tpot_s
        assert back.latency.ttft_s == rec.latency.ttft_s


def test_torn_last_line_is_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    recs = records(5)
    data = b"".join(encode(r) for r in recs)
    torn = encode(recs[0])[:-20]  # a crash in the middle of the last write
    path = tmp_path / "dead.00000000.jsonl"
    path.write_bytes(data + torn)
    got, skipped = read_segment(path)
    assert [r.request_id for r in got] == [r.request_id for r in recs]
    assert skipped == 1


def test_journal_writes_cuts_and_deletes_released_segments(tmp_path: Path) -> None:
    recs = records(6)
    j = Journal(tmp_path / "j", fsync_s=0.005)
    j.open()
    try:
        for r in recs[:3]:
            j.append(r)
        first = j.cut()
        for r in recs[3:]:
            j.append(r)
        wait_written(j, 6)
        files = segments(tmp_path / "j")
        assert len(files) == 2
        assert [r.request_id for r in read_segment(files[0])[0]] == [
            r.request_id for r in recs[:3]]
        j.release(first)  # the first three are in the ledger
        j.cut()
        deadline = time.monotonic() + 20
        while len(segments(tmp_path / "j")) != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (left,) = segments(tmp_path / "j")
        assert [r.request_id for r in read_segment(left)[0]] == [r.request_id for r in recs[3:]]
    finally:
        j.close()
    # not released: it stays for the next start, and the lock is gone with its owner
    assert len(segments(tmp_path / "j")) == 1
    assert not list((tmp_path / "j").glob("*.lock"))


def test_an_idle_journal_thread_sleeps_until_there_is_work(tmp_path: Path) -> None:
    """No wake-up every fsync window while nothing is queued (the accounting child's idle
    cost): a record, a cut or a release wakes it."""
    j = Journal(tmp_path / "j", fsync_s=0.002)
    j.open()
    try:
        time.sleep(0.1)  # 50 windows
        assert j.turns == 0
        j.append(records(1)[0])
        wait_written(j, 1)
        turns = j.turns
        time.sleep(0.1)
        assert j.turns == turns
        j.release(j.cut())
        deadline = time.monotonic() + 20
        while segments(tmp_path / "j"):  # the written segment, released, goes
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert j.turns > turns
    finally:
        j.close()


def test_close_is_not_lost_between_the_window_and_the_next_turn(tmp_path: Path) -> None:
    """`close` landing after the writer's group window ended and before it took the turn's
    wake-up: the writer still stops (it used to wait for a wake-up that never came)."""
    at_clear, go = threading.Event(), threading.Event()

    class Held(threading.Event):
        def clear(self) -> None:
            if threading.current_thread().name == "wattgate-journal" and not go.is_set():
                at_clear.set()
                go.wait(10)
            super().clear()

    j = Journal(tmp_path / "j", fsync_s=0.002, fsync=False)
    j._work = Held()
    j.open()
    j.append(records(1)[0])
    assert at_clear.wait(10)  # the window is over; the writer is about to take the wake-up
    closer = threading.Thread(target=j.close, daemon=True)
    closer.start()
    deadline = time.monotonic() + 10
    while not (j._stop.is_set() and j._work.is_set()):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    go.set()  # the writer goes on: its clear takes close's wake-up too
    closer.join(10)
    assert not closer.is_alive()
    assert j.records_written == 1


def test_recover_skips_segments_of_a_live_owner(tmp_path: Path) -> None:
    live = Journal(tmp_path, fsync_s=0.005)
    live.open()
    try:
        live.append(records(1)[0])
        wait_written(live, 1)
        assert recover(tmp_path, "someone-else").files == []
    finally:
        live.close()
    assert len(recover(tmp_path, "someone-else").files) == 1  # gone now: its segment is due


def _service(tmp_path: Path, fsync_s: float = 0.005) -> AccountingService:
    ledger = LedgerConfig(path=str(tmp_path / "l.db"))
    cfg = AccountingConfig(ledger=ledger, journal=JournalConfig(enabled=True, fsync_s=fsync_s))
    return AccountingService(cfg, [EngineInfo("e0", "m", "bf16", 1)])


@pytest.mark.timeout(60)
async def test_replay_at_start_writes_orphaned_records_once_and_deletes_them(
        tmp_path: Path) -> None:
    """A dead process's journal lands in the ledger at the next start, each request once even
    when replayed twice (a crash during replay), and its files go."""
    recs = records(30)
    jdir = tmp_path / "l.db.journal"
    jdir.mkdir()
    (jdir / "dead-1.00000000.jsonl").write_bytes(b"".join(encode(r) for r in recs[:15]))
    (jdir / "dead-1.00000001.jsonl").write_bytes(b"".join(encode(r) for r in recs[15:]))
    copies = {p.name: p.read_bytes() for p in segments(jdir)}
    for _ in range(2):
        for name, content in copies.items():
            (jdir / name).write_bytes(content)
        svc = _service(tmp_path)
        await svc.start()
        await svc.stop()
        assert segments(jdir) == []
    ids = ledger_ids(tmp_path / "l.db")
    assert sorted(ids) == sorted(r.request_id for r in recs)


@pytest.mark.timeout(60)
async def test_a_start_whose_replay_fails_closes_the_ledger_it_opened(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    assert svc.recorder is not None

    async def broken() -> None:
        raise RuntimeError("replay broke")

    svc.recorder.replay_journal = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="replay broke"):
        await svc.start()
    with pytest.raises(LedgerError, match="not open"):
        await svc.ledger.usage(0.0, 1.0, None)


@pytest.mark.timeout(60)
async def test_records_are_journalled_until_flushed_then_segments_go(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    assert svc.journal is not None
    await svc.ledger.open()
    assert svc.recorder is not None
    await svc.recorder.replay_journal()  # start() without the background loop
    jdir = tmp_path / "l.db.journal"
    recs = records(10)
    for r in recs:
        svc.record(r)
    await asyncio.to_thread(wait_written, svc.journal, len(recs))
    journalled = [r.request_id for p in segments(jdir) for r in read_segment(p)[0]]
    assert journalled == [r.request_id for r in recs]
    await svc.ingest_chunked()
    await svc.flush()
    svc.record(recs[0])  # after the cut: lands in a new segment that stays
    deadline = time.monotonic() + 20
    while [p for p in segments(jdir)
           if [r.request_id for r in read_segment(p)[0]] != [recs[0].request_id]]:
        assert time.monotonic() < deadline, "flushed segment not deleted"
        await asyncio.sleep(0.01)
    await svc.stop()


def test_config_turns_the_journal_on_next_to_the_sqlite_ledger(tmp_path: Path) -> None:
    cfg = parse_accounting({"ledger": {"kind": "sqlite", "path": "x.db"}}, env={},
                           base_dir=tmp_path)
    assert cfg.journal.enabled and cfg.journal.fsync_s == pytest.approx(0.02)
    assert cfg.journal.directory(cfg.ledger) == "x.db.journal"
    off = parse_accounting({"journal": {"enabled": False}}, env={})
    assert not off.journal.enabled
    rel = parse_accounting({"journal": {"path": "jr", "fsync_ms": 5}}, env={}, base_dir=tmp_path)
    assert rel.journal.path == os.fspath(tmp_path / "jr") and rel.journal.fsync_s == 0.005
