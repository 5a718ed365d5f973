"""Requests are recorded by what reached the client, and keep their tokens however they end.

Real clients (the `openai` SDK, GuideLLM) close the connection as soon as they read
`data: [DONE]`; engines often send `[DONE]` in a write of its own, before the end of the
response. Such a request is `ok`. A stream that does end early keeps the tokens it relayed and its
prompt's tokens, counted by the gateway when the engine's usage never came.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from core.records import RequestRecord
from core.tokenizer import load_tokenizer
from tests.support.fake_engine import FakeEngine, fake_engine
from tests.support.gateway import KEY_A, make_config, raw_config, running_gateway
from tests.support.hangup import raw_stream
from tests.support.tokenizer import train_tiny_tokenizer

pytestmark = pytest.mark.timeout(60)
AUTH = {"Authorization": f"Bearer {KEY_A}"}
PROMPT = "the energy of a token per joule and the carbon of a batch"


def ep(engine: FakeEngine) -> dict[str, Any]:
    return {"name": "e1", "url": engine.url, "precision": "bf16", "kind": "vllm"}


async def wait_for(records: list[RequestRecord], n: int) -> None:
    for _ in range(200):
        if len(records) >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len(records)} records, expected {n}")


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_client_closing_right_after_done_is_ok_with_all_its_tokens(front: bool, path: str
                                                                        ) -> None:
    """The engine pauses between `[DONE]` and the end of its response; the client hangs up in
    that pause. Every such request is `ok`, with the engine's usage."""
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m", tokens=6, done_gap_s=0.3)) as eng, \
            running_gateway(make_config([ep(eng)]), sinks=[records.append], front=front) as gw:
        body = {"model": "m", "max_tokens": 6, "stream": True, "prompt": PROMPT,
                "messages": [{"role": "user", "content": PROMPT}]}
        for _ in range(5):
            got = await raw_stream(gw, path, body, b"data: [DONE]")
            assert b"data: [DONE]" in got
        await wait_for(records, 5)
    assert [r.status for r in records] == ["ok"] * 5
    assert all(r.completion_tokens == 6 and r.prompt_tokens == 5 for r in records)
    assert all(r.prompt_source == "engine" and r.slo_met for r in records)


async def test_client_closing_after_the_usage_chunk_it_asked_for_is_ok() -> None:
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m", tokens=4, done_gap_s=0.3)) as eng, \
            running_gateway(make_config([ep(eng)]), sinks=[records.append]) as gw:
        body = {"model": "m", "max_tokens": 4, "stream": True, "prompt": PROMPT,
                "stream_options": {"include_usage": True}}
        got = await raw_stream(gw, "/v1/completions", body, b'"usage"')
        assert b'"usage"' in got
        await wait_for(records, 1)
    assert records[0].status == "ok" and records[0].completion_tokens == 4


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
async def test_disconnect_keeps_relayed_tokens_and_an_estimated_prompt(front: bool) -> None:
    """No tokenizer configured: the prompt is estimated at 4 bytes per token, and flagged."""
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m", itl_s=0.02)) as eng, \
            running_gateway(make_config([ep(eng)]), sinks=[records.append], front=front) as gw:
        body = {"model": "m", "max_tokens": 500, "stream": True, "prompt": PROMPT}
        await raw_stream(gw, "/v1/completions", body, b"tok")  # hang up at the first token
        await wait_for(records, 1)
    rec = records[0]
    assert rec.status == "client_disconnected" and rec.http_status == 499
    assert 1 <= rec.completion_tokens < 500
    assert rec.completion_tokens == rec.token_events
    assert rec.prompt_source == "estimate"
    assert rec.prompt_tokens == math.ceil(len(PROMPT.encode()) / 4)


