"""The recorder's batches: each work row carries its request's engine, and a failed write keeps
every row for the next one."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from accounting.config import JournalConfig
from accounting.ledger.base import (
    LedgerError,
    RequestRow,
    Watermark,
    WorkByEngine,
    work_by_engine,
)
from accounting.recorder import LedgerRecorder
from accounting.work import Work
from tests.accounting.test_accounting_accuracy import T0_WALL, run_engine
from tests.accounting.test_ledger_sqlite import Clock, make_config

pytestmark = pytest.mark.timeout(30)


class FlakyLedger:
    """Fails its first `fail` appends, then keeps what it is given."""

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.requests: list[RequestRow] = []
        self.work: list[tuple[str, Work]] = []  # (engine, row)

    async def append(self, requests: Sequence[RequestRow], work: WorkByEngine,
                     watermark: Watermark | None = None) -> None:
        if self.fail:
            self.fail -= 1
            raise LedgerError("down")
        self.requests += requests
        self.work += _flat(work)


def _flat(work: WorkByEngine) -> list[tuple[str, Work]]:
    """(engine, row) of each work row, engine by engine."""
    return [(engine, row) for engine, rows in work_by_engine(work).items() for row in rows]


async def test_a_flush_writes_each_engines_rows_and_a_failed_one_keeps_them() -> None:
    recs = run_engine(5, duration_s=10.0).records[:40]
    assert len(recs) == 40
    recs = [dataclasses.replace(r, engine="e1") if i % 3 == 0 else r
            for i, r in enumerate(recs)]
    config = dataclasses.replace(make_config(), journal=JournalConfig(enabled=False))
    ledger = FlakyLedger(fail=1)
    recorder = LedgerRecorder(config, ledger, "r1",  # type: ignore[arg-type]
                              clock=Clock(T0_WALL))
    for rec in recs[:25]:
        recorder.record(rec)
    recorder.ingest()
    engine_of = {r.request_id: r.engine for r in recs}
    assert recorder.unwritten_work > 25
    first = _flat(recorder._work)
    with pytest.raises(LedgerError):
        await recorder.flush()
    assert recorder.unwritten == 25 and _flat(recorder._work) == first
    for rec in recs[25:]:
        recorder.record(rec)
    recorder.ingest()
    rows = _flat(recorder._work)
    for engine in ("e0", "e1"):  # the failed batch first, engine by engine
        old = [r for r in first if r[0] == engine]
        assert [r for r in rows if r[0] == engine][:len(old)] == old
    assert len(rows) > len(first)
    assert all(engine == engine_of[w[0]] for engine, w in rows)
    await recorder.flush()
    assert [r.request_id for r in ledger.requests] == [r.request_id for r in recs]
    assert ledger.work == rows
    assert {engine for engine, _ in ledger.work} == {"e0", "e1"}
    assert recorder.unwritten == recorder.unwritten_work == 0
