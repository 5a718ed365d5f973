"""`GET /v1/models`: the models the calling tenant may use, each with the precisions it is
served at that the tenant is allowed."""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.appkeys import CONFIG, PROXY, UPSTREAMS


async def models(request: web.Request) -> web.Response:
    app = request.app
    config = app[CONFIG]
    tenant = app[PROXY].auth.tenant(request.headers.get("Authorization"))
    upstreams = app[UPSTREAMS]
    allowed = set(tenant.precision.allowed)  # only what this tenant may use
    data = [{"id": pool.name, "object": "model", "created": 0, "owned_by": "wattgate",
             "precisions": precisions}
            for pool in config.models
            if (precisions := sorted({s.endpoint.precision for s in upstreams.pools[pool.name]}
                                     & allowed))]
    return web.Response(body=orjson.dumps({"object": "list", "data": data}),
                        content_type="application/json")
