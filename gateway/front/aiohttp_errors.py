"""aiohttp's own error answers, in the gateway's shape.

aiohttp answers what it cannot parse (a bad request line, a bare LF, a NUL in a header, a
malformed chunked body) itself: text/plain, the offending input echoed back, a `Server:
Python/... aiohttp/...` header, and an ERROR traceback in the log that quotes the raw bytes,
keys and prompts included. The handler here answers those with the OpenAI-style JSON every
other error has, names no software, and logs one line with the error's kind only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from gateway.errors import error_body

log = logging.getLogger("wattgate.edge")

SERVER_NAME = "wattgate"
_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed",
          408: "request_timeout", 413: "request_too_large", 431: "request_header_too_large",
          500: "internal_error", 504: "timeout"}
_MESSAGES = {400: "the request is not valid HTTP/1.1",
             413: "the request is larger than the gateway accepts",
             431: "the request's header fields are too large",
             500: "internal gateway error"}


class SafeRequestHandler(RequestHandler):
    """aiohttp's connection handler with `handle_error` answering in JSON, echoing nothing."""

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None, message: str | None = None
                     ) -> web.StreamResponse:
        log.warning("HTTP %d on a client connection: %s", status,
                    type(exc).__name__ if exc is not None else "no exception")
        if request.writer.output_size > 0:  # part of an answer went out: nothing can follow
            raise ConnectionError("response already started; closing the connection")
        phrase = HTTPStatus(status).phrase.lower() if status in HTTPStatus._value2member_map_ else ""
        kind = "server_error" if status >= 500 else "invalid_request_error"
        body = error_body(_MESSAGES.get(status, phrase), kind, _CODES.get(status, "http_error"))
        resp = web.Response(status=status, body=body, content_type="application/json",
                            headers={"Server": SERVER_NAME})
        resp.force_close()
        return resp


def safe_handler_factory(server: web.Server) -> Callable[[], asyncio.Protocol]:
    """Make handlers for connections the front hands to aiohttp, with the runner's settings
    (keep-alive, cancellation, access log: what `server()` would pass)."""
    kwargs: dict[str, Any] = server._kwargs  # aiohttp keeps the runner's handler settings here
    loop = asyncio.get_running_loop()
    return lambda: SafeRequestHandler(server, loop=loop, **kwargs)
