"""The OpenAI API as vLLM speaks it: request validation, tokenisation and response shapes.

Tokenisation is deterministic: one token per whitespace-separated word of the prompt; a
chat request counts the words of every message's text plus 4 tokens per message (role and
template markers). A prompt given as a list of token ids counts its ids. A generated token
is the word " tok" or, for a share of tokens, "" (see detok.py).

Stream chunks are byte for byte what vLLM's serving code dumps (pydantic `model_dump_json`
with `exclude_unset`, so compact JSON in its field order): the chat role chunk, token
chunks with `"finish_reason":null` and `"token_ids":null`, the final token chunk with
`finish_reason` and `stop_reason`, and the usage chunk (`exclude_none`: bare counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from engines.sim.detok import non_ascii_fraction

COMPLETION = "completion"
CHAT = "chat"
DEFAULT_MAX_TOKENS = 256
CHAT_TOKENS_PER_MESSAGE = 4


class ApiError(Exception):
    """An OpenAI-style error answer, as vLLM shapes it."""

    def __init__(self, status: int, message: str, error_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.error_type, self.param)


def error_body(status: int, message: str, error_type: str, param: str | None = None) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": status}}
    )


@dataclass(frozen=True, slots=True)
class GenRequest:
    """What the engine needs from a completion or chat request."""

    kind: str  # COMPLETION or CHAT
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    non_ascii: float = 0.0  # fraction of the prompt's characters that are not ASCII


def count_words(text: str) -> int:
    return len(text.split())


def _message_texts(messages: Any) -> list[str]:
    """Every text of a chat's messages; raises ApiError on a malformed list."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    texts: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string role",
                           param="messages")
        content = msg.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(part["text"] for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
        elif content is not None:
            raise ApiError(400, f"messages[{i}].content must be a string or a list of parts",
                           param="messages")
    return texts


def _prompt_tokens(prompt: Any) -> tuple[int, list[str]]:
    """(tokens, texts) of a completion prompt; raises ApiError."""
    texts: list[str] = []
    if isinstance(prompt, str):
        texts = [prompt]
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        texts = [prompt[0]]
    elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return len(prompt), texts
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError(400, "the simulator serves one prompt per request", param="prompt")
    else:
        raise ApiError(400, "prompt must be a string or a list of token ids", param="prompt")
    tokens = count_words(texts[0])
    if tokens == 0:
        raise ApiError(400, "Prompt cannot be empty", param="prompt")
    return tokens, texts


def tokenize_count(raw: bytes, served_model: str) -> int:
    """The prompt tokens of a vLLM `POST /tokenize` body (`messages` as a chat request counts
    them, else `prompt` as a completion does): what the request's usage would report."""
    body = json_object(raw)
    model = body.get("model", served_model)
    if model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    if "messages" in body:
        texts = _message_texts(body.get("messages"))
        return sum(count_words(t) for t in texts) + CHAT_TOKENS_PER_MESSAGE * len(
            body["messages"])
    return _prompt_tokens(body.get("prompt"))[0]


def _int_field(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int or value < minimum:
        raise ApiError(400, f"{name} must be an integer >= {minimum}, got {value!r}", param=name)
    return value


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object; raises ApiError (400) as vLLM answers."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def parse_request(raw: bytes, kind: str, served_model: str, max_model_len: int) -> GenRequest:
    """Validate a request body the way vLLM does; raises ApiError (400/404)."""
    body = json_object(raw)
    model = body.get("model")
    if model is None:
        model = served_model  # vLLM serves the only model when the field is absent
    if model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    if kind == CHAT:
        texts = _message_texts(body.get("messages"))
        prompt_tokens = (sum(count_words(t) for t in texts)
                         + CHAT_TOKENS_PER_MESSAGE * len(body["messages"]))
        max_tokens = _int_field(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens", 1)
    else:
        prompt_tokens, texts = _prompt_tokens(body.get("prompt"))
        max_tokens = _int_field(body, "max_tokens", 1)
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    min_tokens = _int_field(body, "min_tokens", 0) or 0
    if min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens ({min_tokens}) must be <= max_tokens ({max_tokens})",
                       param="min_tokens")
    n = body.get("n", 1)
    if n != 1:
        raise ApiError(400, "the simulator supports n=1 only", param="n")
    if prompt_tokens + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            f"completion.",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.",
                       param="stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    opts: dict[str, Any] = options or {}
    return GenRequest(kind, model, prompt_tokens, max_tokens, stream,
                      bool(opts.get("include_usage")), bool(opts.get("continuous_usage_stats")),
                      non_ascii_fraction(texts))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}


def _running_usage(kind: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """`continuous_usage_stats` usage: vLLM's chat server sets completion_tokens_details
    explicitly (null), its completions server does not."""
    counts: dict[str, Any] = usage(prompt_tokens, completion_tokens)
    if kind == CHAT:
        counts["completion_tokens_details"] = None
    return counts


@dataclass(frozen=True, slots=True)
class ChunkMaker:
    """Builds one response's SSE events and final body; all share id, created and model."""

    req: GenRequest
    response_id: str
    created: int

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.response_id, "object": obj, "created": self.created,
                "model": self.req.model}

    def role_event(self) -> bytes:
        """vLLM's first chat chunk, sent with the first token (chat only)."""
        head = self._head("chat.completion.chunk")
        head["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None}]
        if self.req.continuous_usage:
            head["usage"] = _running_usage(CHAT, self.req.prompt_tokens, 0)
        return _sse(head)

    def token_event(self, text: str, completion_so_far: int, last: bool) -> bytes:
        """One token chunk; `text` may be "" (a token that decodes to nothing yet)."""
        choice: dict[str, Any]
        if self.req.kind == CHAT:
            head = self._head("chat.completion.chunk")
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None,
                      "finish_reason": "length" if last else None}
            if last:  # vLLM sets stop_reason on the finishing chunk only
                choice["stop_reason"] = None
            choice["token_ids"] = None
        else:
            head = self._head("text_completion")
            choice = {"index": 0, "text": text, "logprobs": None,
                      "finish_reason": "length" if last else None, "stop_reason": None,
                      "prompt_token_ids": None, "token_ids": None}
        head["choices"] = [choice]
        if self.req.continuous_usage:
            head["usage"] = _running_usage(self.req.kind, self.req.prompt_tokens,
                                           completion_so_far)
        return _sse(head)

    def usage_event(self, completion_tokens: int) -> bytes:
        obj = "chat.completion.chunk" if self.req.kind == CHAT else "text_completion"
        head = self._head(obj)
        head["choices"] = []
        head["usage"] = usage(self.req.prompt_tokens, completion_tokens)
        return _sse(head)

    def full_body(self, completion_tokens: int, text: str) -> bytes:
        if self.req.kind == CHAT:
            head = self._head("chat.completion")
            head["choices"] = [{"index": 0,
                                "message": {"role": "assistant", "content": text, "tool_calls": []},
                                "logprobs": None, "finish_reason": "length", "stop_reason": None}]
        else:
            head = self._head("text_completion")
            head["choices"] = [{"index": 0, "text": text, "logprobs": None,
                                "finish_reason": "length", "stop_reason": None,
                                "prompt_logprobs": None}]
        head["usage"] = usage(self.req.prompt_tokens, completion_tokens)
        return orjson.dumps(head)


DONE_EVENT = b"data: [DONE]\n\n"


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


@dataclass(frozen=True, slots=True)
class Fault:
    """Per-request fault injected through the `x-sim-fault` header."""

    status: int | None = None  # answer this status with an error body before any byte
    abort_after: int | None = None  # close the connection after this many token events
    stall_s: float = 0.0  # wall-clock wait before the response headers


def parse_fault(header: str | None) -> Fault:
    """`status:503`, `abort-after:3`, `stall-ms:250`, comma-separated; raises ApiError."""
    if not header:
        return Fault()
    status: int | None = None
    abort_after: int | None = None
    stall_s = 0.0
    for item in header.split(","):
        name, _, value = item.strip().partition(":")
        try:
            number = int(value)
        except ValueError:
            raise ApiError(400, f"bad x-sim-fault item {item.strip()!r}") from None
        if name == "status" and 400 <= number <= 599:
            status = number
        elif name == "abort-after" and number >= 0:
            abort_after = number
        elif name == "stall-ms" and number >= 0:
            stall_s = number / 1000.0
        else:
            raise ApiError(400, f"bad x-sim-fault item {item.strip()!r}; known: status:<4xx|5xx>, "
                                "abort-after:<events>, stall-ms:<ms>")
    return Fault(status, abort_after, stall_s)
