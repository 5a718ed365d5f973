"""The accounting child's records and request rows are out of the garbage collector's sight
(accounting/_untrack.c): they hold only strings, numbers and tuples, so no cycle can go
through them, and the collector walked every one waiting for a flush. What may be in a cycle
stays tracked, and the rows written are the same."""

from __future__ import annotations

import dataclasses
import gc
from typing import Any, NamedTuple

import pytest

from accounting import recorder as recorder_mod
from accounting.config import JournalConfig
from accounting.recorder import LedgerRecorder, untrack
from core.codec import decode_lines, encode_lines
from tests.accounting.test_accounting_accuracy import T0_WALL
from tests.accounting.test_accounting_recorder import FlakyLedger
from tests.accounting.test_ledger_sqlite import Clock, make_config
from tests.unit.test_record_link import child, closes, gateway_end, records, until

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.skipif(recorder_mod.compiled_untrack is None,
                                 reason="accounting/_untrack.c was not built")]


def _recorder() -> LedgerRecorder:
    config = dataclasses.replace(make_config(), journal=JournalConfig(enabled=False))
    return LedgerRecorder(config, FlakyLedger(fail=0), "gw-1",  # type: ignore[arg-type]
                          clock=Clock(T0_WALL))


@closes
async def test_the_childs_records_and_rows_are_untracked() -> None:
    recs = records(40)
    intake, ours = await child(FlakyLedger(fail=0))
    gw = gateway_end()
    gw.attach(ours)
    for rec in recs:
        gw.record(rec)
    pending = intake.recorder._pending
    await until(lambda: len(pending) == 40, "the records, in the child")
    assert not any(map(gc.is_tracked, pending))
    assert not any(gc.is_tracked(r.latency) or gc.is_tracked(r.read_events) for r in pending)
    intake.recorder.ingest()
    rows = intake.recorder._requests
    assert len(rows) == 40 and not any(map(gc.is_tracked, rows))


def test_rows_are_the_same_tracked_or_not() -> None:
    recs, bad = decode_lines(encode_lines(records(30)))
    assert not bad
    tracked = _recorder()
    for rec in recs:
        tracked.record(rec)
    saved = recorder_mod.compiled_untrack, recorder_mod.compiled_request_row
    recorder_mod.compiled_untrack = recorder_mod.compiled_request_row = None  # Python only
    try:
        tracked.ingest()
    finally:
        recorder_mod.compiled_untrack, recorder_mod.compiled_request_row = saved
    assert all(map(gc.is_tracked, tracked._requests))
    untracked = _recorder()
    for rec in recs:
        untracked.record(rec)
    untracked.ingest()
    assert not any(map(gc.is_tracked, untracked._requests))
    assert untracked._requests == tracked._requests
    assert untracked._work == tracked._work


class _Holder(NamedTuple):
    what: Any


def test_what_may_be_in_a_cycle_stays_tracked() -> None:
    rec = decode_lines(encode_lines(records(1)))[0][0]
    listed = dataclasses.replace(rec, trace=[])  # type: ignore[arg-type]
    cyclic: list[Any] = []
    holder = _Holder(cyclic)
    cyclic.append(holder)
    plain = _Holder((1.0, "x"))
    values = [listed, holder, cyclic, {"a": []}, plain]
    untrack(values)
    assert [gc.is_tracked(v) for v in values] == [True, True, True, True, False]
    assert not gc.is_tracked(listed.latency)  # what it holds is untracked by the same rule
    del values, holder, cyclic
    gc.collect()
    looped: list[Any] = []
    looped.append(_Holder(looped))
    untrack(looped)
    del looped
    assert gc.collect() >= 2  # the cycle is still found and freed