async def test_disconnect_counts_the_prompt_with_the_models_tokenizer(tmp_path: Path) -> None:
    tok_path = train_tiny_tokenizer(tmp_path / "tok")
    expected = len(load_tokenizer(str(tok_path)).encode("user\n" + PROMPT).ids)
    records: list[RequestRecord] = []
    raw = raw_config([])
    raw["models"] = [{"name": "m", "tokenizer": str(tok_path.parent), "endpoints": []}]
    async with fake_engine(FakeEngine(model="m", itl_s=0.02)) as eng:
        raw["models"][0]["endpoints"] = [ep(eng)]
        from gateway.config import parse_config
        async with running_gateway(parse_config(raw, env={}), sinks=[records.append]) as gw:
            body = {"model": "m", "max_tokens": 500, "stream": True,
                    "messages": [{"role": "user", "content": PROMPT}]}
            await raw_stream(gw, "/v1/chat/completions", body, b"tok")
            await wait_for(records, 1)
    rec = records[0]
    assert rec.status == "client_disconnected"
    assert rec.prompt_source == "gateway" and rec.prompt_tokens == expected
    # the role chunk is a token event but carries no token
    assert rec.completion_tokens == rec.token_events - 1 >= 1


async def test_engine_failure_mid_stream_keeps_tokens_and_counts_the_prompt() -> None:
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m", itl_s=0.01)) as eng, \
            running_gateway(make_config([ep(eng)]), sinks=[records.append]) as gw, \
            aiohttp.ClientSession() as s, \
            s.post(gw + "/v1/completions", headers={**AUTH, "x-fake-fault": "abort-after:3"},
                   json={"model": "m", "prompt": PROMPT, "max_tokens": 10, "stream": True}) as r:
        await r.read()
    rec = records[-1]
    assert rec.status == "upstream_stream_error"
    assert rec.completion_tokens == 3 and rec.prompt_tokens > 0
    assert rec.prompt_source == "estimate"


async def test_engine_error_status_is_not_charged_a_prompt() -> None:
    """An engine that refused the request (4xx) read no prompt: nothing is counted for it."""
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m")) as eng, \
            running_gateway(make_config([ep(eng)]), sinks=[records.append]) as gw, \
            aiohttp.ClientSession() as s, \
            s.post(gw + "/v1/completions", headers={**AUTH, "x-fake-fault": "status:400"},
                   json={"model": "m", "prompt": PROMPT, "max_tokens": 10}) as r:
        assert r.status == 400
    assert records[-1].prompt_tokens == 0


async def test_non_streamed_record_notes_when_the_engine_finished() -> None:
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m", ttft_s=0.05)) as eng, \
            running_gateway(make_config([ep(eng)]), sinks=[records.append]) as gw, \
            aiohttp.ClientSession() as s, \
            s.post(gw + "/v1/completions", headers=AUTH,
                   json={"model": "m", "prompt": PROMPT, "max_tokens": 3}) as r:
        assert r.status == 200
        await r.read()
    rec = records[-1]
    assert rec.engine_done_s is not None and rec.dispatched_s is not None
    assert rec.dispatched_s + 0.04 <= rec.engine_done_s <= rec.finished_s


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
async def test_embeddings_are_routed_timed_and_recorded(front: bool) -> None:
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m", ttft_s=0.02)) as eng, \
            running_gateway(make_config([ep(eng)]), sinks=[records.append], front=front) as gw, \
            aiohttp.ClientSession() as s, \
            s.post(gw + "/v1/embeddings", headers=AUTH,
                   json={"model": "m", "input": ["a", "b"]}) as r:
        assert r.status == 200
        doc = await r.json()
        assert r.headers["x-wattgate-endpoint"] == "e1"
    assert len(doc["data"]) == 2
    rec = records[-1]
    assert rec.status == "ok" and rec.engine == "e1"
    assert (rec.prompt_tokens, rec.completion_tokens) == (10, 0)
    assert rec.latency.e2e_s is not None and rec.latency.e2e_s >= 0.02


async def test_health_answers_like_vllm() -> None:
    async with fake_engine(FakeEngine(model="m")) as eng, \
            running_gateway(make_config([ep(eng)])) as gw, aiohttp.ClientSession() as s:
        for _ in range(100):  # ready once the first health check has passed
            async with s.get(gw + "/health") as r:
                if r.status == 200:
                    assert await r.read() == b""
                    return
            await asyncio.sleep(0.05)
    raise AssertionError("GET /health never answered 200")


