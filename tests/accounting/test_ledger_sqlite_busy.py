"""A write transaction of the SQLite ledger waits for another connection's write (the
apportioner's, another gateway's) about as long as that write holds the lock, not up to
SQLite's next busy-handler step (1, 2, 5, 10, 15, 20, 25 ms... apart): a tenant's admission
waits for these transactions."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from accounting.ledger.base import LedgerError
from accounting.ledger.sqlite import SqliteLedger

pytestmark = pytest.mark.timeout(60)
HOLD_S = 0.035  # SQLite's own handler tries at 33 and 53 ms: the lock is taken at 53 at best


def _hold(path: Path, hold_s: float) -> tuple[threading.Thread, threading.Event]:
    """Another connection holds the write lock for `hold_s` (from when the event is set)."""
    held = threading.Event()

    def write() -> None:
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            held.set()
            time.sleep(hold_s)
            other.execute("COMMIT")
        finally:
            other.close()

    thread = threading.Thread(target=write)
    thread.start()
    return thread, held


async def test_a_write_waits_for_another_connections_write_about_as_long_as_it_holds(
        tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    try:
        for _ in range(2):  # the second: the lock was taken and given back once already
            thread, held = _hold(tmp_path / "l.db", HOLD_S)
            held.wait(5)
            start = time.perf_counter()
            await ledger.settle_reservations([])
            waited = time.perf_counter() - start
            thread.join()
            assert HOLD_S * 0.9 <= waited < HOLD_S + 0.012
    finally:
        await ledger.close()


async def test_a_write_still_gives_up_after_the_busy_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accounting.ledger import sqlite as module

    monkeypatch.setattr(module, "BUSY_TIMEOUT_S", 0.05)
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    try:
        thread, held = _hold(tmp_path / "l.db", 0.3)
        held.wait(5)
        with pytest.raises(LedgerError, match="locked"):
            await ledger.settle_reservations([])
        thread.join()
        await ledger.settle_reservations([])  # and the connection is usable again
    finally:
        await ledger.close()
