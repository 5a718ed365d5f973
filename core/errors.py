"""The gateway's error tree and its one mapping to OpenAI-style JSON error bodies.

Every error a client can see is a `WattgateError` carrying an HTTP status, an OpenAI error
`type` and a stable `code`. Messages never contain upstream URLs or stack traces.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any, ClassVar

import orjson


class WattgateError(Exception):
    """Base of every error the gateway raises on purpose."""

    status: int = 500  # an instance may carry another (an engine's own error status)
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str] = "internal_error"
    # the engine's own error answer, passed on (its record status is upstream_http_<status>,
    # and the client's answer names the engine in x-wattgate-endpoint)
    from_engine: ClassVar[bool] = False

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 retry_after_s: float | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param
        self.retry_after_s = retry_after_s

    def body(self) -> bytes:
        """The OpenAI-style JSON body: {"error": {"message", "type", "param", "code"}}."""
        return error_body(self.message, self.error_type, self.code, self.param)

    def headers(self) -> dict[str, str]:
        """Headers that go with the error (`Retry-After` where the client should wait)."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": f"{max(1, math.ceil(self.retry_after_s))}"}


def error_body(message: str, error_type: str, code: str, param: str | None = None) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    )


class ConfigError(WattgateError):
    """A configuration file or value is invalid; `path` names the field."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}", code="invalid_config")
        self.path = path


class RequestError(WattgateError):
    status = 400
    error_type = "invalid_request_error"
    default_code = "invalid_request"


class InvalidJSONError(RequestError):
    default_code = "invalid_json"


class ModelNotFoundError(RequestError):
    status = 404
    default_code = "model_not_found"


class AuthError(WattgateError):
    status = 401
    error_type = "authentication_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(WattgateError):
    status = 403
    error_type = "permission_error"
    default_code = "precision_not_allowed"


class PayloadTooLargeError(RequestError):
    status = 413
    default_code = "request_too_large"


class RequestTimeoutError(RequestError):
    """The client did not send its request head or body in time."""

    status = 408
    default_code = "request_timeout"


class ClientTooSlowError(RequestError):
    """The request deadline passed while the client was not reading its stream: the gateway
    held the engine back for it, so the time ran out on the client's side, not the engine's."""

    status = 408
    default_code = "client_too_slow"


class UnsupportedMediaTypeError(RequestError):
    status = 415
    default_code = "unsupported_media_type"


class RoutingError(WattgateError):
    """No endpoint can take the request."""

    status = 503
    error_type = "service_unavailable"
    default_code = "no_healthy_endpoint"


class UpstreamError(WattgateError):
    """The engine failed: connect error, 5xx, or a broken stream."""

    status = 502
    error_type = "upstream_error"
    default_code = "upstream_error"


class UpstreamHttpError(UpstreamError):
    """The engine answered with an error status: its status and message, in our shape."""

    from_engine = True

    def __init__(self, status: int, message: str, *, code: str | None = None,
                 error_type: str | None = None, retry_after_s: float | None = None):
        super().__init__(message, code=code or f"upstream_http_{status}",
                         retry_after_s=retry_after_s)
        self.status = status
        self._type = error_type

    def body(self) -> bytes:
        return error_body(self.message, self._type or self.error_type, self.code, self.param)


class UpstreamTimeoutError(UpstreamError):
    status = 504
    default_code = "upstream_timeout"


class ShuttingDownError(WattgateError):
    status = 503
    error_type = "service_unavailable"
    default_code = "shutting_down"


class OverloadedError(WattgateError):
    """The gateway process is at one of its own limits (connections, requests in flight,
    file descriptors, memory): not an engine's fault, and worth a retry shortly."""

    status = 503
    error_type = "service_unavailable"
    default_code = "overloaded"

    def __init__(self, message: str, *, code: str | None = None, retry_after_s: float = 1.0):
        super().__init__(message, code=code, retry_after_s=retry_after_s)


MAX_ENGINE_MESSAGE = 1000  # characters of an engine's error message passed on


def engine_error(status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()
                 ) -> UpstreamHttpError:
    """An engine's error answer in the gateway's shape: its status, its message (from an
    OpenAI-style `{"error": {...}}`, vLLM's older top-level `{"message": ...}`, FastAPI's
    `{"detail": ...}`, or the text itself), its string `code` and `type` where it gave them,
    and its `Retry-After` (seconds)."""
    message = code = error_type = None
    doc: Any = None
    if body[:1] == b"{":
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
    if isinstance(doc, dict):
        err = doc["error"] if isinstance(doc.get("error"), dict) else doc
        message = err.get("message") if isinstance(err.get("message"), str) else None
        code = err.get("code") if isinstance(err.get("code"), str) else None
        error_type = err.get("type") if isinstance(err.get("type"), str) else None
        if message is None and isinstance(doc.get("detail"), str):
            message = doc["detail"]
    if message is None:
        message = body.decode("utf-8", "replace").strip()
    if not message:
        message = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
    retry_after = None
    for name, value in headers:
        if name.lower() == b"retry-after":
            retry_after = retry_after_seconds(value)
    return UpstreamHttpError(status, message[:MAX_ENGINE_MESSAGE], code=code,
                             error_type=error_type, retry_after_s=retry_after)


MAX_RETRY_AFTER_S = 86_400  # a day: what is passed on of an engine's longer Retry-After


def retry_after_seconds(value: bytes, now: float | None = None) -> int | None:
    """An engine's `Retry-After` in whole seconds (RFC 9110: delay-seconds, or an HTTP-date,
    which counts from now and is 0 once past), at most MAX_RETRY_AFTER_S; None when it is
    neither (a negative or fractional number, garbage)."""
    text = value.strip()
    if text.isdigit():
        return min(int(text), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(text.decode("latin-1"))
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT
        return None
    seconds = when.timestamp() - (time.time() if now is None else now)
    return min(max(0, math.ceil(seconds)), MAX_RETRY_AFTER_S)
