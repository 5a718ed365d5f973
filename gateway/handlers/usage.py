"""`GET /v1/usage`: the calling tenant's own bill, limits and what remains of them."""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from core.errors import AuthError
from gateway.appkeys import ACCOUNTING, CONTROLS, PROXY


async def tenant_usage(request: web.Request) -> web.Response:
    """The calling tenant's own bill (as /admin/v1/usage, restricted to it), its limits and
    what remains of them."""
    app = request.app
    auth = app[PROXY].auth
    tenant = auth.tenant(request.headers.get("Authorization"))
    if tenant is auth.anonymous:
        raise AuthError("usage needs a tenant's API key", code="invalid_api_key")
    status = await app[CONTROLS].status(tenant)
    if ACCOUNTING not in app:
        return web.Response(body=orjson.dumps({**status, "rows": [], "total": None}),
                            content_type="application/json")
    from accounting.admin import usage_response

    return await usage_response(app[ACCOUNTING], request.query, time.time(), tenant.name,
                                status)
