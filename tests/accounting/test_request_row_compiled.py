"""RequestRow.from_record compiled (accounting/_requestrow.c), as the accounting child builds
its request rows: the same row as the Python method, field for field, value for value and
type for type (the floats' bits), out of the garbage collector's sight; a record whose times
are not floats goes to the Python method."""

from __future__ import annotations

import dataclasses
import gc
import math
import random
import struct
from typing import Any

import pytest

from accounting import recorder
from accounting.ledger.base import RequestRow
from accounting.work import work_rows
from core.codec import decode_lines, encode_lines
from core.records import RequestRecord
from tests.accounting import test_ledger_rows
from tests.accounting.test_accounting_accuracy import run_engine

pytestmark = pytest.mark.skipif(recorder.compiled_request_row is None,
                                reason="accounting/_requestrow.c was not built")


def _bits(row: tuple[Any, ...]) -> list[Any]:
    return [(type(v), struct.pack("<d", v) if isinstance(v, float) else v) for v in row]


def _both(rec: RequestRecord, interval_s: float, work: list[Any]) -> RequestRow:
    assert recorder.compiled_request_row is not None
    want = RequestRow.from_record(rec, interval_s, "rep", work)
    got = recorder.compiled_request_row(RequestRow, rec, interval_s, "rep", work)
    assert type(got) is RequestRow
    assert _bits(got) == _bits(want), rec.request_id
    return got


def test_the_compiled_row_is_the_pythons_bit_for_bit() -> None:
    recs = run_engine(7, duration_s=10.0).records
    recs = decode_lines(encode_lines(recs))[0]  # as the child reads them
    rng = random.Random(5)
    edited = []
    for rec in recs[:200]:
        edited += [
            dataclasses.replace(rec, engine=""),  # never reached an engine
            dataclasses.replace(rec, dispatched_s=None),
            dataclasses.replace(rec, read_times=(), read_events=()),
            dataclasses.replace(rec, stream=not rec.stream, slo_met=not rec.slo_met,
                                status=rng.choice(["ok", "upstream_timeout", "cancelled"])),
            dataclasses.replace(rec, finished_s=rec.finished_s + rng.uniform(0.0, 3.0)),
        ]
    assert recs
    for interval_s in (1.0, 0.05, 0.3):
        for rec in [*recs, *edited]:
            work = work_rows(rec, interval_s)
            row = _both(rec, interval_s, work)
            assert not gc.is_tracked(row)
            if len(work) > 1:  # work stamped out of order: min and max, first kept
                assert row.last_interval is not None
                _both(rec, interval_s, work[::-1])
                late = [(*work[0][:1], row.last_interval + 3, *work[0][2:])]
                assert _both(rec, interval_s, work + late).last_interval == row.last_interval + 3


def test_a_record_whose_times_are_not_floats_goes_to_the_python_method() -> None:
    rec = decode_lines(encode_lines(run_engine(7, duration_s=2.0).records[:1]))[0][0]
    for changed in (dataclasses.replace(rec, arrived_wall_s=1_700_000_000),
                    dataclasses.replace(rec, finished_s=math.ceil(rec.finished_s)),
                    dataclasses.replace(rec, read_times=(*rec.read_times[:-1], 7))):
        _both(changed, 1.0, work_rows(changed, 1.0))


def test_the_compiled_row_holds_each_field_by_name() -> None:
    assert recorder.compiled_request_row is not None
    compiled = recorder.compiled_request_row
    saved = RequestRow.__dict__["from_record"]
    try:  # the named test's record and expectations, through the compiled row
        type.__setattr__(RequestRow, "from_record", classmethod(
            lambda cls, rec, interval_s, replica, work: compiled(
                cls, rec, interval_s, replica, list(work))))
        test_ledger_rows.test_a_request_rows_fields_hold_their_records_values_by_name()
    finally:
        type.__setattr__(RequestRow, "from_record", saved)
    assert RequestRow.__dict__["from_record"] is saved
