"""The gateway's error tree and its one mapping to OpenAI-style JSON error bodies.

Every error a client can see is a `WattgateError` carrying an HTTP status, an OpenAI error
`type` and a stable `code`. Messages never contain upstream URLs or stack traces.
"""

from __future__ import annotations

from typing import ClassVar

import orjson


class WattgateError(Exception):
    """Base of every error the gateway raises on purpose."""

    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param

    def body(self) -> bytes:
        """The OpenAI-style JSON body: {"error": {"message", "type", "param", "code"}}."""
        return error_body(self.message, self.error_type, self.code, self.param)


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


class UpstreamTimeoutError(UpstreamError):
    status = 504
    default_code = "upstream_timeout"


class ShuttingDownError(WattgateError):
    status = 503
    error_type = "service_unavailable"
    default_code = "shutting_down"
