"""The aiohttp app's middlewares and response hook: every error as OpenAI-style JSON, the lean
front's refusals on the connections aiohttp serves, the edge's head deadline paused while a
request runs, and the gateway's own `Server` header."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web

from core.errors import WattgateError, error_body
from gateway.appkeys import CONNECTIONS
from gateway.front.aiohttp_errors import SERVER_NAME, refuse_shape

log = logging.getLogger("wattgate.app")

_STATUS_CODES = {404: ("not_found", "invalid_request_error"),
                 405: ("method_not_allowed", "invalid_request_error"),
                 413: ("request_too_large", "invalid_request_error")}


@web.middleware
async def json_errors(request: web.Request, handler: Callable[[web.Request], object]
                      ) -> web.StreamResponse:
    """Every error leaves as OpenAI-style JSON; nothing internal (trace, URL) is exposed."""
    try:
        response = await handler(request)  # type: ignore[misc]
        assert isinstance(response, web.StreamResponse)
        return response
    except WattgateError as exc:
        return web.Response(status=exc.status, body=exc.body(), content_type="application/json",
                            headers=exc.headers())
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code, kind = _STATUS_CODES.get(exc.status, ("http_error", "invalid_request_error"))
        return web.Response(status=exc.status, content_type="application/json",
                            body=error_body(exc.reason, kind, code))
    except asyncio.CancelledError:
        raise
    except Exception:  # last line of defence: log the trace, show the client none of it
        log.exception("unhandled error on %s %s", request.method, request.path)
        return web.Response(status=500, content_type="application/json",
                            body=error_body("internal gateway error", "server_error",
                                            "internal_error"))


@web.middleware
async def http_shape(request: web.Request, handler: Callable[[web.Request], object]
                     ) -> web.StreamResponse:
    """Requests on connections aiohttp serves get the lean front's refusals too (HTTP/0.9,
    another version than 1.x, a transfer coding other than chunked)."""
    refused = refuse_shape(request)
    if refused is not None:
        return refused
    response = await handler(request)  # type: ignore[misc]
    assert isinstance(response, web.StreamResponse)
    return response


@web.middleware
async def edge_activity(request: web.Request, handler: Callable[[web.Request], object]
                        ) -> web.StreamResponse:
    """Tells the edge that a connection handed to aiohttp has a request in flight, so its
    head deadline does not run meanwhile."""
    guard = request.app[CONNECTIONS].handed.get(request.transport)
    if guard is not None:
        guard.request_started()
    try:
        response = await handler(request)  # type: ignore[misc]
        assert isinstance(response, web.StreamResponse)
        return response
    finally:
        if guard is not None:
            guard.request_done(asyncio.get_running_loop().time())


# outermost first: the shape check answers before anything else runs
MIDDLEWARES = (http_shape, edge_activity, json_errors)


async def no_server_header(request: web.Request, response: web.StreamResponse) -> None:
    """aiohttp names itself and Python's version in `Server`; the gateway names itself."""
    response.headers["Server"] = SERVER_NAME
