"""`wattgate sim` on the wire, read from a raw socket: HTTP chunk framing, role chunk,
empty-text token events, and /v1/embeddings with usage and ground-truth energy."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI

from tests.support.procs import free_port, running, wattgate_cmd

MODEL = "llama-3.1-8b"
CJK_PROMPT = "请用中文详细介绍一下长城的历史 🙂"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    port = free_port()
    cmd = wattgate_cmd("sim", "--gpu", "h100", "--model", MODEL, "--precision", "bf16",
                       "--port", str(port), "--time-scale", "4")
    with running(cmd, f"http://127.0.0.1:{port}/health"):
        yield f"http://127.0.0.1:{port}"


async def raw_post(url: str, path: str, body: dict[str, object], request_id: str,
                   stop_at_done: bool = False) -> tuple[bytes, list[bytes]]:
    """POST over a bare socket; (response head, the body's HTTP/1.1 chunks in order). With
    `stop_at_done` the socket is closed as soon as a chunk holding `[DONE]` is read, as the
    openai SDK and GuideLLM do."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = orjson.dumps(body)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"x-request-id: {request_id}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
                 + payload)
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        chunks: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            data = await reader.readexactly(size + 2)
            assert data.endswith(b"\r\n")
            chunks.append(data[:-2])
            if size == 0 or (stop_at_done and b"[DONE]" in data):
                return head, chunks
    finally:
        writer.close()


def events_of(chunks: list[bytes]) -> list[dict[str, object]]:
    return [orjson.loads(c[6:]) for c in chunks if c.startswith(b"data: {")]


@pytest.mark.timeout(30)
async def test_every_event_is_an_http_chunk_of_its_own_and_usage_and_done_come_apart(
        url: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a b c"}],
            "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}
    head, chunks = await raw_post(url, "/v1/chat/completions", body, "wire-1")
    assert b"200 OK" in head and b"transfer-encoding: chunked" in head.lower()
    assert chunks[-1] == b"" and chunks[-2] == b"data: [DONE]\n\n"
    assert all(c.count(b"data: ") == 1 and c.endswith(b"\n\n") for c in chunks[:-1])
    events = events_of(chunks)
    role, tokens, usage = events[0], events[1:-1], events[-1]
    assert role["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None}]
    assert len(tokens) == 6 and all(e["choices"] for e in tokens)
    finishes = [e["choices"][0]["finish_reason"] for e in tokens]  # type: ignore[index]
    assert finishes == [None] * 5 + ["length"]
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 7, "total_tokens": 13, "completion_tokens": 6}


@pytest.mark.timeout(30)
async def test_completion_stream_has_no_role_chunk(url: str) -> None:
    body = {"model": MODEL, "prompt": "a b", "max_tokens": 3, "stream": True}
    _, chunks = await raw_post(url, "/v1/completions", body, "wire-2")
    events = events_of(chunks)
    assert len(events) == 3 and all("text" in e["choices"][0] for e in events)  # type: ignore[index]
    assert chunks[-2:] == [b"data: [DONE]\n\n", b""]


@pytest.mark.timeout(30)
async def test_a_client_closing_right_after_done_leaves_a_finished_request(url: str) -> None:
    body = {"model": MODEL, "prompt": "a b", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    _, chunks = await raw_post(url, "/v1/completions", body, "wire-3", stop_at_done=True)
    assert chunks[-1] == b"data: [DONE]\n\n"
    await asyncio.sleep(0.05)
    async with aiohttp.ClientSession() as s, s.get(f"{url}/sim/requests/wire-3") as r:
        truth = orjson.loads(await r.read())
    assert truth["status"] == "finished" and truth["completion_tokens"] == 5


@pytest.mark.timeout(30)
async def test_empty_text_token_events_are_sent_and_counted_in_usage(url: str) -> None:
    async def stream(prompt: str, request_id: str) -> tuple[list[str], int]:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 200, "stream": True,
                "stream_options": {"include_usage": True}}
        _, chunks = await raw_post(url, "/v1/completions", body, request_id)
        events = events_of(chunks)
        texts = [str(e["choices"][0]["text"]) for e in events if e["choices"]]  # type: ignore[index]
        return texts, int(events[-1]["usage"]["completion_tokens"])  # type: ignore[index]

    cjk, cjk_usage = await stream(CJK_PROMPT, "wire-cjk")
    ascii_texts, ascii_usage = await stream("tell me about the great wall", "wire-ascii")
    assert cjk_usage == ascii_usage == 200 and len(cjk) == len(ascii_texts) == 200
    assert set(cjk) == {"", " tok"}
    # 25 % of 200 tokens (sd 6) against 2 % (sd 2): far apart whatever the seed
    assert cjk.count("") > 25 > 12 > ascii_texts.count("")


@pytest.mark.timeout(30)
async def test_embeddings_answer_vllm_shape_with_usage_and_ground_truth_energy(url: str) -> None:
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                           timeout=20) as oai:
        result = await oai.embeddings.create(model=MODEL, input=["one two three", "four"],
                                             extra_headers={"x-request-id": "emb-1"})
    assert [d.index for d in result.data] == [0, 1] and len(result.data[0].embedding) == 4096
    assert result.usage.prompt_tokens == 4 and result.usage.total_tokens == 4
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/sim/requests/emb-1") as r:
            truth = orjson.loads(await r.read())
        async with s.get(f"{url}/sim/stats") as r:
            stats = orjson.loads(await r.read())
    assert truth["status"] == "finished" and truth["prompt_tokens"] == 4
    assert truth["completion_tokens"] == 0 and truth["decode_energy_j"] == 0.0
    assert truth["prefill_energy_j"] > 0 and truth["energy_j"] > truth["prefill_energy_j"]
    total = stats["requests_energy_j"] + stats["idle_energy_j"]
    assert total == pytest.approx(stats["counter_committed_j"], rel=1e-9)


@pytest.mark.timeout(30)
async def test_trtllm_dialect_has_no_embeddings_endpoint() -> None:
    port = free_port()
    cmd = wattgate_cmd("sim", "--gpu", "h100", "--model", MODEL, "--precision", "fp8",
                       "--dialect", "trtllm", "--port", str(port))
    with running(cmd, f"http://127.0.0.1:{port}/health"):
        async with aiohttp.ClientSession() as s, s.post(
                f"http://127.0.0.1:{port}/v1/embeddings", json={"input": "x"}) as r:
            assert r.status == 404
