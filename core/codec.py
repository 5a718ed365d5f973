"""The one wire format of finished requests, named and versioned: a journal line (the
write-ahead journal, accounting/journal.py) and a record in a frame of the gateway's link to
its accounting child (accounting/link.py) are the same bytes.

A line is a JSON array whose first element is the format's version, then the record's
fields in `RecordLine`'s order, newline-terminated:
`[2, "r1", "acme", "m", "e0", "bf16", "interactive", "ok", 200, true, 1780000000.0, ...]`.
msgspec's array-like Structs give the fields names in the code and positions on the wire:
encoding and decoding are each one C call that checks every field's type (a precision or
prompt source outside its vocabulary is not a record), with no per-field Python.

Versions:
- 1: the same fields without the leading version (lines written before the format had
  one); read, never written.
- 2: the version first.
- 3: the read times as one string, the base64 of their little-endian 64-bit floats, not a
  JSON number each: a stream's read times were most of its line's bytes, and turning each
  into decimal and back most of the time encoding and decoding it took (the same bits come
  back either way).
- 4: version 3's fields and, last, `step_from_s` (the engine's last token event of the step
  before the request's first token's); a line of an earlier version reads it as null.
A change of fields is a new version; the old ones stay readable as long as a journal written
by a release that wrote them may be replayed.

The latency's ITL samples and the trace ids are not carried: the ledger keeps neither, and
the samples would make a line kilobytes long.
"""

from __future__ import annotations

import dataclasses
import sys
from array import array
from collections.abc import Callable, Sequence
from functools import partial
from operator import attrgetter
from typing import Annotated, Any, Final, Literal

import msgspec

from core.records import RequestRecord
from core.timing import Latency
from core.vocab import Precision, PromptSource

VERSION: Final = 4
# A count the ledger's 64-bit INTEGER columns hold: a line with any other is not a record
Count = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
# A request's token count: past this an engine's usage is its error, not a count (the gateway
# caps what it reads here), and a few counts near 2**63 summed in an hour's rollup would
# overflow it, failing every usage read of that tenant
MAX_TOKENS: Final = 1 << 31
Tokens = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)]
# A time (wall clock or monotonic, seconds) a clock reaches: one like 1e300 is finite but its
# interval index is no 64-bit integer, and a journal line holding it made the accounting
# child fail at every replay
MAX_TIME_S: Final = 1e12  # some 31,700 years
Time = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TIME_S)]


class UnversionedLine(msgspec.Struct, array_like=True, gc=False):
    """A finished request as a line carries it (version 1 on the wire: no version field)."""

    request_id: str
    tenant: str
    model: str
    engine: str
    precision: Precision | Literal[""]
    slo_class: str
    status: str
    http_status: Count
    stream: bool
    arrived_wall_s: Time
    arrived_s: Time
    dispatched_s: Time | None
    first_byte_s: Time | None
    first_token_s: Time | None
    finished_s: Time
    read_times: tuple[Time, ...]
    read_events: tuple[Count, ...]
    prompt_tokens: Tokens
    completion_tokens: Tokens
    attempts: Count
    slo_met: bool
    prompt_source: PromptSource
    engine_done_s: Time | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    step_from_s: Time | None = None  # from version 4; earlier lines end before it


class VersionTwoLine(UnversionedLine, tag=2):
    """Version 2: the fields of version 1 behind the version number."""


class VersionThreeLine(UnversionedLine, tag=3):
    """Version 3: version 2's fields, the read times packed (`pack_times`)."""

    read_times: bytes  # type: ignore[assignment]


class RecordLine(UnversionedLine, tag=VERSION):
    """The current version: version 3's and `step_from_s`, the read times packed."""

    read_times: bytes  # type: ignore[assignment]


class FrameHead(msgspec.Struct, array_like=True, gc=False, tag=VERSION):
    """A link frame's first line: the gateway's oldest open request (wall clock; None: none)
    and the wall-clock time it sent the frame."""

    open_since_s: float | None
    sent_wall_s: float


_encoder = msgspec.json.Encoder()
_line = msgspec.json.Decoder(RecordLine | VersionThreeLine | VersionTwoLine)
_unversioned = msgspec.json.Decoder(UnversionedLine)
_lines = msgspec.json.Decoder(list[RecordLine])
_head = msgspec.json.Decoder(FrameHead)
_BIG_ENDIAN = sys.byteorder == "big"
_UNDER_2_33 = bytes(range(0x42))  # the top bytes of a double's from +0 to under 2**33
DecodeError = msgspec.DecodeError  # a line or frame that is torn, not JSON, or not a record
EncodeError = msgspec.EncodeError  # a value no line can hold (TypeError: one of no JSON type)


def pack_times(times: Sequence[float]) -> bytes:
    """Times as version 3 carries them: little-endian 64-bit floats, one after another."""
    packed = array("d", times)
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def unpack_times(data: bytes) -> tuple[float, ...]:
    """`pack_times`'s times; ValueError for bytes that are not times a clock reaches."""
    if len(data) % 8:
        raise ValueError("read times: not whole 64-bit floats")
    times = array("d")
    times.frombytes(data)
    if _BIG_ENDIAN:
        times.byteswap()
    out = tuple(times)
    # Each float's top byte (sign and exponent's top bits) below 0x42: from +0 to under 2**33
    # s, in one C pass over the bytes; the exact check only where one is not (a NaN anywhere
    # makes the sum NaN, which equals nothing, itself included)
    if data[7::8].translate(None, _UNDER_2_33) and not (
            min(out) >= 0.0 and max(out) <= MAX_TIME_S and (t := sum(out)) == t):
        raise ValueError("read times: outside 0..MAX_TIME_S")
    return out


