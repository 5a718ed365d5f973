"""Against real vLLM CPU servers: a stream the client cuts off carries vLLM's own prompt count
(the gateway asks the engine's `POST /tokenize`), and a client that closes right after the
`finish_reason` chunk, without asking for usage, is `ok` every time."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from tests.realengine import accesslog
from tests.realengine.conftest import ALIAS, SERVED_NAME, Gateway, VllmServer
from tests.support.hangup import raw_stream

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(600)]
PROMPT = "the carbon of a request that the client cut off after its first token"
MESSAGES: list[Any] = [{"role": "system", "content": "answer briefly"},
                       {"role": "user", "content": "how many joules does a token cost?"}]


async def hang_up(gw: Gateway, path: str, body: dict[str, Any], stop_at: bytes) -> str:
    """POST on a raw socket, read until `stop_at` arrived, close at once; the request id."""
    got = await raw_stream(gw.url, path, body, stop_at, key=gw.api_key, read_timeout_s=60)
    head = got.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    rid = next(line.split(":", 1)[1].strip() for line in head.split("\r\n")
               if line.startswith("x-wattgate-request-id:"))
    assert stop_at in got, got[-300:]
    return rid


async def vllm_prompt_tokens(server: VllmServer, path: str, body: dict[str, Any]) -> int:
    """vLLM's own usage.prompt_tokens for the same prompt, from a request it answers whole."""
    parts = urlsplit(server.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    data = orjson.dumps({**body, "model": SERVED_NAME, "max_tokens": 1, "stream": False})
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    raw = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    return int(orjson.loads(raw.split(b"\r\n\r\n", 1)[1])["usage"]["prompt_tokens"])


async def test_cut_off_streams_carry_vllms_prompt_count(
        logged_gateway: Gateway, vllm_servers: tuple[VllmServer, ...]) -> None:
    log = logged_gateway.access_log
    assert log is not None
    cases: list[tuple[str, dict[str, Any]]] = [
        ("/v1/completions", {"prompt": PROMPT}),
        ("/v1/chat/completions", {"messages": MESSAGES})]
    ids: dict[str, int] = {}
    for path, body in cases:
        expected = await vllm_prompt_tokens(vllm_servers[0], path, body)
        for _ in range(4):  # round robin: twice on each server
            # hang up as soon as the answer's head arrives; ignore_eos keeps the tiny random
            # model from ending the stream at once
            rid = await hang_up(logged_gateway, path, {**body, "model": ALIAS, "stream": True,
                                                       "max_tokens": 200, "ignore_eos": True},
                                b"\r\n\r\n")
            ids[rid] = expected
    recs = accesslog.by_id(log, set(ids))
    # The tiny model streams fast: a stream whose finish_reason was handed to the client's
    # socket before its close was seen is `ok` (with the engine's usage). The rest are cut
    # off: one whose engine had already sent its usage (read in one go before the write to the
    # closed socket failed) keeps that count, the others carry the engine's /tokenize count,
    # and at least one must. Every way the count is vLLM's own.
    cut = [rid for rid in ids if recs[rid]["status"] == "client_disconnected"]
    assert cut, [recs[rid]["status"] for rid in ids]
    for rid, expected in ids.items():
        rec = recs[rid]
        assert rec["status"] in ("client_disconnected", "ok"), rec
        sources = {"engine_tokenize", "engine"} if rid in cut else {"engine"}
        assert rec["prompt_source"] in sources and rec["prompt_tokens"] == expected, rec
    assert any(recs[rid]["prompt_source"] == "engine_tokenize" for rid in cut), \
        [(recs[rid]["completion_tokens"], recs[rid]["prompt_source"]) for rid in cut]


async def test_clients_closing_after_the_finish_reason_chunk_are_all_ok(
        logged_gateway: Gateway) -> None:
    log = logged_gateway.access_log
    assert log is not None
    body = {"model": ALIAS, "prompt": PROMPT, "max_tokens": 4, "stream": True,
            "temperature": 0, "ignore_eos": True}
    rids = await asyncio.gather(*(hang_up(logged_gateway, "/v1/completions", body,
                                          b'"finish_reason":"length"') for _ in range(20)))
    recs = accesslog.by_id(log, set(rids))
    assert [recs[r]["status"] for r in rids] == ["ok"] * 20
