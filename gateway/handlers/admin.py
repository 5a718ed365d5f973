"""The admin API's gateway side: the admin key check for every `/admin/` route, and
`GET /admin/v1/endpoints` (live endpoint state). The accounting routes (`/admin/v1/usage`,
requests, energy check) come from accounting/admin.py, guarded here."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from core.errors import AuthError
from gateway.appkeys import PROXY, ROUTING_MODELS, UPSTREAMS

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def require_admin(request: web.Request) -> None:
    if not request.app[PROXY].auth.is_admin(request.headers.get("Authorization")):
        raise AuthError("admin endpoints need the admin API key", code="invalid_admin_key")


def admin_only(handler: Handler) -> Handler:
    """`handler` behind the admin key."""
    async def guarded(request: web.Request) -> web.StreamResponse:
        require_admin(request)
        return await handler(request)

    return guarded


async def admin_endpoints(request: web.Request) -> web.Response:
    """Live endpoint state (health, in-flight, scraped engine load), like Envoy's /clusters."""
    require_admin(request)
    upstreams = request.app[UPSTREAMS]
    now = upstreams.clock()
    rows: list[dict[str, object]] = [
            {"model": st.model, "name": st.endpoint.name, "url": st.endpoint.url,
             "kind": st.endpoint.kind, "precision": st.endpoint.precision,
             "quality": (dataclasses.asdict(st.endpoint.quality)
                         if st.endpoint.quality is not None else None),
             "healthy": st.healthy, "checked": st.checked, "inflight": st.inflight,
             "running": st.load.running, "waiting": st.load.waiting,
             "kv_usage": st.load.kv_usage, "scrapes": st.scrapes,
             "consecutive_failures": st.consecutive_failures, "ejections": st.ejections,
             # what routing weighs it by (gateway/routing/success.py); 1: no recent failure
             "success_ratio": round(st.recent.ratio(now, upstreams.tau_s), 4),
             # wall-clock seconds; null when not ejected
             "ejected_until": (time.time() + st.ejected_until - now if st.ejected(now)
                               else None)}
            for st in upstreams.by_name.values()]
    # The learnt models (read-only): TTFT/TPOT/power/J per token by load, cold until sampled
    learnt = request.app[ROUTING_MODELS].snapshot()
    for row in rows:
        row["model_curves"] = learnt.get(str(row["name"]))
    return web.Response(body=orjson.dumps({"endpoints": rows}), content_type="application/json")
