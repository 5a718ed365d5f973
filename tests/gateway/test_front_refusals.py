"""Heads no server should take, on a real socket: a bare LF is 400 at once, an oversized head
431 and an oversized request line 414, no HTTP version 400, another version than 1.x 505 and a
transfer coding other than chunked 501, on the lean front and on connections it handed to
aiohttp, each answered in JSON and counted in wattgate_client_connection_errors_total."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import aiohttp
import orjson
import pytest

from tests.gateway.test_front import read_response
from tests.support.fake_engine import FakeEngine, fake_engine
from tests.support.gateway import make_config, running_gateway

pytestmark = pytest.mark.timeout(30)

FRONT = {  # refused by the lean front before any handover
    "bare-lf-whole-head": (b"GET /healthz HTTP/1.1\nHost: x\n\n", 400, "bad_request"),
    "bare-lf-first-line": (b"POST /v1/completions HTTP/1.1\nHost: x", 400, "bad_request"),
    "header-200k": (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
                    431, "request_header_too_large"),
    "5000-headers": (b"GET /healthz HTTP/1.1\r\n"
                     + b"".join(b"X-H%d: v\r\n" % i for i in range(5000)) + b"\r\n",
                     431, "request_header_too_large"),
    "url-100k": (b"GET /healthz?q=" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                 414, "uri_too_long"),
    # no version (HTTP/0.9), another major version, a transfer coding nobody undoes
    "http-0.9": (b"GET /healthz\r\n\r\n", 400, "bad_request"),
    "http-2.0": (b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 505,
                 "http_version_not_supported"),
    "te-gzip-chunked": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                        b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 501,
                        "transfer_coding_not_implemented"),
}
HANDED = {  # heads under the front's 16 KiB that it hands to aiohttp, which refuses them
    "header-10k": (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 10_000 + b"\r\n\r\n",
                   431, "request_header_too_large"),
    "200-headers": (b"GET /healthz HTTP/1.1\r\n"
                    + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n",
                    431, "request_header_too_large"),
    "url-10k": (b"GET /healthz?q=" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                414, "uri_too_long"),
    "cl-and-te": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "bad_request"),
    "two-lengths": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                    b"Content-Length: 3\r\n\r\n{}", 400, "bad_request"),
    "nul-in-header": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "obs-fold": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
}
REASONS = {400: "bad_request", 414: "uri_too_long", 431: "head_too_large",
           501: "transfer_coding_not_implemented", 505: "http_version_not_supported"}


def _case(value: object) -> tuple[bytes, int, str]:
    if isinstance(value, bytes):
        return value, 400, "bad_request"
    assert isinstance(value, tuple)
    return value


async def _send(port: int, data: bytes, *, after: bytes = b"") -> tuple[int, bytes, float]:
    """Send `after` (a served request, so the connection is aiohttp's) then `data`; the
    status and body of the answer to `data`, and how long it took."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if after:
            writer.write(after)
            assert (await read_response(reader))[0] == 200
        started = time.monotonic()
        writer.write(data)
        status, headers, body = await asyncio.wait_for(read_response(reader), 5)
        elapsed = time.monotonic() - started
        assert headers["content-type"].startswith("application/json")
        assert headers.get("connection", "").lower() == "close"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # and the connection closes
    finally:
        writer.close()
    return status, body, elapsed


async def _counts(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    prefix = 'wattgate_client_connection_errors_total{reason="'
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            reason, _, value = line[len(prefix):].partition('"} ')
            out[reason] = float(value)
    return out


@pytest.mark.parametrize(("cases", "after"), [
    (FRONT, b""), (HANDED, b""), (FRONT, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
], ids=["front", "handed-over", "aiohttp-keep-alive"])
async def test_refused_heads_are_answered_at_once_in_json_and_counted_by_reason(
        cases: dict[str, object], after: bytes) -> None:
    """`after`: a request aiohttp served first, so the refused head is aiohttp's to parse."""
    expected: dict[str, float] = {}
    async with fake_engine(FakeEngine(model="m")) as eng, \
            running_gateway(make_config([{"name": "e1", "url": eng.url, "precision": "bf16",
                                          "kind": "vllm"}])) as url:
        port = urlsplit(url).port
        assert port is not None
        for name, value in cases.items():
            data, want_status, want_code = _case(value)
            status, body, elapsed = await _send(port, data, after=after)
            assert (status, orjson.loads(body)["error"]["code"]) == (want_status, want_code), name
            assert elapsed < 2.0, name  # not the 10 s head deadline
            assert b"aaaa" not in body
            reason = REASONS[want_status]
            expected[reason] = expected.get(reason, 0) + 1
        assert await _counts(url) == expected
