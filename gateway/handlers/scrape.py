"""`GET /metrics`: the gateway's Prometheus series, and the accounting child's appended (one
scrape target per gateway, whichever process counts them); behind the metrics key if one
is configured. A node's worker (`wattgate serve --workers N`) answers for every worker of
the node (gateway/workers/peers.py) and the node's one child."""

from __future__ import annotations

from aiohttp import web

from core.errors import AuthError
from gateway.appkeys import APPORTIONER, METRICS, PROXY
from gateway.serving_metrics import CONTENT_TYPE
from gateway.workers.peers import NODE, node_series


async def metrics(request: web.Request) -> web.Response:
    if not request.app[PROXY].auth.may_scrape(request.headers.get("Authorization")):
        raise AuthError("/metrics needs the metrics API key", code="invalid_metrics_key")
    if NODE in request.app:
        body = await node_series(request.app)
    else:
        body = request.app[METRICS].render()
    if APPORTIONER in request.app:
        # The apportioner process's series (tenant/engine energy, carbon, cost), appended:
        # one scrape target per gateway, whichever process counts them.
        body += await request.app[APPORTIONER].metrics_text()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
