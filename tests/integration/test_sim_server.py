"""`wattgate sim` as a real process: OpenAI clients, adapters on /metrics, ground truth, faults."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import time
from collections.abc import Iterator
from typing import Any, cast

import aiohttp
import orjson
import pytest
from openai import APIStatusError, AsyncOpenAI
from openai.types.chat import ChatCompletionStreamOptionsParam

from engines.adapters.trtllm import TrtllmAdapter
from engines.adapters.vllm import VllmAdapter
from tests.support.procs import free_port, running, wattgate_cmd

MODEL = "llama-3.1-8b"


def sim_cmd(port: int, *extra: str) -> list[str]:
    return wattgate_cmd("sim", "--gpu", "h100", "--model", MODEL, "--port", str(port), *extra)


@pytest.fixture(scope="module")
def vllm_url() -> Iterator[str]:
    port = free_port()
    with running(sim_cmd(port, "--precision", "bf16"), f"http://127.0.0.1:{port}/health"):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def trtllm_url() -> Iterator[str]:
    port = free_port()
    cmd = sim_cmd(port, "--precision", "fp8", "--dialect", "trtllm", "--served-model-name", "m8")
    with running(cmd, f"http://127.0.0.1:{port}/health"):
        yield f"http://127.0.0.1:{port}"


def client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=20)


async def get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url) as resp:
        assert resp.status == 200
        body: dict[str, Any] = orjson.loads(await resp.read())
        return body


def is_token_text(text: str | None, tokens: int) -> bool:
    """`tokens` generated tokens' text: " tok" each, but a few decode to "" (split characters)."""
    return text is not None and text.replace(" tok", "") == "" and 0 < text.count(" tok") <= tokens


@pytest.mark.timeout(30)
async def test_openai_client_non_streaming_completion_and_chat(vllm_url: str) -> None:
    async with client(vllm_url) as oai:
        comp = await oai.completions.create(model=MODEL, prompt="one two three", max_tokens=5)
        assert is_token_text(comp.choices[0].text, 5) and comp.choices[0].finish_reason == "length"
        assert comp.usage is not None
        assert (comp.usage.prompt_tokens, comp.usage.completion_tokens) == (3, 5)
        chat = await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=4)
        assert is_token_text(chat.choices[0].message.content, 4)
        assert chat.usage is not None and chat.usage.prompt_tokens == 2 + 4
        models = await oai.models.list()
        assert [m.id for m in models.data] == [MODEL]


@pytest.mark.timeout(30)
async def test_openai_client_streaming_chat_with_usage(vllm_url: str) -> None:
    async with client(vllm_url) as oai:
        stream = await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "a b c"}], max_tokens=12,
            stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    content = [c.choices[0].delta.content for c in chunks[1:] if c.choices]
    assert len(content) == 12 and is_token_text("".join(x or "" for x in content), 12)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].usage.prompt_tokens == 7


@pytest.mark.timeout(30)
async def test_streaming_completion_continuous_usage_counts_up(vllm_url: str) -> None:
    async with client(vllm_url) as oai:
        stream = await oai.completions.create(
            model=MODEL, prompt="x y", max_tokens=4, stream=True,
            # continuous_usage_stats is vLLM's, not in the OpenAI client's TypedDict
            stream_options=cast("ChatCompletionStreamOptionsParam",
                                {"include_usage": False, "continuous_usage_stats": True}))
        chunks = [chunk async for chunk in stream]
    assert [c.usage.completion_tokens for c in chunks if c.usage] == [1, 2, 3, 4]


