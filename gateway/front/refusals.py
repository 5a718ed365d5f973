"""The edge's answers to heads no server should take, the same on the lean front and on the
connections handed to aiohttp: status -> the JSON error's code and message, and the reason
that counts it in `wattgate_client_connection_errors_total{reason}` (a bounded label)."""

from __future__ import annotations

from typing import Final, NamedTuple


class EdgeError(NamedTuple):
    code: str  # the OpenAI-style error's `code`
    message: str
    reason: str  # the counter's label


EDGE_ERRORS: Final = {
    400: EdgeError("bad_request", "the request is not valid HTTP/1.1", "bad_request"),
    408: EdgeError("request_timeout", "the request did not arrive in time", "request_timeout"),
    413: EdgeError("request_too_large", "the request is larger than the gateway accepts",
                   "request_too_large"),
    414: EdgeError("uri_too_long", "the request line is longer than the gateway accepts",
                   "uri_too_long"),
    431: EdgeError("request_header_too_large", "the request's header fields are too large",
                   "head_too_large"),
    501: EdgeError("transfer_coding_not_implemented",
                   "the gateway takes request bodies as they are or chunked, in no other "
                   "transfer coding", "transfer_coding_not_implemented"),
    505: EdgeError("http_version_not_supported", "the gateway speaks HTTP/1.1 (and 1.0)",
                   "http_version_not_supported"),
}
OTHER_CLIENT_ERROR: Final = "other_client_error"  # the reason for any other 4xx