async def test_health_is_503_while_no_endpoint_is_healthy() -> None:
    from tests.support.procs import free_port

    dead = {"name": "e1", "url": f"http://127.0.0.1:{free_port()}", "precision": "bf16"}
    async with running_gateway(make_config([dead])) as gw, aiohttp.ClientSession() as s, \
            s.get(gw + "/health") as r:
        assert r.status == 503
        assert (await r.json())["error"]["code"] == "not_ready"


async def test_access_log_has_one_json_line_per_request_and_no_secrets(tmp_path: Path) -> None:
    from gateway.config import parse_config

    log_path = tmp_path / "access.jsonl"
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m", tokens=3)) as eng:
        cfg = parse_config(raw_config([ep(eng)], access_log=str(log_path)), env={})
        async with running_gateway(cfg, sinks=[records.append]) as gw, \
                aiohttp.ClientSession() as s:
            for stream in (True, False):
                async with s.post(gw + "/v1/completions", headers=AUTH, json={
                        "model": "m", "prompt": PROMPT, "max_tokens": 3, "stream": stream}) as r:
                    await r.read()
            async with s.post(gw + "/v1/completions", headers={"Authorization": "Bearer sk-x"},
                              json={"model": "m", "prompt": PROMPT}) as r:
                assert r.status == 401
    text = log_path.read_text()
    assert PROMPT not in text and KEY_A not in text and "sk-x" not in text
    lines = [orjson.loads(line) for line in text.splitlines()]
    assert [line["request_id"] for line in lines] == [r.request_id for r in records]
    assert [line["status"] for line in lines] == ["ok", "ok", "invalid_api_key"]
    first = lines[0]
    assert first["completion_tokens"] == 3 and first["token_events"] == 3
    assert first["ttft_s"] == records[0].latency.ttft_s and first["endpoint"] == "e1"


async def test_embeddings_go_only_to_engine_kinds_that_serve_them() -> None:
    """trtllm-serve has no /v1/embeddings: a pool with both kinds sends embeddings to vLLM."""
    async with fake_engine(FakeEngine(model="m")) as vllm, \
            fake_engine(FakeEngine(model="m")) as trt:
        endpoints = [{"name": "v", "url": vllm.url, "precision": "bf16", "kind": "vllm"},
                     {"name": "t", "url": trt.url, "precision": "bf16", "kind": "trtllm"}]
        async with running_gateway(make_config(endpoints, routing={"policy": "round_robin"})
                                   ) as gw, aiohttp.ClientSession() as s:
            for _ in range(6):
                async with s.post(gw + "/v1/embeddings", headers=AUTH,
                                  json={"model": "m", "input": "a"}) as r:
                    assert r.status == 200 and r.headers["x-wattgate-endpoint"] == "v"


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
async def test_clients_closing_right_after_the_finish_reason_event_are_all_ok(front: bool
                                                                            ) -> None:
    """The engine pauses after the token event that carries `finish_reason`; 20 clients that
    asked for no usage hang up as soon as they have read it, before `[DONE]`. Each got its
    whole answer: every one is `ok`, with every token."""
    records: list[RequestRecord] = []
    async with fake_engine(FakeEngine(model="m", tokens=5, finish_gap_s=0.3)) as eng, \
            running_gateway(make_config([ep(eng)]), sinks=[records.append], front=front) as gw:
        body = {"model": "m", "max_tokens": 5, "stream": True, "prompt": PROMPT}
        got = await asyncio.gather(*(raw_stream(gw, "/v1/completions", body,
                                                b'"finish_reason":"length"')
                                     for _ in range(20)))
        assert all(b"[DONE]" not in g and b'"finish_reason":"length"' in g for g in got)
        await wait_for(records, 20)
    assert [r.status for r in records] == ["ok"] * 20
    assert all(r.http_status == 200 and r.completion_tokens == 5 for r in records)