@pytest.mark.timeout(30)
async def test_ground_truth_by_request_id_and_conservation_over_http(vllm_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL, "prompt": "w " * 200, "max_tokens": 20}
        tasks = [s.post(f"{vllm_url}/v1/completions", json=body, headers={"x-request-id": f"gt-{i}"})
                 for i in range(8)]
        for resp in await asyncio.gather(*tasks):
            assert resp.status == 200
            resp.release()
        truth = await get_json(s, f"{vllm_url}/sim/requests/gt-3")
        assert truth["prompt_tokens"] == 200 and truth["completion_tokens"] == 20
        parts = sum(float(truth[k]) for k in ("prefill_energy_j", "decode_energy_j",
                                              "static_energy_j"))
        assert truth["energy_j"] == pytest.approx(parts) and parts > 0
        assert 0 < truth["ttft_s"] < truth["finished"] - truth["arrived"]
        everything = await get_json(s, f"{vllm_url}/sim/requests")
        requests = everything["requests"]
        assert isinstance(requests, list)
        assert {f"gt-{i}" for i in range(8)} <= {r["request_id"] for r in requests}
        stats = await get_json(s, f"{vllm_url}/sim/stats")
        total = float(stats["requests_energy_j"]) + float(stats["idle_energy_j"])
        assert total == pytest.approx(float(stats["counter_committed_j"]), rel=1e-9)
        e1 = await get_json(s, f"{vllm_url}/sim/energy")
        await asyncio.sleep(0.05)
        e2 = await get_json(s, f"{vllm_url}/sim/energy")
        g1, g2 = e1["gpus"][0]["energy_j"], e2["gpus"][0]["energy_j"]
        assert g2 > g1  # idle power keeps the counter growing
        assert e1["idle_power_w"] == 75.0 and e1["time_scale"] == 1.0


@pytest.mark.timeout(30)
async def test_vllm_metrics_parse_and_count_served_tokens(vllm_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{vllm_url}/metrics") as resp:
            before = await resp.read()
        body = {"model": MODEL, "prompt": "a b", "max_tokens": 3000, "stream": True}
        async with s.post(f"{vllm_url}/v1/completions", json=body) as stream:
            await stream.content.readline()  # first token is out: the request is running
            async with s.get(f"{vllm_url}/metrics") as resp:
                during = await resp.read()
    assert VllmAdapter().parse_load(during).running >= 1.0
    assert VllmAdapter().parse_load(before).running == 0.0
    assert b"vllm:generation_tokens_total" in during and b"vllm:time_to_first_token_seconds_bucket" in during


@pytest.mark.timeout(30)
async def test_trtllm_metrics_are_iteration_stats_consumed_on_read(trtllm_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        body = {"model": "m8", "prompt": "a b", "max_tokens": 2000, "stream": True}
        async with s.post(f"{trtllm_url}/v1/completions", json=body) as stream:
            await stream.content.readline()
            await asyncio.sleep(0.05)
            async with s.get(f"{trtllm_url}/metrics") as resp:
                first = await resp.read()
        await asyncio.sleep(0.05)
        async with s.get(f"{trtllm_url}/metrics") as resp:
            await resp.read()
        async with s.get(f"{trtllm_url}/metrics") as resp:
            last = await resp.read()
    stats = orjson.loads(first)
    assert len(stats) >= 2 and stats[0]["iter"] < stats[-1]["iter"]
    load = TrtllmAdapter().parse_load(first)
    assert load.running == 1.0 and load.kv_usage is not None and load.kv_usage > 0
    assert orjson.loads(last) == []  # consumed, and the engine went idle


@pytest.mark.timeout(30)
async def test_fault_status_answers_before_any_byte(vllm_url: str) -> None:
    async with client(vllm_url) as oai:
        with pytest.raises(APIStatusError) as info:
            await oai.completions.create(model=MODEL, prompt="x", max_tokens=3,
                                         extra_headers={"x-sim-fault": "status:503"})
    assert info.value.status_code == 503


@pytest.mark.timeout(30)
async def test_fault_abort_after_closes_the_stream_after_n_token_events(vllm_url: str) -> None:
    events: list[bytes] = []

    async def read_events(s: aiohttp.ClientSession) -> None:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 50, "stream": True}
        headers = {"x-sim-fault": "abort-after:3", "x-request-id": "ab-1"}
        async with s.post(f"{vllm_url}/v1/completions", json=body, headers=headers) as r:
            async for line in r.content:
                if line.startswith(b"data: "):
                    events.append(line)

    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientPayloadError):
            await read_events(s)
        await asyncio.sleep(0.05)
        truth = await get_json(s, f"{vllm_url}/sim/requests/ab-1")
    assert len(events) == 3 and b"[DONE]" not in b"".join(events)
    assert truth["status"] == "aborted" and truth["completion_tokens"] < 50


