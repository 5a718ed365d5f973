"""The simulator's wire, event by event: vLLM's exact chunk bytes, empty-text tokens, embeddings.

The expected bytes below are what vLLM 0.32's serving code emits: its pydantic stream
responses dumped with `model_dump_json(exclude_unset=True)` (usage chunk:
`exclude_none=True`), built with the arguments its chat and completion stream generators
pass (vllm/entrypoints/openai/{chat_completion,completion}/serving.py).
"""

from __future__ import annotations

import base64
import math
from array import array

import orjson
import pytest

from engines.sim.catalog import deployment
from engines.sim.detok import TOKEN_TEXT, TokenTexts, empty_share, non_ascii_fraction
from engines.sim.embeddings import embedding_body, parse_embedding_request
from engines.sim.engine_metrics import ServingStats
from engines.sim.fixed import FixedTimingCore
from engines.sim.perf import kernel_profile
from engines.sim.protocol import CHAT, COMPLETION, ApiError, ChunkMaker, parse_request
from engines.sim.scheduler import BatchingCore

HEAD_CHAT = b'{"id":"chatcmpl-x","object":"chat.completion.chunk","created":7,"model":"m",'
HEAD_COMP = b'{"id":"cmpl-x","object":"text_completion","created":7,"model":"m",'


def maker(kind: str, **options: bool) -> ChunkMaker:
    body: dict[str, object] = {"max_tokens": 4, "stream": True, "stream_options": options}
    if kind == CHAT:
        body["messages"] = [{"role": "user", "content": "a b c"}]
    else:
        body["prompt"] = "a b c"
    gen = parse_request(orjson.dumps(body), kind, "m", 4096)
    return ChunkMaker(gen, "chatcmpl-x" if kind == CHAT else "cmpl-x", 7)


def test_chat_stream_events_are_byte_identical_to_vllm() -> None:
    m = maker(CHAT, include_usage=True)
    assert m.role_event() == (b"data: " + HEAD_CHAT + b'"choices":[{"index":0,"delta":'
                              b'{"role":"assistant","content":""},"logprobs":null,'
                              b'"finish_reason":null}]}\n\n')
    assert m.token_event(" tok", 1, last=False) == (
        b"data: " + HEAD_CHAT + b'"choices":[{"index":0,"delta":{"content":" tok"},'
        b'"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n')
    assert m.token_event("", 2, last=False) == (
        b"data: " + HEAD_CHAT + b'"choices":[{"index":0,"delta":{"content":""},'
        b'"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n')
    assert m.token_event(" tok", 4, last=True) == (
        b"data: " + HEAD_CHAT + b'"choices":[{"index":0,"delta":{"content":" tok"},'
        b'"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}]}\n\n')
    assert m.usage_event(4) == (b"data: " + HEAD_CHAT + b'"choices":[],"usage":'
                                b'{"prompt_tokens":7,"total_tokens":11,"completion_tokens":4}}\n\n')


def test_completion_stream_events_are_byte_identical_to_vllm() -> None:
    m = maker(COMPLETION, include_usage=True, continuous_usage_stats=True)
    assert m.token_event("", 1, last=False) == (
        b"data: " + HEAD_COMP + b'"choices":[{"index":0,"text":"","logprobs":null,'
        b'"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],'
        b'"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}\n\n')
    assert m.token_event(" tok", 4, last=True) == (
        b"data: " + HEAD_COMP + b'"choices":[{"index":0,"text":" tok","logprobs":null,'
        b'"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}],'
        b'"usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4}}\n\n')
    assert m.usage_event(4) == (b"data: " + HEAD_COMP + b'"choices":[],"usage":'
                                b'{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4}}\n\n')


def test_chat_continuous_usage_carries_null_completion_details_like_vllm_chat() -> None:
    m = maker(CHAT, continuous_usage_stats=True)
    assert m.role_event().endswith(b'"usage":{"prompt_tokens":7,"total_tokens":7,'
                                   b'"completion_tokens":0,"completion_tokens_details":null}}\n\n')


def test_token_texts_are_seeded_per_request_and_empty_at_the_configured_share() -> None:
    a, b = TokenTexts(42, 0.25), TokenTexts(42, 0.25)
    texts_a = [a.take(1) for _ in range(4000)]
    assert texts_a == [b.take(1) for _ in range(4000)]
    assert TokenTexts(42, 0.25).take(10) == "".join(texts_a[:10])  # per token, not per event
    assert set(texts_a) == {"", TOKEN_TEXT}
    assert 0.22 < texts_a.count("") / 4000 < 0.28  # binomial sd 0.007
    assert [TokenTexts(43, 0.25).take(1) for _ in range(200)] != texts_a[:200]
    assert TokenTexts(1, 0.0).take(5) == TOKEN_TEXT * 5


