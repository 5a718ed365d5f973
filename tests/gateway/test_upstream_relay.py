"""The gateway on its lean upstream client, against scripted raw engines: keep-alive reuse
through the proxy, and a mid-stream stall ending the stream with upstream_timeout."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from core.records import RequestRecord
from gateway.config import GatewayConfig
from tests.support.gateway import KEY_A, make_config, running_gateway
from tests.support.raw_engine import RawEngine, raw_engine

pytestmark = pytest.mark.timeout(30)
AUTH = {"Authorization": f"Bearer {KEY_A}", "Content-Type": "application/json"}


def event(text: str) -> bytes:
    data = b"data: " + orjson.dumps({"choices": [{"index": 0, "text": text}]}) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


USAGE = b"data: " + orjson.dumps({"choices": [], "usage": {"prompt_tokens": 1,
                                                           "completion_tokens": 2}}) + b"\n\n"
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" \
              b"Transfer-Encoding: chunked\r\n\r\n"


def engine_config(eng: RawEngine, **extra: object) -> GatewayConfig:
    return make_config([{"name": "raw", "url": f"http://127.0.0.1:{eng.port}",
                         "precision": "bf16"}], health={"interval_s": 30}, **extra)


class Posts:
    """Which server connections carried completions (health checks use their own)."""

    def __init__(self) -> None:
        self.writers: set[int] = set()

    def note(self, eng: RawEngine, writer: asyncio.StreamWriter) -> bool:
        is_post = eng.requests[-1].startswith(b"POST ")
        if is_post:
            self.writers.add(id(writer))
        return is_post


async def test_streams_through_the_gateway_reuse_one_engine_connection() -> None:
    posts = Posts()
    eng_box: list[RawEngine] = []

    async def engine(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        if not posts.note(eng_box[0], writer):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return True
        writer.write(STREAM_HEAD + event(" a") + event(" b")
                     + b"%x\r\n%s\r\n" % (len(USAGE), USAGE) + b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        return True

    records: list[RequestRecord] = []
    async with raw_engine(engine) as eng:
        eng_box.append(eng)
        async with running_gateway(engine_config(eng), sinks=[records.append]) as gw, \
                aiohttp.ClientSession() as s:
            for _ in range(5):
                async with s.post(gw + "/v1/completions", headers=AUTH, data=orjson.dumps(
                        {"model": "m", "prompt": "x", "stream": True})) as r:
                    body = await r.read()
                assert r.status == 200 and body.endswith(b"data: [DONE]\n\n")
                assert b'"usage"' not in body  # stripped: the client did not ask for it
    assert len(posts.writers) == 1  # five requests, one kept-alive engine connection
    assert [rec.status for rec in records] == ["ok"] * 5
    assert all(rec.completion_tokens == 2 for rec in records)


async def test_midstream_stall_ends_the_stream_with_upstream_timeout() -> None:
    eng_box: list[RawEngine] = []
    posts = Posts()

    async def engine(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        if not posts.note(eng_box[0], writer):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return True
        writer.write(STREAM_HEAD + event(" a"))
        await writer.drain()
        await asyncio.sleep(3)  # then silence, longer than the read timeout
        return False

    records: list[RequestRecord] = []
    async with raw_engine(engine) as eng:
        eng_box.append(eng)
        cfg = engine_config(eng, timeouts={"read_s": 0.3})
        payload = orjson.dumps({"model": "m", "prompt": "x", "stream": True})
        async with running_gateway(cfg, sinks=[records.append]) as gw, \
                aiohttp.ClientSession() as s, \
                s.post(gw + "/v1/completions", headers=AUTH, data=payload) as r:
            body = await r.read()
    events = [e for e in body.split(b"\n\n") if e]
    assert len(events) == 2 and b'"upstream_timeout"' in events[-1]
    assert records[-1].status == "upstream_timeout" and records[-1].completion_tokens == 1
