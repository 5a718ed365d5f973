"""The one response encoder (wire/response_encoder.py): what it writes, the wire's own response
parser reads back as sent, whole or streamed, on a kept or a closing connection."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from wire.response import ResponseParser
from wire.response_encoder import (
    LAST_CHUNK,
    chunk,
    encode_response,
    encode_stream_head,
)

HEADERS = {"Retry-After": "7", "x-wattgate-request-id": "r-1"}
DATE = re.compile(rb"\r\nDate: \w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT\r\n")


def parsed(wire: bytes) -> tuple[ResponseParser, bytes]:
    parser = ResponseParser()
    body = parser.feed(wire)
    return parser, body


@settings(max_examples=100, deadline=None)
@given(body=st.binary(max_size=300), keep_alive=st.booleans(),
       status=st.sampled_from([200, 400, 429, 503, 599]))
def test_a_whole_answer_reads_back_as_sent(body: bytes, keep_alive: bool, status: int) -> None:
    parser, got = parsed(encode_response(status, body, "application/json", HEADERS,
                                         keep_alive))
    head = parser.head
    assert parser.done and not parser.extra and got == body
    assert head is not None and head.status == status and head.keep_alive == keep_alive
    assert (head.content_type, head.content_length) == ("application/json", len(body))
    assert head.header(b"retry-after") == b"7" and head.header(b"x-wattgate-request-id") == b"r-1"


@settings(max_examples=100, deadline=None)
@given(pieces=st.lists(st.binary(min_size=1, max_size=80), max_size=8), keep_alive=st.booleans())
def test_a_stream_reads_back_piece_by_piece_and_ends_with_the_last_chunk(
        pieces: list[bytes], keep_alive: bool) -> None:
    parser, got = parsed(encode_stream_head({"x-wattgate-request-id": "r-2"}, keep_alive))
    head = parser.head
    assert head is not None and got == b"" and not parser.done
    assert (head.status, head.content_type, head.chunked) == (200, "text/event-stream", True)
    assert head.keep_alive == keep_alive
    for piece in pieces:
        assert parser.feed(chunk(piece)) == piece
    assert parser.feed(LAST_CHUNK) == b"" and parser.done and not parser.extra


def test_the_head_orders_fixed_lines_date_headers_then_connection_close() -> None:
    wire = encode_response(429, b"{}", "application/json", HEADERS, keep_alive=False)
    assert DATE.search(wire)
    assert DATE.sub(b"\r\n", wire) == (
        b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\nRetry-After: 7\r\nx-wattgate-request-id: r-1\r\n"
        b"Connection: close\r\n\r\n{}")


def test_a_status_http_does_not_name_still_gets_a_status_line() -> None:
    assert encode_response(599, b"", "text/plain", {}, True).startswith(
        b"HTTP/1.1 599 Unknown\r\n")
