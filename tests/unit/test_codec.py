"""The records' wire format (core/codec.py): named fields, the version first, the types of
the vocabularies checked on the way in, one bad line costing only itself."""

from __future__ import annotations

import base64
import dataclasses
import functools
import gc
import math
import random
import struct
from pathlib import Path

import orjson
import pytest

from core import codec
from core.codec import (
    MAX_TIME_S,
    MAX_TOKENS,
    VERSION,
    RecordLine,
    decode,
    decode_lines,
    encode,
    encode_lines,
    line_of,
    pack_times,
    unpack_times,
)
from core.records import RequestRecord
from core.timing import Latency
from tests.accounting.test_journal_compat import fixture_records


def _as_journalled(rec: RequestRecord) -> RequestRecord:
    lat = rec.latency
    return dataclasses.replace(rec, latency=Latency(lat.ttft_s, lat.tpot_s, lat.e2e_s, (), ()))


def test_a_line_is_the_version_then_the_fields_in_the_structs_order() -> None:
    rec = fixture_records()[0]
    values = orjson.loads(encode(rec))
    assert values[0] == VERSION
    named = dict(zip(RecordLine.__struct_fields__, values[1:], strict=True))
    assert named["request_id"] == rec.request_id
    assert named["read_events"] == list(rec.read_events)
    assert named["prompt_source"] == rec.prompt_source
    assert named["tpot_s"] == rec.latency.tpot_s


def test_every_field_but_the_itl_samples_round_trips() -> None:
    recs = fixture_records()
    assert [decode(encode(r)) for r in recs] == [_as_journalled(r) for r in recs]
    assert decode_lines(encode_lines(recs)) == ([_as_journalled(r) for r in recs], 0)


def test_a_value_outside_its_vocabulary_or_range_is_not_a_record() -> None:
    rec = fixture_records()[0]
    for bad in (dataclasses.replace(rec, precision="fp7"),  # type: ignore[arg-type]
                dataclasses.replace(rec, prompt_source="guess"),  # type: ignore[arg-type]
                dataclasses.replace(rec, completion_tokens=1 << 70),
                dataclasses.replace(rec, read_events=(1, -2, 1))):
        assert decode(encode(bad)) is None


def test_a_time_no_clock_reaches_is_not_a_record() -> None:
    """Finite but past MAX_TIME_S (or before 0): its interval index is no 64-bit integer, and
    one such journal line made the accounting child fail at every replay."""
    rec = fixture_records()[0]
    for bad in (dataclasses.replace(rec, arrived_wall_s=1e300),
                dataclasses.replace(rec, finished_s=MAX_TIME_S * 2),
                dataclasses.replace(rec, arrived_s=-1.0),
                dataclasses.replace(rec, read_times=(rec.arrived_s, 1e300)),
                dataclasses.replace(rec, engine_done_s=1e300)):
        assert decode(encode(bad)) is None
    assert decode_lines(encode(rec) + encode(dataclasses.replace(rec, finished_s=1e300))) == (
        [_as_journalled(rec)], 1)


def test_a_token_count_past_what_the_gateway_reads_is_not_a_record() -> None:
    """Counts near 2**63 fit a row but not a sum: two in one hour's rollup made every usage
    read of their tenant fail (integer overflow), for good."""
    rec = fixture_records()[0]
    assert decode(encode(dataclasses.replace(rec, prompt_tokens=MAX_TOKENS))) is not None
    for bad in (dataclasses.replace(rec, prompt_tokens=MAX_TOKENS + 1),
                dataclasses.replace(rec, completion_tokens=(1 << 63) - 1)):
        assert decode(encode(bad)) is None


def test_one_bad_line_among_good_ones_costs_only_itself() -> None:
    recs = fixture_records()
    bad = dataclasses.replace(recs[1], precision="fp7")  # type: ignore[arg-type]
    lines = encode(recs[0]) + encode(bad) + b'{"not": "a record"}\n' + encode(recs[2])
    got, skipped = decode_lines(lines)
    assert [r.request_id for r in got] == [recs[0].request_id, recs[2].request_id]
    assert skipped == 2


def test_a_line_of_an_unknown_version_is_not_read() -> None:
    values = orjson.loads(encode(fixture_records()[0]))
    values[0] = VERSION + 1
    assert decode(orjson.dumps(values)) is None


def test_the_struct_carries_every_record_field_the_ledger_reads() -> None:
    """A field added to the record and not to the line would be lost between the gateway and
    the ledger: every record field is on the line, but the latency (its three values are)
    and the trace (never carried)."""
    fields = {f.name for f in dataclasses.fields(RequestRecord)} - {"latency", "trace"}
    assert fields <= set(RecordLine.__struct_fields__)
    assert {"ttft_s", "tpot_s", "e2e_s"} <= set(RecordLine.__struct_fields__)
    assert line_of(fixture_records()[0]).request_id == "r-stream"


