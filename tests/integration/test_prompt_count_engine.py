"""A cut-off stream's prompt is counted by the engine that read it (vLLM's `POST /tokenize`),
so its record holds the count the engine's usage would have given: through a real gateway in
front of the simulator (a real process), whose /tokenize counts as its usage does."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from core.records import RequestRecord
from tests.integration.test_gateway_sim import sim
from tests.support.gateway import make_config, running_gateway
from tests.support.hangup import raw_stream

pytestmark = pytest.mark.timeout(90)
MODEL = "llama-3.1-8b"
# words of many lengths: the 4-byte estimate is far off (68 bytes, 9 words)
TEXT = "photosynthesis of energy is a wonderfully complicated process indeed"


async def records_of(records: list[RequestRecord], n: int) -> None:
    for _ in range(300):
        if len(records) >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{len(records)} records, expected {n}")


async def test_cut_off_streams_carry_the_engines_own_prompt_count() -> None:
    records: list[RequestRecord] = []
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("/v1/completions", {"model": MODEL, "prompt": TEXT}),
        ("/v1/chat/completions", {"model": MODEL, "messages": [
            {"role": "system", "content": "be brief"}, {"role": "user", "content": TEXT}]}),
    ]
    with sim("--precision", "bf16", "--fixed-ttft-ms", "20", "--fixed-itl-ms", "30") as url:
        cfg = make_config([{"name": "e1", "url": url, "precision": "bf16"}], model=MODEL)
        async with running_gateway(cfg, sinks=[records.append]) as gw, \
                aiohttp.ClientSession() as s:
            truth = []
            for path, body in bodies:
                # the engine's own count, from a request it answers whole
                async with s.post(url + path, data=orjson.dumps({**body, "max_tokens": 2})) as r:
                    truth.append((await r.json())["usage"]["prompt_tokens"])
                # through the gateway: the client hangs up at its first token
                await raw_stream(gw, path, {**body, "max_tokens": 200, "stream": True},
                                 b'"choices":[{')
            await records_of(records, 2)
    for rec, expected in zip(records, truth, strict=True):
        assert rec.status == "client_disconnected"
        assert rec.prompt_source == "engine_tokenize"
        assert rec.prompt_tokens == expected
    assert truth[0] == 9 and truth[0] != -(-len(TEXT) // 4)
