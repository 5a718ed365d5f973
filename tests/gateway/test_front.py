"""The lean front on a real socket: keep-alive, pipelining, hand-over to aiohttp, closing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import orjson
import pytest

from core.records import RequestRecord
from tests.support.fake_engine import FakeEngine, fake_engine
from tests.support.gateway import KEY_A, make_config, running_gateway

pytestmark = pytest.mark.timeout(30)

Response = tuple[int, dict[str, str], bytes]


def request(path: str = "/v1/completions", body: bytes | None = None, *,
            extra: str = "", stream: bool = False) -> bytes:
    if body is None:
        body = orjson.dumps({"model": "m", "prompt": "hi", "max_tokens": 3, "stream": stream})
    return (f"POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {KEY_A}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            ).encode() + body


async def read_response(reader: asyncio.StreamReader) -> Response:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


@contextlib.asynccontextmanager
async def gateway(engine: FakeEngine, records: list[RequestRecord] | None = None,
                  front: bool = True, **extra: object) -> AsyncIterator[tuple[str, int]]:
    sinks = [records.append] if records is not None else []
    endpoint = {"name": "e1", "url": engine.url, "precision": "bf16", "kind": "vllm"}
    async with running_gateway(make_config([endpoint], **extra), sinks=sinks,
                               front=front) as url:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        yield parts.hostname, parts.port


async def test_keep_alive_and_pipelined_requests_are_answered_in_order() -> None:
    """Three requests in one write on one connection, then two more one by one: five answers,
    in order, on the same connection, each with its own request id."""
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m", tokens=3)) as eng, \
            gateway(eng, records) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request() + request(stream=True) + request("/v1/chat/completions",
                     orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})))
        answers = [await read_response(reader) for _ in range(3)]
        for stream in (False, True):
            writer.write(request(stream=stream))
            answers.append(await read_response(reader))
        writer.close()
        await writer.wait_closed()
    assert [a[0] for a in answers] == [200] * 5
    assert answers[1][1]["content-type"] == "text/event-stream"
    assert answers[1][2].endswith(b"data: [DONE]\n\n") and b"tok" in answers[1][2]
    assert orjson.loads(answers[2][2])["usage"]["completion_tokens"] == 3
    assert len({a[1]["x-wattgate-request-id"] for a in answers}) == 5
    assert "date" in answers[0][1]
    assert [r.stream for r in records] == [False, True, False, False, True]


async def test_a_request_split_into_single_bytes_is_served() -> None:
    async with fake_engine(FakeEngine(model="m")) as eng, gateway(eng) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        for byte in request(stream=True):
            writer.write(bytes([byte]))
            await writer.drain()
        status, _, body = await read_response(reader)
        writer.close()
    assert status == 200 and body.endswith(b"data: [DONE]\n\n")


async def test_other_routes_hand_the_connection_to_aiohttp_which_keeps_serving_it() -> None:
    """GET /healthz first (aiohttp's), then completions on the same connection still work,
    as does a chunked upload (aiohttp's too)."""
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m")) as eng, \
            gateway(eng, records) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        health = await read_response(reader)
        writer.write(request())
        completion = await read_response(reader)
        reader2, writer2 = await asyncio.open_connection(host, port)
        body = orjson.dumps({"model": "m", "prompt": "hi", "max_tokens": 2})
        writer2.write(request(body=b"").replace(b"Content-Length: 0\r\n",
                                                b"Transfer-Encoding: chunked\r\n")
                      + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
        chunked = await read_response(reader2)
        for w in (writer, writer2):
            w.close()
    assert health[0] == 200 and orjson.loads(health[2]) == {"status": "ok"}
    assert completion[0] == 200 and orjson.loads(completion[2])["object"] == "completion"
    assert chunked[0] == 200 and orjson.loads(chunked[2])["usage"]["completion_tokens"] == 2
    assert [r.status for r in records] == ["ok", "ok"]


async def test_connection_close_is_honoured() -> None:
    async with fake_engine(FakeEngine(model="m")) as eng, gateway(eng) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request(extra="Connection: close\r\n"))
        status, headers, _ = await read_response(reader)
        rest = await asyncio.wait_for(reader.read(), 5)  # EOF: the gateway closed
        writer.close()
    assert status == 200 and headers["connection"] == "close" and rest == b""


async def test_idle_keep_alive_connections_are_closed_after_listen_keepalive_s() -> None:
    async with fake_engine(FakeEngine(model="m")) as eng, \
            gateway(eng, listen={"host": "127.0.0.1", "port": 0, "keepalive_s": 0.2}) as (h, p):
        reader, writer = await asyncio.open_connection(h, p)
        writer.write(request())
        status, _, _ = await read_response(reader)
        rest = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert status == 200 and rest == b""


async def test_bad_request_on_the_front_is_a_json_error_and_recorded() -> None:
    """Errors the proxy raises answer through the front with status, JSON and request id."""
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m")) as eng, gateway(eng, records) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request(body=b"{nope"))
        status, headers, body = await read_response(reader)
        writer.write(request())  # the connection stays usable
        after = await read_response(reader)
        writer.close()
    assert status == 400 and orjson.loads(body)["error"]["code"] == "invalid_json"
    assert headers["content-type"] == "application/json" and "x-wattgate-request-id" in headers
    assert after[0] == 200
    assert [r.status for r in records] == ["invalid_json", "ok"]


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
async def test_a_slow_reader_gets_the_whole_stream(front: bool) -> None:
    """A client that stops reading (socket buffers fill, writing pauses) still gets every
    byte once it reads again, on either server (one relay, two back-pressure sources)."""
    async with fake_engine(FakeEngine(model="m", tokens=4000, tokens_per_event=1)) as eng, \
            gateway(eng, front=front) as (host, port):
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
        body = orjson.dumps({"model": "m", "prompt": "hi", "max_tokens": 4000, "stream": True})
        writer.write(request(body=body))
        await asyncio.sleep(0.5)  # the gateway's writes back up meanwhile
        status, _, streamed = await read_response(reader)
        writer.close()
    assert status == 200 and streamed.count(b"data: ") == 4001  # 4000 tokens + [DONE]
