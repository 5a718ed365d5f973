"""aiohttp's own error answers, in the gateway's shape.

aiohttp answers what it cannot parse (a bad request line, a bare LF, a NUL in a header, a
malformed chunked body) itself: text/plain, the offending input echoed back, a `Server:
Python/... aiohttp/...` header, and an ERROR traceback in the log that quotes the raw bytes,
keys and prompts included. The handler here answers those with the OpenAI-style JSON every
other error has, names no software, logs one line with the error's kind only, and counts each
refused request by reason (gateway/front/refusals.py), as the lean front does.

aiohttp says 400 for every head it cannot take; an oversized one gets 414 (request line) or
431 (a header line, too many headers) here. aiohttp's `LineTooLong` names only the limit it
hit, so the request-line limit is set one byte apart from the header-field limit (the
runner's `max_line_size` and `max_field_size`) to tell the two apart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from core.errors import error_body
from gateway.front.refusals import EDGE_ERRORS, OTHER_CLIENT_ERROR
from wire.request_head import shape_refusal

log = logging.getLogger("wattgate.edge")

SERVER_NAME = "wattgate"
REQUEST_LINE_MAX_BYTES = 8191  # aiohttp's default, 8190, is the header-field limit
FIELD_MAX_BYTES = 8190
_TOO_MANY_HEADERS = "Too many headers received"  # aiohttp's message; it has no own class
_CODES = {404: "not_found", 405: "method_not_allowed", 500: "internal_error", 504: "timeout"}
_MESSAGES = {500: "internal gateway error"}


def edge_status(status: int, exc: BaseException | None) -> int:
    """The status to answer: aiohttp's 400 for an oversized head becomes 414 or 431."""
    if status != 400 or not isinstance(exc, BadHttpMessage):
        return status
    if isinstance(exc, LineTooLong):
        return 414 if exc.args[1] == REQUEST_LINE_MAX_BYTES else 431
    return 431 if exc.message == _TOO_MANY_HEADERS else status


class SafeRequestHandler(RequestHandler):
    """aiohttp's connection handler with `handle_error` answering in JSON, echoing nothing,
    and counting each client error by reason (`on_reject`)."""

    def __init__(self, *args: Any, on_reject: Callable[[str], None] | None = None,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.on_reject = on_reject

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None, message: str | None = None
                     ) -> web.StreamResponse:
        status = edge_status(status, exc)
        log.warning("HTTP %d on a client connection: %s", status,
                    type(exc).__name__ if exc is not None else "no exception")
        edge = EDGE_ERRORS.get(status)
        if (400 <= status < 500 or edge is not None) and self.on_reject is not None:
            self.on_reject(edge.reason if edge is not None else OTHER_CLIENT_ERROR)
        if request.writer.output_size > 0:  # part of an answer went out: nothing can follow
            raise ConnectionError("response already started; closing the connection")
        phrase = HTTPStatus(status).phrase.lower() if status in HTTPStatus._value2member_map_ else ""
        kind = "server_error" if status >= 500 else "invalid_request_error"
        if edge is not None:
            body = error_body(edge.message, kind, edge.code)
        else:
            body = error_body(_MESSAGES.get(status, phrase), kind,
                              _CODES.get(status, "http_error"))
        resp = web.Response(status=status, body=body, content_type="application/json",
                            headers={"Server": SERVER_NAME, "Connection": "close"})
        resp.force_close()
        return resp


def refuse_shape(request: BaseRequest) -> web.StreamResponse | None:
    """The answer to a request aiohttp parsed but no server should serve (wire's
    `shape_refusal`: HTTP/0.9, another version than 1.x, a transfer coding it would not undo),
    or None. Answered and counted as the lean front answers it, and the connection closed."""
    coding = request.headers.getall("Transfer-Encoding", None)
    version = (request.version.major, request.version.minor)
    refusal = shape_refusal(None if version == (0, 9) else version,
                            ", ".join(coding).encode("latin-1") if coding else None)
    if refusal is None:
        return None
    handler = request.protocol
    if isinstance(handler, SafeRequestHandler):
        return handler.handle_error(request, refusal.status)
    edge = EDGE_ERRORS[refusal.status]
    resp = web.Response(status=refusal.status, content_type="application/json",
                        body=error_body(edge.message, "invalid_request_error"
                                        if refusal.status < 500 else "server_error", edge.code),
                        headers={"Connection": "close"})
    resp.force_close()
    return resp


def safe_handler_factory(server: web.Server, on_reject: Callable[[str], None] | None = None
                         ) -> Callable[[], asyncio.Protocol]:
    """Make handlers for connections the front hands to aiohttp, with the runner's settings
    (keep-alive, cancellation, access log, parser limits: what `server()` would pass);
    `on_reject` counts client errors by reason."""
    kwargs: dict[str, Any] = server._kwargs  # aiohttp keeps the runner's handler settings here
    loop = asyncio.get_running_loop()
    return lambda: SafeRequestHandler(server, loop=loop, on_reject=on_reject, **kwargs)
