"""HTTP/1.1 response parsing (wire.response): heads, bodies by length / chunked / close, across
any read split; request encoding (wire.request)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire.request import Origin, encode_request
from wire.response import MAX_HEAD_BYTES, MalformedResponse, ResponseHead, ResponseParser

SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n" \
           b"transfer-encoding: chunked\r\n\r\n"


def chunked(pieces: list[bytes], *, ext: bool = False, trailer: bytes = b"") -> bytes:
    out = b"".join(b"%x%s\r\n%s\r\n" % (len(p), b";x=1" if ext else b"", p) for p in pieces if p)
    return out + b"0\r\n" + trailer + b"\r\n"


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def feed_all(parser: ResponseParser, reads: list[bytes]) -> list[bytes]:
    return [parser.feed(r) for r in reads]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.binary(min_size=0, max_size=40), max_size=12),
       cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=20),
       ext=st.booleans(), trailer=st.sampled_from([b"", b"x-t: 1\r\n"]))
def test_chunked_body_is_exact_for_any_read_boundaries(pieces: list[bytes], cuts: list[int],
                                                        ext: bool, trailer: bytes) -> None:
    """De-chunked body == the pieces joined, whatever the read split; one result per read."""
    wire = SSE_HEAD + chunked(pieces, ext=ext, trailer=trailer)
    parser = ResponseParser()
    reads = split_at(wire, cuts)
    outs = feed_all(parser, reads)
    assert len(outs) == len(reads)
    assert b"".join(outs) == b"".join(pieces)
    assert parser.done and not parser.extra
    assert parser.head is not None and parser.head.chunked
    assert parser.head.content_type == "text/event-stream"


def test_one_read_holding_many_chunks_gives_one_joined_result() -> None:
    events = [b"data: {\"text\":\"t%d\"}\n\n" % i for i in range(16)]
    parser = ResponseParser()
    assert parser.feed(SSE_HEAD) == b""
    assert parser.feed(chunked(events)) == b"".join(events)
    assert parser.done


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400), max_size=10))
def test_content_length_body_for_any_read_boundaries(body: bytes, cuts: list[int]) -> None:
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: application/json\r\n\r\n" \
        % len(body) + body
    parser = ResponseParser()
    assert b"".join(feed_all(parser, split_at(wire, cuts))) == body
    assert parser.done and parser.head is not None and parser.head.content_length == len(body)
    assert parser.head.keep_alive


@pytest.mark.parametrize("after", [b"HTTP/1.1", b"junk", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nzz"])
def test_bytes_past_the_response_are_flagged_and_not_relayed(after: bytes) -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + after) == b"ok"
    assert parser.done and parser.extra
    assert parser.feed(b"more") == b""


def test_close_delimited_body_ends_at_eof_only() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nab") == b"ab"
    assert parser.feed(b"cd") == b"cd"
    assert not parser.done and parser.until_close
    parser.feed_eof()
    assert parser.done and parser.head is not None and not parser.head.keep_alive


@pytest.mark.parametrize("wire", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
    SSE_HEAD + b"5\r\nab",
    b"HTTP/1.1 200 OK\r\nContent",
])
def test_eof_before_the_end_is_incomplete(wire: bytes) -> None:
    parser = ResponseParser()
    parser.feed(wire)
    with pytest.raises(MalformedResponse):
        parser.feed_eof()


@pytest.mark.parametrize("wire", [
    b"HTTP/2 200 OK\r\n\r\n",
    b"HTTP/1.1 2x0 OK\r\n\r\n",
    b"garbage\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nbad name: v\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    SSE_HEAD + b"zz\r\nab\r\n",
    SSE_HEAD + b"0x2\r\nab\r\n",
    SSE_HEAD + b"2\r\nabXY",
    SSE_HEAD + b"1" * 2000,
    b"HTTP/1.1 200 OK\r\nx: " + b"a" * (MAX_HEAD_BYTES + 10),
])
def test_malformed_responses_are_refused(wire: bytes) -> None:
    parser = ResponseParser()
    with pytest.raises(MalformedResponse):
        parser.feed(wire)


def test_interim_1xx_is_skipped_and_204_has_no_body() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    assert parser.done and parser.head is not None and parser.head.status == 204


@pytest.mark.parametrize(("head", "keep_alive"), [
    (b"HTTP/1.1 200 OK\r\nConnection: close", False),
    (b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, Close", False),
    (b"HTTP/1.1 200 OK", True),
    (b"HTTP/1.0 200 OK", False),
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive", True),
])
def test_keep_alive_follows_version_and_connection_header(head: bytes, keep_alive: bool) -> None:
    assert head_of(head + b"\r\nContent-Length: 0").keep_alive is keep_alive


def head_of(raw: bytes) -> ResponseHead:
    parser = ResponseParser()
    parser.feed(raw + b"\r\n\r\n")
    assert parser.head is not None
    return parser.head


def test_head_fields() -> None:
    head = head_of(b"HTTP/1.1 404 Not Found\r\nContent-Type: Application/JSON; charset=utf-8"
                   b"\r\nContent-Length: 0")
    assert (head.status, head.content_type, head.content_length, head.chunked) == \
        (404, "application/json", 0, False)
    chunked = head_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked")
    assert chunked.chunked and chunked.content_length is None


def test_request_is_one_buffer_with_host_length_and_headers_in_order() -> None:
    origin = Origin.from_url("http://127.0.0.1:8000/base/")
    wire = encode_request("POST", origin.base_path + "/v1/completions", origin.host_header,
                          [("Content-Type", "application/json"), ("x-request-id", "r1")], b"{}")
    assert wire == (b"POST /base/v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
                    b"Content-Length: 2\r\nContent-Type: application/json\r\n"
                    b"x-request-id: r1\r\n\r\n{}")
    assert Origin.from_url("https://engine").host_header == "engine"
    assert Origin.from_url("https://engine").port == 443


@pytest.mark.parametrize("header", [("x-a", "v\r\nInjected: 1"), ("x-a\n", "v"), ("x-a", "v\0")])
def test_request_refuses_header_splitting(header: tuple[str, str]) -> None:
    with pytest.raises(ValueError):
        encode_request("POST", "/", "h", [header], b"")


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=8))
def test_a_header_is_found_by_lower_case_name_for_any_read_split(cuts: list[int]) -> None:
    """What a load client reads of a head (the gateway's request id), however it arrives."""
    wire = (b"HTTP/1.1 200 OK\r\nX-Wattgate-Request-Id: abc\r\nx-wattgate-request-id: later\r\n"
            b"Content-Length: 2\r\n\r\n{}")
    parser = ResponseParser()
    body = b"".join(feed_all(parser, split_at(wire, cuts)))
    assert parser.head is not None and body == b"{}"
    assert parser.head.header(b"x-wattgate-request-id") == b"abc"  # the first, as sent
    assert parser.head.header(b"x-absent") is None
