"""A real vLLM (CPU build, tiny local model) as the gateway sees it: API, usage, /metrics."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from engines.adapters import adapter_for
from engines.adapters.base import EngineLoad
from tests.realengine.conftest import MAX_NUM_SEQS, SERVED_NAME, VllmServer

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(600)]

PROMPT = "energy per token of the gateway"


def _client(server: VllmServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                              timeout=60)


async def test_streamed_usage_equals_non_streamed_usage_and_text(
        vllm_servers: tuple[VllmServer, ...]) -> None:
    """vLLM's include_usage chunk carries the same counts (and greedy text) as a plain answer."""
    async with _client(vllm_servers[0]) as client:
        plain = await client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=12,
                                                temperature=0)
        stream = await client.completions.create(
            model=SERVED_NAME, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True})
        text, usage, token_events = "", None, 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                token_events += 1
            if chunk.usage is not None:
                assert not chunk.choices  # the usage chunk is its own, final event
                usage = chunk.usage
    assert plain.usage is not None
    assert usage is not None
    assert plain.usage.completion_tokens > 0
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        plain.usage.prompt_tokens, plain.usage.completion_tokens)
    assert text == plain.choices[0].text
    assert 1 <= token_events <= usage.completion_tokens


async def test_chat_completion_applies_the_chat_template(
        vllm_servers: tuple[VllmServer, ...]) -> None:
    """Chat works on the tiny model: the template adds tokens around the user's message."""
    async with _client(vllm_servers[0]) as client:
        chat = await client.chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=5,
            temperature=0)
        plain = await client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=1)
    assert chat.usage is not None
    assert plain.usage is not None
    assert chat.usage.prompt_tokens > plain.usage.prompt_tokens
    assert chat.choices[0].message.role == "assistant"


def test_vllm_adapter_reads_real_idle_metrics(vllm_servers: tuple[VllmServer, ...]) -> None:
    """VllmAdapter.parse_load reads the real /metrics of an idle server: zero load, KV present."""
    for server in vllm_servers:
        load = adapter_for("vllm").parse_load(server.metrics())
        assert load.running == 0.0
        assert load.waiting == 0.0
        assert load.kv_usage is not None
        assert 0.0 <= load.kv_usage <= 1.0


async def _fill_and_scrape(server: VllmServer) -> tuple[EngineLoad | None, list[object]]:
    """One request of n = 48 * MAX_NUM_SEQS + 1 sequences, /metrics scraped until a scrape
    shows the scheduler full with a queue, or the request ends: the fullest load seen, and
    every scrape as (seconds, running, waiting), then how the request ended."""
    adapter = adapter_for("vllm")
    async with _client(server) as client:
        task = asyncio.create_task(client.completions.create(
            model=SERVED_NAME, prompt=PROMPT, max_tokens=400, temperature=1.0, seed=1,
            n=48 * MAX_NUM_SEQS + 1, extra_body={"ignore_eos": True}))
        best: EngineLoad | None = None
        seen: list[object] = []
        started = time.monotonic()
        try:
            while time.monotonic() - started < 60 and not task.done():
                load = await asyncio.to_thread(lambda: adapter.parse_load(server.metrics()))
                seen.append((round(time.monotonic() - started, 3), load.running, load.waiting))
                if best is None or (load.running, load.waiting) > (best.running, best.waiting):
                    best = load
                if best.running == MAX_NUM_SEQS and best.waiting > 0:
                    break
                await asyncio.sleep(0.02)
        finally:
            ended = ("still running" if not task.done() else
                     "cancelled" if task.cancelled() else repr(task.exception() or "answered"))
            seen.append(ended)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return best, seen


async def test_vllm_adapter_sees_running_and_waiting_requests(
        vllm_servers: tuple[VllmServer, ...]) -> None:
    """Under more sequences than --max-num-seqs, real /metrics shows running, waiting, KV > 0.

    One request with n = 48 * MAX_NUM_SEQS + 1 puts all its sequences in vLLM's scheduler at
    once (parallel sampling fans out into one engine request per sequence), so the overlap
    does not hang on how fast a busy API server admits separate requests, and the scheduler
    stays full with a queue for 48 waves of decoding. A scrape of a busy server's /metrics
    can still take as long as all of them (CI saw one take 36 s and land after the request
    ended), so a request that ends before any scrape lands in it is tried again. The client
    hangs up as soon as a scrape shows the queue; vLLM aborts the rest.
    """
    server = vllm_servers[0]
    adapter = adapter_for("vllm")
    started = time.monotonic()
    tries: list[list[object]] = []
    for _ in range(3):
        best, seen = await _fill_and_scrape(server)
        tries.append(seen)
        if best is not None and best.running == MAX_NUM_SEQS and best.waiting > 0:
            break
    assert best is not None
    assert (best.running, best.waiting > 0) == (MAX_NUM_SEQS, True), tries
    assert best.kv_usage is not None
    assert 0.0 < best.kv_usage <= 1.0
    after = best
    while time.monotonic() - started < 300 and (after.running, after.waiting) != (0.0, 0.0):
        await asyncio.sleep(0.1)
        after = await asyncio.to_thread(lambda: adapter.parse_load(server.metrics()))
    assert (after.running, after.waiting) == (0.0, 0.0)