@pytest.mark.timeout(30)
async def test_fault_stall_delays_the_response_headers(vllm_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        t0 = time.monotonic()
        body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
        async with s.post(f"{vllm_url}/v1/completions", json=body,
                          headers={"x-sim-fault": "stall-ms:300"}) as r:
            assert r.status == 200
            waited = time.monotonic() - t0
    assert 0.3 <= waited < 1.5


@pytest.mark.timeout(30)
async def test_bad_request_is_a_vllm_style_400(vllm_url: str) -> None:
    url = f"{vllm_url}/v1/completions"
    async with aiohttp.ClientSession() as s, s.post(url, data=b"{not json") as r:
        assert r.status == 400
        err = orjson.loads(await r.read())["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400


@pytest.mark.timeout(30)
async def test_fixed_timing_ttft_and_itl_seen_by_a_client() -> None:
    port = free_port()
    cmd = sim_cmd(port, "--precision", "bf16", "--fixed-ttft-ms", "150", "--fixed-itl-ms", "40")
    url = f"http://127.0.0.1:{port}"
    with running(cmd, f"{url}/health"):
        async with aiohttp.ClientSession() as s:
            body = {"model": MODEL, "prompt": "x", "max_tokens": 6, "stream": True}
            t0 = time.monotonic()
            times: list[float] = []
            async with s.post(f"{url}/v1/completions", json=body) as r:
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        times.append(time.monotonic() - t0)
    assert len(times) == 6
    assert 0.145 <= times[0] < 0.25
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.025 <= g < 0.09 for g in gaps), gaps
    assert 0.035 <= sum(gaps) / len(gaps) <= 0.05


@pytest.mark.timeout(30)
async def test_time_scale_speeds_up_wall_time_but_reports_simulated_seconds() -> None:
    port = free_port()
    cmd = sim_cmd(port, "--precision", "bf16", "--fixed-ttft-ms", "1000", "--fixed-itl-ms", "200",
                  "--time-scale", "10")
    url = f"http://127.0.0.1:{port}"
    with running(cmd, f"{url}/health"):
        async with aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            body = {"model": MODEL, "prompt": "x", "max_tokens": 3}
            async with s.post(f"{url}/v1/completions", json=body,
                              headers={"x-request-id": "ts"}) as r:
                assert r.status == 200
            wall = time.monotonic() - t0
            truth = await get_json(s, f"{url}/sim/requests/ts")
    assert 0.13 <= wall < 0.6  # (1.0 + 2 x 0.2) s simulated / 10
    assert truth["ttft_s"] == pytest.approx(1.0, abs=0.02)
    assert truth["tpot_s"] == pytest.approx(0.2, abs=0.01)


def test_impossible_combination_exits_nonzero_with_a_clear_error() -> None:
    port = free_port()
    done = subprocess.run(wattgate_cmd("sim", "--gpu", "a100", "--model", MODEL, "--precision",
                                       "fp8", "--port", str(port)),
                          capture_output=True, timeout=30, check=False)
    assert done.returncode != 0 and b"no FP8" in done.stderr
    done = subprocess.run(wattgate_cmd("sim", "--gpu", "h100", "--model", "llama-3.1-70b",
                                       "--precision", "bf16", "--port", str(port)),
                          capture_output=True, timeout=30, check=False)
    assert done.returncode != 0 and b"does not fit" in done.stderr


@pytest.mark.timeout(30)
async def test_request_id_still_in_flight_is_refused_with_409(vllm_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 3000, "stream": True}
        headers = {"x-request-id": "dup"}
        async with s.post(f"{vllm_url}/v1/completions", json=body, headers=headers) as first:
            await first.content.readline()
            async with s.post(f"{vllm_url}/v1/completions", json=body, headers=headers) as second:
                assert second.status == 409
                assert orjson.loads(await second.read())["error"]["code"] == 409
