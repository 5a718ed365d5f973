"""Parsing and checking one client request (pure): body -> what the gateway needs to route it.

The body is decoded once with orjson. Everything except `model` (and, for streams,
`stream_options.include_usage`) is passed through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidJSONError, RequestError, UnsupportedMediaTypeError
from gateway.routing.precision import split_model


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    body: dict[str, Any]
    model: str  # the alias, without any @precision
    precision: str | None  # per-request override, from `model@p` or the header
    stream: bool
    client_wants_usage: bool


def check_content_type(content_type: str) -> None:
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        raise UnsupportedMediaTypeError(
            f"Content-Type must be application/json, got {content_type or 'none'!r}")


def parse_body(raw: bytes, header_precision: str | None) -> ParsedRequest:
    """Decode and check the fields the gateway reads; raises RequestError (HTTP 400)."""
    if not raw:
        raise InvalidJSONError("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSONError(f"request body is not valid JSON: {exc.msg} at position {exc.pos}"
                               ) from None
    if not isinstance(body, dict):
        raise InvalidJSONError("request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise RequestError("you must provide a model parameter", code="missing_model", param="model")
    if not isinstance(model, str) or not model:
        raise RequestError("model must be a non-empty string", code="invalid_model", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream must be true or false", code="invalid_type", param="stream")
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
    return ParsedRequest(body=body, model=alias, precision=precision, stream=stream,
                         client_wants_usage=wants_usage)


def upstream_body(req: ParsedRequest, raw: bytes, upstream_model: str) -> bytes:
    """The body to send upstream: the client's bytes unless the model name or usage must change.

    Streams always ask the engine for usage (`include_usage`), so token counts are exact.
    """
    needs_model = req.body.get("model") != upstream_model
    needs_usage = req.stream and not req.client_wants_usage
    if not needs_model and not needs_usage:
        return raw
    body = dict(req.body)
    body["model"] = upstream_model
    if req.stream:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return orjson.dumps(body)


def prefix_key(body: dict[str, Any], chars: int) -> bytes:
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
