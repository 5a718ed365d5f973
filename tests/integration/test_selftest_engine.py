"""The self-test engine (loadgen/selftest_engine.py, a real HTTP server on a free 127.0.0.1
port) read over raw sockets: it parses heads with wire.request_head and answers through
wire.response_encoder, so keep-alive, pipelining, Connection: close and bad input behave as
HTTP/1.1 says, and bad input gets an OpenAI-style JSON error instead of a dropped connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
import pytest

from loadgen.selftest_engine import MAX_TOKENS, EngineTiming, SelftestEngine
from wire.response import ResponseHead, ResponseParser

pytestmark = pytest.mark.timeout(30)


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST %b HTTP/1.1\r\nHost: e\r\nContent-Type: application/json\r\n%b"
            b"Content-Length: %d\r\n\r\n%b" % (path.encode(), extra, len(body), body))


COMPLETION = post("/v1/completions", orjson.dumps({"prompt": "a b c", "max_tokens": 3}))


@asynccontextmanager
async def engine_conn(timing: EngineTiming | None = None
                      ) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    engine = SelftestEngine(timing or EngineTiming())
    port = await engine.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        await engine.close()


async def answer(reader: asyncio.StreamReader) -> tuple[ResponseHead, bytes]:
    """One whole response, read with the wire's parser."""
    parser = ResponseParser()
    body = b""
    while not parser.done:
        data = await asyncio.wait_for(reader.read(65536), 10)
        if not data:
            parser.feed_eof()
            break
        body += parser.feed(data)
    assert parser.head is not None
    return parser.head, body


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(1), 10) == b""


def parsed(response: bytes) -> tuple[ResponseHead, bytes]:
    parser = ResponseParser()
    body = parser.feed(response)
    assert parser.done and parser.head is not None
    return parser.head, body


@pytest.mark.parametrize("timing", [EngineTiming(), EngineTiming(ttft_s=0.005, itl_s=0.002)])
async def test_pipelined_requests_are_answered_in_order_on_one_kept_connection(
        timing: EngineTiming) -> None:
    """Timed streams too: the second answer waits for the first to end (its head and
    events were written between the first's)."""
    async with engine_conn(timing) as (reader, writer):
        writer.write(b"GET /health HTTP/1.1\r\nHost: e\r\n\r\n" + COMPLETION + COMPLETION
                     + b"GET /v1/models HTTP/1.1\r\nHost: e\r\nConnection: close\r\n\r\n")
        everything = await asyncio.wait_for(reader.read(-1), 10)  # to the close
    first, *streams, last = (parsed(b"HTTP/1.1 " + r)
                             for r in everything.split(b"HTTP/1.1 ")[1:])
    assert [(h.status, h.keep_alive, body) for h, body in (first, last)] == [
        (200, True, b"{}"), (200, False, b"{}")]
    assert len(streams) == 2
    for head, stream in streams:
        assert (head.status, head.content_type, head.chunked) == (200, "text/event-stream", True)
        assert stream.count(b'"text":"tok "') == 3
        assert b'"prompt_tokens":3,"completion_tokens":3' in stream
        assert stream.endswith(b"data: [DONE]\n\n") and head.header(b"date") is not None


async def test_a_timed_stream_to_a_closing_client_ends_then_closes() -> None:
    async with engine_conn(EngineTiming(ttft_s=0.01, itl_s=0.01)) as (reader, writer):
        writer.write(post("/v1/completions", b'{"prompt": "a", "max_tokens": 4}',
                          b"Connection: close\r\n"))
        head, stream = await answer(reader)
        assert (head.status, head.keep_alive) == (200, False)
        assert stream.count(b'"text":"tok "') == 4 and stream.endswith(b"[DONE]\n\n")
        assert await closed(reader)


@pytest.mark.parametrize(("request_bytes", "status", "code"), [
    (post("/v1/completions", b"{not json"), 400, "bad_request"),
    (post("/v1/chat/completions", b'{"max_tokens": 2}'), 400, "bad_request"),  # no messages
    (post("/v1/completions", b'{"max_tokens": -3}'), 400, "bad_request"),
    (post("/v2/completions", b"{}"), 404, "not_found"),
    (b"DELETE /v1/completions HTTP/1.1\r\nHost: e\r\n\r\n", 404, "not_found"),
    (b"POST /v1/completions HTTP/1.1\nHost: e\n\n", 400, "bad_request"),  # bare LF
    # a count past 64 bits (a traceback); past MAX_TOKENS (1e9 would be 80 GB in one write)
    (post("/v1/completions", b'{"max_tokens": 1e20}'), 400, "bad_request"),
    (post("/v1/completions", b'{"max_tokens": %d}' % (MAX_TOKENS + 1)), 400, "bad_request"),
    # stalls the loop's timers cannot take (a traceback, the connection left open)
    (post("/v1/completions", b'{"max_tokens": 2}', b"x-sim-fault: stall-ms:nan\r\n"), 400,
     "bad_request"),
    (post("/v1/completions", b'{"max_tokens": 2}', b"x-sim-fault: stall-ms:inf\r\n"), 400,
     "bad_request"),
])
async def test_bad_input_gets_a_json_error_and_a_close(request_bytes: bytes, status: int,
                                                       code: str) -> None:
    async with engine_conn() as (reader, writer):
        writer.write(request_bytes)
        head, body = await answer(reader)
        assert (head.status, head.content_type, head.keep_alive) == (status, "application/json",
                                                                     False)
        assert orjson.loads(body)["error"]["code"] == code
        assert await closed(reader)