def test_non_ascii_prompts_get_more_empty_tokens() -> None:
    assert non_ascii_fraction(["hello world"]) == 0.0
    assert non_ascii_fraction(["你好世界"]) == 1.0
    assert non_ascii_fraction(["ab 你好"]) == 0.5
    assert empty_share(0.02, 0.25, 0.0) == 0.02 and empty_share(0.02, 0.25, 1.0) == 0.25
    chat = parse_request(orjson.dumps({"messages": [{"role": "user", "content": "请用中文回答 🙂"}]}),
                         CHAT, "m", 4096)
    assert chat.non_ascii == 1.0
    ids = parse_request(b'{"prompt":[1,2,3]}', COMPLETION, "m", 4096)
    assert ids.non_ascii == 0.0


def test_embedding_inputs_count_tokens_per_item_and_keep_vllm_response_shape() -> None:
    raw = orjson.dumps({"model": "m", "input": ["one two three", "four"], "dimensions": 8})
    req = parse_embedding_request(raw, "m", 4096, hidden=64)
    assert req.prompt_tokens == (3, 1) and req.total_tokens == 4 and req.dimensions == 8
    body = orjson.loads(embedding_body(req, "embd-1", 9))
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]
    assert body["object"] == "list" and body["model"] == "m"
    assert [(d["index"], d["object"]) for d in body["data"]] == [(0, "embedding"), (1, "embedding")]
    vec = body["data"][0]["embedding"]
    assert len(vec) == 8 and math.isclose(sum(v * v for v in vec), 1.0, rel_tol=1e-5)
    assert vec != body["data"][1]["embedding"]
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4, "completion_tokens": 0,
                             "prompt_tokens_details": None, "completion_tokens_details": None}
    again = parse_embedding_request(orjson.dumps({"input": "one two three", "dimensions": 8,
                                                  "encoding_format": "base64"}), "m", 4096, 64)
    packed = orjson.loads(embedding_body(again, "embd-2", 9))["data"][0]["embedding"]
    assert array("f", base64.b64decode(packed)).tolist() == vec  # same input, same vector
    ids = parse_embedding_request(b'{"input":[[1,2,3],[4,5]]}', "m", 4096, 64)
    assert ids.prompt_tokens == (3, 2) and ids.dimensions == 64
    assert parse_embedding_request(b'{"input":[1,2,3]}', "m", 4096, 64).prompt_tokens == (3,)


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"model": "other", "input": "x"}, 404, "does not exist"),
    ({"input": []}, 400, "non-empty"),
    ({"input": ""}, 400, "empty"),
    ({"input": [1.5]}, 400, "input must be"),
    ({"input": "x " * 20}, 400, "maximum context length is 16"),
    ({"input": "x", "dimensions": 65}, 400, "dimensions"),
    ({"input": "x", "encoding_format": "bytes"}, 400, "encoding_format"),
])
def test_bad_embedding_requests_get_openai_style_errors(body: dict[str, object], status: int,
                                                        needle: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_embedding_request(orjson.dumps(body), "m", 16, hidden=64)
    assert info.value.status == status and needle in info.value.message


@pytest.mark.parametrize("core_kind", ["batching", "fixed"])
def test_a_pooling_request_does_prefill_work_only_and_carries_its_energy(core_kind: str) -> None:
    d = deployment("h100", "llama-3.1-8b", "bf16", 1)
    profile = kernel_profile("vllm", "bf16")
    core = (BatchingCore(d, profile) if core_kind == "batching"
            else FixedTimingCore(d, profile, ttft_s=0.05, itl_s=0.01))
    core.submit("e", 900, 0, 0.0)
    emissions = core.advance(10.0)
    assert [(e.request_id, e.tokens, e.done) for e in emissions] == [("e", 0, True)]
    [truth] = core.take_finished()
    assert truth.status == "finished" and truth.completion_tokens == 0
    assert truth.prompt_tokens == 900 and truth.first_token_s is None
    assert truth.prefill_energy_j > 0 and truth.decode_energy_j == 0.0
    assert truth.energy_j == pytest.approx(truth.prefill_energy_j + truth.static_energy_j)
    assert truth.finished_s is not None and truth.finished_s > 0
    stats = ServingStats()
    stats.observe(emissions[0], 0.0, 900, None)
    assert (stats.prompt_tokens, stats.generation_tokens, stats.success, stats.ttft.n) == (
        900, 0, 1, 0)
