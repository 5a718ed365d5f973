"""One client request, read once (pure): its bytes -> the prepared request every later step uses.

The body is decoded once with orjson and checked; what routing, admission and the upstream
need is taken from it there and then, and nothing later reads the body again except the
prompt count of a request whose engine never reported usage. Everything except `model`
(and, for streams, `stream_options.include_usage`) goes to the engine untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from core.errors import InvalidJSONError, RequestError, UnsupportedMediaTypeError
from core.tokenizer import BYTES_PER_TOKEN, prompt_text
from gateway.routing.precision import split_model


@dataclass(slots=True)
class PreparedRequest:
    """A checked request, built once by the admit step and only read after it.

    Not frozen: a frozen dataclass sets each field through `object.__setattr__`, which makes
    building this one several times slower, on every request.
    """

    body: dict[str, Any]  # decoded, as the client sent it (its prompt may be counted later)
    model: str  # the alias, without any @precision
    precision: str | None  # per-request override, from `model@p` or the header
    stream: bool
    client_wants_usage: bool  # a stream whose client set stream_options.include_usage
    # Size hints, taken only where admission or routing reads them (the estimate walks the
    # whole prompt): the output tokens asked for (`max_completion_tokens`, else
    # `max_tokens`; None when unset) and the prompt's tokens estimated from its bytes (4 per
    # token) or its token ids (None: not taken).
    max_tokens: int | None
    prompt_estimate: float | None
    prefix_key: bytes  # the prompt's first characters, for prefix affinity (b"": not used)
    raw: bytes  # the client's bytes
    # The upstream body for engines that serve `upstream_model` (None: the pool's engines
    # name the model differently; each attempt builds its own).
    upstream_model: str | None
    upstream: bytes

    def upstream_body(self, upstream_model: str) -> bytes:
        """What to send an engine that serves `upstream_model`: the client's bytes unless
        the model name or usage must change. Streams always ask the engine for usage
        (`include_usage`), so token counts are exact."""
        if upstream_model == self.upstream_model:
            return self.upstream
        return _upstream_bytes(self.body, self.raw, self.stream, self.client_wants_usage,
                               upstream_model)


def check_content_type(content_type: str) -> None:
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        raise UnsupportedMediaTypeError(
            f"Content-Type must be application/json, got {content_type or 'none'!r}")


def prepare(raw: bytes, header_precision: str | None, upstream_models: Mapping[str, str | None],
            *, prefix_chars: int = 0, estimate: bool = False) -> PreparedRequest:
    """Decode and check the request; raises RequestError (HTTP 400). Whether its model
    exists is the caller's question.

    `upstream_models`: alias -> the model name all its engines serve (None where they
    differ). `prefix_chars` > 0 takes the prefix key; `estimate` the size hints.
    """
    body = _decode(raw)
    model = body.get("model")
    if model is None:
        raise RequestError("you must provide a model parameter", code="missing_model", param="model")
    if not isinstance(model, str) or not model:
        raise RequestError("model must be a non-empty string", code="invalid_model", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream must be true or false", code="invalid_type", param="stream")
    _check_token_limits(body)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError("stream_options must be an object", code="invalid_type",
                           param="stream_options")
    alias, at_precision = split_model(model)
    precision = header_precision.strip().lower() if header_precision else at_precision
    if at_precision and header_precision and at_precision != precision:
        raise RequestError(f"model asks for {at_precision!r} but x-wattgate-precision for "
                           f"{precision!r}", code="conflicting_precision", param="model")
    wants_usage = bool(stream and options and options.get("include_usage") is True)
    shared = upstream_models.get(alias)
    upstream = raw if shared is None else _upstream_bytes(body, raw, stream, wants_usage, shared)
    return PreparedRequest(
        body=body, model=alias, precision=precision, stream=stream,
        client_wants_usage=wants_usage, max_tokens=asked_tokens(body) if estimate else None,
        prompt_estimate=prompt_estimate(body) if estimate else None,
        prefix_key=prefix_key(body, prefix_chars) if prefix_chars > 0 else b"",
        raw=raw, upstream_model=shared, upstream=upstream)


def _decode(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise InvalidJSONError("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSONError(f"request body is not valid JSON: {exc.msg} at position {exc.pos}"
                               ) from None
    if not isinstance(body, dict):
        raise InvalidJSONError("request body must be a JSON object")
    return body


_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")


def _check_token_limits(body: Mapping[str, Any]) -> None:
    """Admission and routing read the output tokens asked for: each limit is an integer of at
    least 1, or null/absent (not a string, a float or a boolean, which an engine would refuse
    only after the gateway had reserved and routed on it)."""
    for name in _TOKEN_LIMITS:
        value = body.get(name)
        if value is None:
            continue
        if type(value) is not int:  # bool is an int subclass; `type` keeps it out
            raise RequestError(f"{name} must be an integer or null", code="invalid_type",
                               param=name)
        if value < 1:
            raise RequestError(f"{name} must be at least 1, got {value}",
                               code="integer_below_min_value", param=name)


def _upstream_bytes(body: dict[str, Any], raw: bytes, stream: bool, wants_usage: bool,
                    upstream_model: str) -> bytes:
    if body.get("model") == upstream_model and not (stream and not wants_usage):
        return raw
    out = dict(body)
    out["model"] = upstream_model
    if stream:
        out["stream_options"] = {**(out.get("stream_options") or {}), "include_usage": True}
    return orjson.dumps(out)


def asked_tokens(body: Mapping[str, Any]) -> int | None:
    """`max_completion_tokens`, else `max_tokens` (`prepare` checked both), when set; null
    is unset, as in OpenAI's API."""
    asked = body.get("max_completion_tokens")
    if asked is None:
        asked = body.get("max_tokens")
    return asked if isinstance(asked, int) and not isinstance(asked, bool) and asked >= 0 \
        else None


def prompt_estimate(body: Mapping[str, Any]) -> float:
    """Prompt tokens from the prompt's bytes (BYTES_PER_TOKEN each), or its token-id count:
    admission and routing must not wait for a tokenizer."""
    text = prompt_text(body)
    if isinstance(text, list):
        return float(len(text))
    if not text:
        return 0.0
    # an ASCII string's length is its UTF-8 size (isascii reads a flag: no pass, no copy)
    return (len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
            ) / BYTES_PER_TOKEN


def prefix_key(body: Mapping[str, Any], chars: int) -> bytes:
    """The first `chars` characters of the prompt text, for prefix-affinity routing."""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    if isinstance(prompt, str):
        return prompt[:chars].encode()
    messages = body.get("messages")
    if not isinstance(messages, list):
        return b""
    parts: list[str] = []
    size = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
            size += len(content)
            if size >= chars:
                break
    return "\n".join(parts)[:chars].encode()
