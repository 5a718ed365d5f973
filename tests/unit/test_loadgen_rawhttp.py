"""The raw HTTP/1.1 response parser: chunked, Content-Length and close-delimited bodies, split
at any byte, give the same body bytes, status and request id, and end the request once."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen import rawhttp

BODY = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n'


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos = [], 0
    for n in sizes:
        part = body[pos: pos + n]
        if part:
            out.append(b"%x\r\n%s\r\n" % (len(part), part))
        pos += n
    if pos < len(body):
        out.append(b"%x\r\n%s\r\n" % (len(body) - pos, body[pos:]))
    return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nx-wattgate-request-id: abc\r\n\r\n"
            + b"".join(out) + b"0\r\n\r\n")


class FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> None:
        return None


def feed(wire: bytes, cuts: list[int]) -> tuple[rawhttp._Conn, bytes, asyncio.Future[None]]:
    loop = asyncio.new_event_loop()
    try:
        conn = rawhttp._Conn()
        conn.connection_made(FakeTransport())  # type: ignore[arg-type]
        got: list[bytes] = []
        asyncio.set_event_loop(loop)

        async def go() -> asyncio.Future[None]:
            fut = conn.request(b"GET / HTTP/1.1\r\n\r\n", got.append, b"x-wattgate-request-id")
            pos = 0
            for c in [*sorted(set(cuts)), len(wire)]:
                if c > pos:
                    conn.data_received(wire[pos:c])
                    pos = c
            return fut

        fut = loop.run_until_complete(go())
        return conn, b"".join(got), fut
    finally:
        asyncio.set_event_loop(None)
        loop.close()


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), max_size=6),
       cuts=st.lists(st.integers(0, 400), max_size=8))
def test_chunked_bodies_survive_any_split(sizes: list[int], cuts: list[int]) -> None:
    wire = chunked(BODY, sizes)
    conn, body, fut = feed(wire, [c for c in cuts if c < len(wire)])
    assert body == BODY
    assert fut.done() and fut.exception() is None
    assert (conn.status, conn.request_id, conn.keep_alive) == (200, "abc", True)


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(0, 200), max_size=6))
def test_content_length_bodies_survive_any_split(cuts: list[int]) -> None:
    wire = b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    conn, body, fut = feed(wire, [c for c in cuts if c < len(wire)])
    assert body == BODY and fut.done() and conn.status == 404


def test_close_delimited_body_ends_at_connection_close() -> None:
    wire = b"HTTP/1.0 200 OK\r\n\r\n" + BODY
    conn, body, fut = feed(wire, [])
    assert body == BODY and not fut.done() and not conn.keep_alive
    conn.connection_lost(None)
    assert fut.done() and fut.exception() is None


def test_a_malformed_status_line_fails_the_request() -> None:
    _, _, fut = feed(b"HTTP/1.1 abc OK\r\n\r\n", [])
    assert fut.done() and isinstance(fut.exception(), rawhttp.HttpError)


def test_request_bytes_carry_host_path_prefix_and_length() -> None:
    pool = rawhttp.Pool("http://127.0.0.1:8080/base", 4, 1.0)
    wire = rawhttp.request_bytes(pool, "/v1/completions", {"Authorization": "Bearer k"}, b"{}")
    assert wire.startswith(b"POST /base/v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n")
    assert wire.endswith(b"Content-Length: 2\r\n\r\n{}")
    with pytest.raises(ValueError, match="http://"):
        rawhttp.Pool("https://x", 1, 1.0)