def test_read_times_travel_as_the_base64_of_little_endian_doubles_and_keep_their_bits() -> None:
    times = (0.1 + 0.2, 1e-300, 5e-324, 123456.78901234567, MAX_TIME_S)
    rec = dataclasses.replace(fixture_records()[0], read_times=times, read_events=(1,) * 5)
    values = orjson.loads(encode(rec))
    assert base64.b64decode(values[1 + RecordLine.__struct_fields__.index("read_times")]) == (
        struct.pack("<5d", *times))
    got = decode(encode(rec))
    assert got is not None and got.read_times == times
    assert all(type(t) is float for t in got.read_times)
    assert unpack_times(pack_times(())) == ()


def test_read_times_that_are_no_clock_s_are_not_a_record() -> None:
    rec = fixture_records()[0]
    good = encode(rec)
    at = 1 + RecordLine.__struct_fields__.index("read_times")
    for bad in (struct.pack("<2d", 100.0, math.nan), struct.pack("<d", -1.0),
                struct.pack("<d", math.inf), struct.pack("<d", MAX_TIME_S * 2),
                struct.pack("<d", 100.0)[:7]):
        values = orjson.loads(good)
        values[at] = base64.b64encode(bad).decode()
        line = orjson.dumps(values) + b"\n"
        assert decode(line) is None
        assert decode_lines(good + line + good) == ([_as_journalled(rec)] * 2, 1)


def test_lines_the_previous_version_wrote_are_read() -> None:
    """tests/accounting/fixtures/lines-v2.jsonl: `fixture_records()` as version 2's code
    encoded them (the read times a JSON number each)."""
    lines = (Path(__file__).parents[1] / "accounting" / "fixtures" / "lines-v2.jsonl"
             ).read_bytes()
    assert orjson.loads(lines.split(b"\n")[0])[0] == 2
    want = [_as_journalled(r) for r in fixture_records()]
    assert decode_lines(lines) == (want, 0)
    assert [decode(line) for line in lines.split(b"\n") if line] == want


def test_version_4_carries_the_step_before_the_first_token_and_version_3_lines_are_read() -> None:
    """A record's `step_from_s` round-trips; a line of version 3 (the same fields but it,
    which ended before it) reads it as None."""
    rec = dataclasses.replace(fixture_records()[0], step_from_s=12.5)
    assert decode(encode(rec)) == _as_journalled(rec)
    values = orjson.loads(encode(rec))
    assert values[0] == VERSION == 4 and values[-1] == 12.5
    v3 = orjson.dumps([3, *values[1:-1]]) + b"\n"
    assert decode(v3) == _as_journalled(dataclasses.replace(rec, step_from_s=None))
    assert decode_lines(v3 + encode(rec)) == (
        [_as_journalled(dataclasses.replace(rec, step_from_s=None)), _as_journalled(rec)], 0)


@pytest.mark.skipif(codec.compiled_unpack is None, reason="core/_times.c was not built")
def test_the_compiled_unpack_gives_the_pythons_times_and_refusals() -> None:
    """core/_times.c reads the same floats (their bits) as unpack_times, and refuses the same
    bytes with the same ValueError."""
    assert codec.compiled_unpack is not None
    compiled = functools.partial(codec.compiled_unpack, MAX_TIME_S)
    rnd = random.Random(3)
    edges = [0.0, -0.0, 5e-324, 2.0 ** 33, math.nextafter(2.0 ** 33, 0.0), MAX_TIME_S, 1e-300]
    for _ in range(300):
        times = [rnd.choice(edges) if rnd.random() < 0.1 else rnd.uniform(0.0, 1e6)
                 for _ in range(rnd.randint(0, 200))]
        data = struct.pack(f"<{len(times)}d", *times)
        got = compiled(data)
        assert struct.pack(f"<{len(got)}d", *got) == data
        assert all(type(t) is float for t in got) and got == unpack_times(data)
        assert not gc.is_tracked(got)  # floats only: the collector need not walk it
    for bad in (struct.pack("<2d", 100.0, math.nan), struct.pack("<d", -1.0),
                struct.pack("<d", math.inf), struct.pack("<d", -math.inf),
                struct.pack("<d", math.nextafter(MAX_TIME_S, math.inf)),
                struct.pack("<3d", 1.0, 2.0, -5e-324), struct.pack("<d", 100.0)[:7]):
        with pytest.raises(ValueError) as want:
            unpack_times(bad)
        with pytest.raises(ValueError, match=str(want.value)):
            compiled(bad)
