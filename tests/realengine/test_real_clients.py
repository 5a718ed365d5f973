"""The `openai` SDK through the gateway to real vLLM: what the gateway records is what the client saw.

Every request is joined to its access-log line by `x-wattgate-request-id`. Per request: the
gateway records it `ok` (200), its prompt and completion tokens equal the client's (usage where
the client has it; otherwise the prompt counted with the model's tokenizer and the tokens listed
in the chunks' logprobs), and for a stream its token events equal the client's. TTFT: the
gateway's runs from the request's arrival to its engine read of the first token event, the
client's from its send to the SDK handing over that chunk; client - gateway >= 0 for every
stream and <= 2 ms for the closest (tests/realengine/agreement.py says why not for each). A
non-streamed response has no TTFT to compare: the gateway stamps its end after writing the
body, which the client may already have read. The SDK closes the connection right after
`[DONE]`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.realengine import accesslog
from tests.realengine.agreement import TtftPair, summary, ttft_problems
from tests.realengine.clients import PromptCounter, SdkClient, Seen, chat, completion
from tests.realengine.conftest import ALIAS, Gateway

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(600)]

PER_KIND = 20
CONCURRENCY = 4  # a few at a time: two vLLM servers of --max-num-seqs 4 never queue them
MAX_TOKENS = 8
# (name, endpoint, stream, include_usage)
KINDS = (("completions", "completions", False, False),
         ("completions stream", "completions", True, False),
         ("completions stream usage", "completions", True, True),
         ("chat", "chat", False, False),
         ("chat stream", "chat", True, False),
         ("chat stream usage", "chat", True, True))


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"how many joules did request {i} take?"}]


def _prompt(i: int) -> str:
    return f"the carbon of request {i} routed by the gateway"


def mismatches(seen: Seen, rec: dict[str, Any], prompt_tokens: int, stream: bool) -> list[str]:
    """What the gateway's record says differently from the client, one line per field (TTFT
    apart: see ttft_pairs)."""
    out = []
    if (rec["status"], rec["http_status"]) != ("ok", 200):
        out.append(f"recorded {rec['status']}/{rec['http_status']}, the client got a 200")
    if rec["prompt_tokens"] != prompt_tokens:
        out.append(f"prompt_tokens {rec['prompt_tokens']} ({rec.get('prompt_source')}), "
                   f"client {prompt_tokens}")
    if rec["completion_tokens"] != seen.completion_tokens:
        out.append(f"completion_tokens {rec['completion_tokens']}, client "
                   f"{seen.completion_tokens}")
    if stream and rec["token_events"] != seen.events:
        out.append(f"token_events {rec['token_events']}, client {seen.events} "
                   f"({seen.empty_events} with empty text)")
    if stream and (rec["ttft_s"] is None or seen.ttft_s is None):
        out.append(f"ttft_s {rec['ttft_s']}, client {seen.ttft_s}")
    return [f"{seen.kind} {seen.request_id}: {m}" for m in out]


def ttft_pairs(pairs: list[tuple[Seen, dict[str, Any]]]) -> list[TtftPair]:
    return [TtftPair(f"{s.kind} {s.request_id}", s.ttft_s, float(r["ttft_s"]),
                     float(r["ts"]) - s.sent_wall_s)
            for s, r in pairs if s.ttft_s is not None and r["ttft_s"] is not None]


async def _one(sdk: SdkClient, client: Any, kind: tuple[str, str, bool, bool], i: int,
               gate: asyncio.Semaphore) -> Seen:
    name, endpoint, stream, usage = kind
    # A stream without usage asks for logprobs, so the client can count its tokens.
    counted = stream and not usage
    async with gate:
        if endpoint == "chat":
            extra: dict[str, Any] = {"logprobs": True} if counted else {}
            return await chat(sdk, client, name, stream, usage, model=ALIAS,
                              messages=_messages(i), max_tokens=MAX_TOKENS, temperature=0,
                              **extra)
        extra = {"logprobs": 0} if counted else {}
        return await completion(sdk, client, name, stream, usage, model=ALIAS, prompt=_prompt(i),
                                max_tokens=MAX_TOKENS, temperature=0, **extra)


async def test_openai_sdk_requests_are_recorded_as_the_client_saw_them(
        logged_gateway: Gateway, tiny_model: Path) -> None:
    """120 SDK requests (completions and chat; non-streamed, streamed with and without
    include_usage; 20 each, 4 at a time): each recorded ok with the client's prompt and
    completion tokens and a stream's token events; a stream's TTFT as in agreement.py."""
    gw, log = logged_gateway, logged_gateway.access_log
    assert log is not None
    counter = PromptCounter(tiny_model)
    sdk = SdkClient(gw.url, gw.api_key)
    gate = asyncio.Semaphore(CONCURRENCY)
    # Kinds interleaved, so every kind runs beside the others.
    plan = [(kind, i) for i in range(PER_KIND) for kind in KINDS]
    async with sdk.open() as client:
        seen = await asyncio.gather(*(_one(sdk, client, kind, i, gate) for kind, i in plan))
    assert all(s.request_id for s in seen), "a response without x-wattgate-request-id"
    recs = accesslog.by_id(log, {s.request_id for s in seen})
    problems = []
    for (kind, i), s in zip(plan, seen, strict=True):
        _, endpoint, stream, _ = kind
        counted = counter.chat(_messages(i)) if endpoint == "chat" else counter.text(_prompt(i))
        if s.usage is not None:
            # The client's own count must match vLLM's, or the no-usage comparisons mean nothing.
            assert counted == s.usage[0], (kind, i, counted, s.usage)
        problems += mismatches(s, recs[s.request_id], counted, stream)
    timed = ttft_pairs([(s, recs[s.request_id]) for s in seen])
    print(f"\n[realengine] SDK: {summary(timed)}")
    problems += ttft_problems(timed)
    streams = [s for s in seen if s.first_s is not None]
    assert len(streams) == 4 * PER_KIND
    assert all(s.completion_tokens > 0 for s in seen)
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems[:40])


MULTIBYTE_PROMPT = "énergie ⚡ 能量"  # multi-byte characters in the prompt too
MULTIBYTE_SEEDS = range(32)  # sampled at temperature 1: random weights emit raw byte tokens


async def test_tokens_ending_inside_a_character_are_counted_and_timed(
        logged_gateway: Gateway, tiny_model: Path) -> None:
    """Streams whose text holds multi-byte UTF-8 characters built from byte tokens, so some SSE
    events carry empty text (a token ending inside a character): the gateway counts those
    events as tokens, and its completion tokens, prompt tokens and TTFT agree with the client."""
    gw, log = logged_gateway, logged_gateway.access_log
    assert log is not None
    counter = PromptCounter(tiny_model)
    sdk = SdkClient(gw.url, gw.api_key)
    seen: list[Seen] = []
    async with sdk.open() as client:
        for seed in MULTIBYTE_SEEDS:
            seen.append(await completion(
                sdk, client, f"multibyte seed {seed}", True, True, model=ALIAS,
                prompt=MULTIBYTE_PROMPT, max_tokens=32, temperature=1.0, seed=seed))
    split = [s for s in seen if s.empty_events and s.multibyte()]
    assert split, "no stream held a multi-byte character split over tokens; try other seeds"
    recs = accesslog.by_id(log, {s.request_id for s in seen})
    problems = [p for s in seen
                for p in mismatches(s, recs[s.request_id], counter.text(MULTIBYTE_PROMPT), True)]
    timed = ttft_pairs([(s, recs[s.request_id]) for s in seen])
    print(f"\n[realengine] SDK, multi-byte: {summary(timed)}")
    problems += ttft_problems(timed)
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems)