# unpack_times in C, where it was built: one pass from the bytes to the tuple, each time
# checked as it is read (the same times, the same ValueError)
compiled_unpack: Callable[[float, bytes], tuple[float, ...]] | None
try:
    from core._times import unpack_times as compiled_unpack
except ImportError:  # pragma: no cover - a build without a C compiler
    compiled_unpack = None
_times_of: Callable[[bytes], tuple[float, ...]] = (
    unpack_times if compiled_unpack is None else partial(compiled_unpack, MAX_TIME_S))


# A line's values read from a record by name, in the line's order (the latency's three by
# their dotted path), in one C call each side of the read times: positional construction of
# the line, half the time of keywords (a record is encoded on the gateway's event loop)
_LATENCY_ON_LINE = ("ttft_s", "tpot_s", "e2e_s")
_LINE_FIELDS = [f"latency.{name}" if name in _LATENCY_ON_LINE else name
                for name in UnversionedLine.__struct_fields__]
_AT_TIMES = _LINE_FIELDS.index("read_times")
_line_before_times = attrgetter(*_LINE_FIELDS[:_AT_TIMES])
_line_after_times = attrgetter(*_LINE_FIELDS[_AT_TIMES + 1:])


def line_of(rec: RequestRecord) -> RecordLine:
    values: tuple[Any, ...] = (*_line_before_times(rec), pack_times(rec.read_times),
                               *_line_after_times(rec))
    return RecordLine(*values)


# RequestRecord's fields around its read times and its latency, in its order, each read from
# a line by name (one C call each): a record is built positionally, a third of the time of
# keywords (it is most of a line's decoding after msgspec's). A field the line lacks, or one after the
# trace (which is never carried, and is last so it may be left to its default), fails here.
_RECORD_FIELDS = [f.name for f in dataclasses.fields(RequestRecord)]
_AT_LATENCY = _RECORD_FIELDS.index("latency")
_AT_READ_TIMES = _RECORD_FIELDS.index("read_times")
_before_times = attrgetter(*_RECORD_FIELDS[:_AT_READ_TIMES])
_times_to_latency = attrgetter(*_RECORD_FIELDS[_AT_READ_TIMES + 1:_AT_LATENCY])
_after_latency = attrgetter(*_RECORD_FIELDS[_AT_LATENCY + 1:-1])
_missing = set(_RECORD_FIELDS) - {"latency", "trace"} - set(UnversionedLine.__struct_fields__)
if _missing or _RECORD_FIELDS[-1] != "trace":
    raise TypeError(f"RequestRecord's fields {sorted(_missing)} are not on the record line, or "
                    "its trace is not its last field (core/codec.py)")


def record_of(line: UnversionedLine) -> RequestRecord:
    """The record a line carries (any version), its latency without ITL samples; ValueError
    for version 3's read times that are not times."""
    times = (_times_of(line.read_times) if isinstance(line, (RecordLine, VersionThreeLine))
             else line.read_times)
    values: tuple[Any, ...] = (*_before_times(line), times, *_times_to_latency(line),
                               Latency(line.ttft_s, line.tpot_s, line.e2e_s, (), ()),
                               *_after_latency(line))
    return RequestRecord(*values)


def encode(rec: RequestRecord) -> bytes:
    """One line (newline-terminated) for `rec`. Raises msgspec.EncodeError or TypeError for a
    value no line can hold."""
    buf = bytearray()
    _encoder.encode_into(line_of(rec), buf, -1)
    buf += b"\n"
    return bytes(buf)


def encode_lines(recs: Sequence[RequestRecord]) -> bytes:
    """The lines of `recs`, concatenated."""
    buf = bytearray()
    for rec in recs:
        _encoder.encode_into(line_of(rec), buf, -1)
        buf += b"\n"
    return bytes(buf)


def decode(line: bytes) -> RequestRecord | None:
    """The record of one line of any version; None for a line that is torn or not a record."""
    try:
        return record_of(_line.decode(line))
    except (msgspec.DecodeError, ValueError):
        pass
    try:
        return record_of(_unversioned.decode(line))
    except msgspec.DecodeError:
        return None


def decode_lines(lines: bytes) -> tuple[list[RequestRecord], int]:
    """The records of newline-terminated lines, and the count of lines that are not one.
    The usual case, every line of the current version, is one decoder call."""
    if not lines:
        return [], 0
    try:
        # the lines as one JSON array (a line holds no raw newline: JSON escapes them)
        got = _lines.decode(b"[" + lines[:-1].replace(b"\n", b",") + b"]")
    except msgspec.DecodeError:
        return _one_by_one(lines)
    try:
        return [record_of(line) for line in got], 0
    except ValueError:  # a line's read times are not times: line by line, to skip it
        return _one_by_one(lines)


def _one_by_one(lines: bytes) -> tuple[list[RequestRecord], int]:
    out: list[RequestRecord] = []
    bad = 0
    for line in lines.split(b"\n"):
        if line:
            rec = decode(line)
            if rec is None:
                bad += 1
            else:
                out.append(rec)
    return out, bad


def encode_head(head: FrameHead) -> bytes:
    return _encoder.encode(head) + b"\n"


def decode_head(line: bytes) -> FrameHead:
    """A frame's head line; raises DecodeError where it is not one."""
    return _head.decode(line)
