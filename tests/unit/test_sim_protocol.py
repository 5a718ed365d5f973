"""The simulator's OpenAI surface: tokenisation, validation errors, chunk shapes, faults, metrics."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from engines.adapters.trtllm import TrtllmAdapter
from engines.adapters.vllm import VllmAdapter
from engines.sim.config import SimConfig, SimConfigError, config_from_mapping
from engines.sim.engine_metrics import ServingStats, render_trtllm, render_vllm
from engines.sim.fleet import load_fleet
from engines.sim.protocol import (
    CHAT,
    COMPLETION,
    DEFAULT_MAX_TOKENS,
    ApiError,
    ChunkMaker,
    parse_fault,
    parse_request,
)
from engines.sim.state import Emission, IterationStat

REPO = Path(__file__).resolve().parents[2]


def req(body: dict[str, object], kind: str = COMPLETION, max_len: int = 4096) -> object:
    return parse_request(orjson.dumps(body), kind, "m", max_len)


def test_prompt_tokens_are_whitespace_words_and_chat_adds_four_per_message() -> None:
    gen = parse_request(b'{"model":"m","prompt":"one two  three\\nfour"}', COMPLETION, "m", 4096)
    assert gen.prompt_tokens == 4 and gen.max_tokens == DEFAULT_MAX_TOKENS
    chat = parse_request(orjson.dumps({"model": "m", "max_tokens": 7, "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a b c"}]},
    ]}), CHAT, "m", 4096)
    assert chat.prompt_tokens == 2 + 3 + 2 * 4 and chat.max_tokens == 7
    ids = parse_request(b'{"prompt":[1,2,3,4,5],"max_tokens":2}', COMPLETION, "m", 4096)
    assert ids.prompt_tokens == 5 and ids.model == "m"


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"model": "other", "prompt": "x"}, 404, "does not exist"),
    ({"prompt": ""}, 400, "empty"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 5000}, 400, "maximum context length is 4096"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream=True"),
    ({"prompt": "x", "n": 2}, 400, "n=1"),
    ({"prompt": "x", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
])
def test_bad_requests_get_openai_style_errors(body: dict[str, object], status: int,
                                              needle: str) -> None:
    with pytest.raises(ApiError) as info:
        req(body)
    assert info.value.status == status and needle in info.value.message
    err = orjson.loads(info.value.body())["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status


def test_invalid_json_is_a_400() -> None:
    with pytest.raises(ApiError) as info:
        parse_request(b"{nope", COMPLETION, "m", 4096)
    assert info.value.status == 400


def test_stream_chunks_have_vllm_shapes() -> None:
    gen = parse_request(orjson.dumps({"messages": [{"role": "user", "content": "hi"}],
                                      "stream": True, "max_tokens": 3, "stream_options": {
                                          "include_usage": True, "continuous_usage_stats": True}}),
                        CHAT, "m", 4096)
    maker = ChunkMaker(gen, "chatcmpl-1", 123)
    role = orjson.loads(maker.role_event()[6:])
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    token = orjson.loads(maker.token_event(" tok tok", 3, last=True)[6:])
    assert token["object"] == "chat.completion.chunk" and token["id"] == "chatcmpl-1"
    assert token["choices"][0]["delta"]["content"] == " tok tok"
    assert token["choices"][0]["finish_reason"] == "length"
    assert token["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                              "completion_tokens_details": None}
    usage = orjson.loads(maker.usage_event(3)[6:])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
    event = maker.token_event(" tok", 1, last=False)
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n") and b": " not in event[6:]


def test_fault_header_parses_and_rejects_unknown_items() -> None:
    fault = parse_fault("status:503, stall-ms:250,abort-after:3")
    assert (fault.status, fault.stall_s, fault.abort_after) == (503, 0.25, 3)
    with pytest.raises(ApiError):
        parse_fault("explode:1")


def test_vllm_metrics_parse_with_the_vllm_adapter() -> None:
    stats = ServingStats()
    stats.observe(Emission("a", 1, 0.3, False, True), 0.1, 50, None)
    stats.observe(Emission("a", 1, 0.32, True, False), 0.1, 50, 0.3)
    body = render_vllm(stats, "llama", running=3, waiting=2, kv_usage=0.25)
    load = VllmAdapter().parse_load(body)
    assert (load.running, load.waiting, load.kv_usage) == (3.0, 2.0, 0.25)
    text = body.decode()
    assert 'vllm:prompt_tokens_total{engine="0",model_name="llama"} 50.0' in text
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",model_name="llama",le="0.25"} 1.0' in text
    assert 'vllm:inter_token_latency_seconds_count{engine="0",model_name="llama"} 1.0' in text


def test_trtllm_metrics_parse_with_the_trtllm_adapter() -> None:
    stats = [IterationStat(1, 0.1, 0.01, 2, 0, 0, 100, 10, 16),
             IterationStat(2, 0.2, 0.01, 5, 3, 1, 100, 40, 16)]
    body = render_trtllm(stats, 1.7e9, 1.0, 256)
    load = TrtllmAdapter().parse_load(body)
    assert (load.running, load.waiting, load.kv_usage) == (5.0, 3.0, 0.4)
    assert orjson.loads(body)[0]["kvCacheStats"]["freeNumBlocks"] == 90


def test_quick_start_fleet_matches_the_local_gateway_config() -> None:
    configs = load_fleet(REPO / "deploy/examples/fleet.yaml")
    got = {(c.label, c.port, c.precision, c.dialect) for c in configs}
    assert got == {("h100-bf16", 8101, "bf16", "vllm"), ("h100-fp8", 8102, "fp8", "vllm"),
                   ("h100-int8", 8103, "int8", "vllm"), ("h100-int4", 8104, "int4", "vllm"),
                   ("h100-trt-fp8", 8105, "fp8", "trtllm")}
    assert {c.model_name for c in configs} == {"llama-3.1-8b"}


def test_bad_fleet_entries_name_the_field() -> None:
    with pytest.raises(SimConfigError, match=r"engines\[0\].*no FP8"):
        config_from_mapping({"gpu": "a100", "model": "llama-3.1-8b", "precision": "fp8"},
                            "engines[0]")
    with pytest.raises(SimConfigError, match=r"engines\[1\]\.colour: unknown field"):
        config_from_mapping({"gpu": "h100", "colour": "red"}, "engines[1]")
    with pytest.raises(SimConfigError, match="together"):
        SimConfig("h100", "llama-3.1-8b", "bf16", fixed_ttft_ms=5.0).resolve()
    for ttft_ms, itl_ms in ((math.nan, 1.0), (math.inf, 1.0), (5.0, math.nan), (5.0, -1.0)):
        with pytest.raises(SimConfigError, match="finite numbers >= 0"):
            SimConfig("h100", "llama-3.1-8b", "bf16", fixed_ttft_ms=ttft_ms,
                      fixed_itl_ms=itl_ms).resolve()
    for scale in (math.inf, math.nan, 0.0):
        with pytest.raises(SimConfigError, match="time_scale"):
            SimConfig("h100", "llama-3.1-8b", "bf16", time_scale=scale).resolve()
