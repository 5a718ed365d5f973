"""Liveness and readiness: `/healthz` (the process answers), `/health` (vLLM's probe path)
and `/readyz` (an engine to serve with, not draining, a ledger that takes writes)."""

from __future__ import annotations

import orjson
from aiohttp import web

from core.errors import error_body
from gateway.appkeys import ACCOUNTING, PROXY, UPSTREAMS


async def healthz(request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def health(request: web.Request) -> web.Response:
    """vLLM's health path (GuideLLM and other vLLM clients probe it): 200 with an empty body
    when the gateway can serve, as vLLM answers once its engine is up; 503 otherwise."""
    ready = request.app[UPSTREAMS].ready() and not request.app[PROXY].draining
    if ready:
        return web.Response(status=200)
    return web.Response(status=503, content_type="application/json", body=error_body(
        "no model has a healthy endpoint yet", "server_error", "not_ready"))


async def readyz(request: web.Request) -> web.Response:
    proxy = request.app[PROXY]
    upstreams = request.app[UPSTREAMS]
    # A ledger whose file was deleted or replaced under it (sqlite) refuses every write:
    # nothing served now could be billed, so the gateway says it is not ready, and why.
    fault: str | None = (getattr(request.app[ACCOUNTING].ledger, "fault", None)
                         if ACCOUNTING in request.app else None)
    ready = upstreams.ready() and not proxy.draining and fault is None
    pools = {name: sum(1 for s in states if s.healthy and s.checked)
             for name, states in upstreams.pools.items()}
    body: dict[str, object] = {"status": "ready" if ready else "not_ready",
                               "draining": proxy.draining, "healthy_endpoints": pools}
    if fault is not None:
        body["reason"] = fault
    return web.Response(status=200 if ready else 503, body=orjson.dumps(body),
                        content_type="application/json")
