"""The gateway in front of two real vLLM CPU servers: relay, usage, routing, with the openai client."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from engines.adapters.promtext import sample_sums
from tests.realengine.conftest import ALIAS, SERVED_NAME, Gateway, VllmServer

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(600)]

PROMPT = "the carbon of a request routed by the gateway"
MESSAGES: list[Any] = [{"role": "user", "content": "how many joules per token?"}]
REQUEST_ID = "x-wattgate-request-id"
SUCCESS = "vllm:request_success_total"


def _gateway_client(gw: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=gw.api_key, max_retries=0,
                              timeout=60)


def _direct_client(server: VllmServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                              timeout=60)


def _server(servers: tuple[VllmServer, ...], endpoint_name: str) -> VllmServer:
    """The vLLM server the gateway says it routed to (x-wattgate-endpoint)."""
    return next(s for s in servers if s.name == endpoint_name)


def _successes(server: VllmServer) -> float:
    sums, _ = sample_sums(server.metrics(), frozenset({SUCCESS}))
    return sums.get(SUCCESS, 0.0)


async def test_completion_through_gateway_has_request_id_and_vllms_exact_usage(
        gateway: Gateway, vllm_servers: tuple[VllmServer, ...]) -> None:
    """Non-streaming: the gateway returns vLLM's body, with its request id, usage unchanged."""
    async with _gateway_client(gateway) as client:
        raw = await client.completions.with_raw_response.create(
            model=ALIAS, prompt=PROMPT, max_tokens=10, temperature=0)
        via = raw.parse()
    assert raw.headers.get(REQUEST_ID)
    server = _server(vllm_servers, raw.headers["x-wattgate-endpoint"])
    async with _direct_client(server) as direct:
        ref = await direct.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=10,
                                              temperature=0)
    assert via.usage is not None
    assert ref.usage is not None
    assert via.usage.completion_tokens > 0
    assert (via.usage.prompt_tokens, via.usage.completion_tokens) == (
        ref.usage.prompt_tokens, ref.usage.completion_tokens)
    assert via.choices[0].text == ref.choices[0].text  # greedy: the same tokens


async def test_chat_through_gateway_matches_vllms_usage(
        gateway: Gateway, vllm_servers: tuple[VllmServer, ...]) -> None:
    """Chat completions pass through: same prompt/completion token counts as vLLM directly."""
    async with _gateway_client(gateway) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=ALIAS, messages=MESSAGES, max_tokens=8, temperature=0)
        via = raw.parse()
    server = _server(vllm_servers, raw.headers["x-wattgate-endpoint"])
    async with _direct_client(server) as direct:
        ref = await direct.chat.completions.create(model=SERVED_NAME, messages=MESSAGES,
                                                   max_tokens=8, temperature=0)
    assert via.usage is not None
    assert ref.usage is not None
    assert (via.usage.prompt_tokens, via.usage.completion_tokens) == (
        ref.usage.prompt_tokens, ref.usage.completion_tokens)
    assert via.choices[0].message.content == ref.choices[0].message.content


async def test_stream_with_include_usage_relays_vllms_usage_chunk(
        gateway: Gateway, vllm_servers: tuple[VllmServer, ...]) -> None:
    """Streaming with include_usage: text and the final usage chunk equal vLLM's own answer."""
    async with _gateway_client(gateway) as client:
        raw = await client.completions.with_raw_response.create(
            model=ALIAS, prompt=PROMPT, max_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True})
        endpoint = raw.headers["x-wattgate-endpoint"]
        assert raw.headers.get(REQUEST_ID)
        text, usage = "", None
        async for chunk in raw.parse():
            if chunk.choices:
                text += chunk.choices[0].text
            if chunk.usage is not None:
                usage = chunk.usage
    async with _direct_client(_server(vllm_servers, endpoint)) as direct:
        ref = await direct.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=10,
                                              temperature=0)
    assert usage is not None
    assert ref.usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        ref.usage.prompt_tokens, ref.usage.completion_tokens)
    assert text == ref.choices[0].text


async def test_stream_without_include_usage_gets_no_usage_chunk(gateway: Gateway) -> None:
    """The gateway forces usage upstream but strips it when the client did not ask for it."""
    async with _gateway_client(gateway) as client:
        stream = await client.chat.completions.create(
            model=ALIAS, messages=MESSAGES, max_tokens=6, temperature=0, stream=True)
        chunks = [chunk async for chunk in stream]
    assert chunks
    assert all(chunk.usage is None for chunk in chunks)
    assert all(chunk.choices for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert "".join(c.choices[0].delta.content or "" for c in chunks)


async def test_round_robin_spreads_requests_over_both_real_instances(
        gateway: Gateway, vllm_servers: tuple[VllmServer, ...]) -> None:
    """Each vLLM instance's own vllm:request_success_total grows; together by the count sent."""
    before = [_successes(s) for s in vllm_servers]
    n_requests = 6
    seen: set[str] = set()
    async with _gateway_client(gateway) as client:
        for i in range(n_requests):
            raw = await client.completions.with_raw_response.create(
                model=ALIAS, prompt=f"{PROMPT} {i}", max_tokens=2, temperature=0)
            seen.add(raw.headers["x-wattgate-endpoint"])
    grown = [_successes(s) - b for s, b in zip(vllm_servers, before, strict=True)]
    assert seen == {s.name for s in vllm_servers}
    assert all(g >= 1 for g in grown), grown
    assert sum(grown) == n_requests
