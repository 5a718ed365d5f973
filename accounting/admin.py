"""Admin HTTP handlers over the ledger: GET /admin/v1/usage and GET /admin/v1/requests/{id}.

`admin_routes(service)` returns the routes; the gateway adds admin-key auth and mounts them.
Where the apportioner runs in another process, `remote_check` fetches its energy check.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from accounting.ledger.base import LedgerError
from accounting.report import GROUP_KEYS, build_report
from accounting.service import AccountingService
from accounting.timeparse import parse_time
from core.errors import RequestError, WattgateError

DEFAULT_WINDOW_S = 86400.0


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(err: WattgateError, status: int | None = None) -> web.Response:
    return web.Response(body=err.body(), status=status or err.status,
                        content_type="application/json")


async def usage_response(service: AccountingService, q: Mapping[str, str], now: float,
                         tenant: str | None, extra: Mapping[str, Any] | None = None
                         ) -> web.Response:
    """The usage report of `/admin/v1/usage` (query: since, until, tenant, group_by); with
    `tenant` given, restricted to it whatever the query says (`/v1/usage`)."""
    try:
        until = parse_time(q["until"], now) if "until" in q else now
        since = parse_time(q["since"], now) if "since" in q else until - DEFAULT_WINDOW_S
        group_by = [g for g in q.get("group_by", "tenant").split(",") if g]
        bad = [g for g in group_by if g not in GROUP_KEYS]
        if bad:
            raise ValueError(f"group_by {bad[0]!r} is not one of {', '.join(GROUP_KEYS)}")
        if until <= since:
            raise ValueError("until must be after since")
    except ValueError as exc:
        return _error(RequestError(str(exc), code="invalid_query"))
    try:
        data = await service.ledger.usage(since, until, tenant or q.get("tenant") or None,
                                          group_by=group_by)
    except LedgerError as exc:
        return _error(exc, 503)
    report = build_report(data, group_by, since, until)
    return _json({"since_s": since, "until_s": until, "group_by": group_by,
                  "rows": report.rows, "total": report.total, **(extra or {})})


RemoteCheck = Callable[[], Awaitable[dict[str, Any] | None]]


def admin_routes(service: AccountingService, *, clock: Callable[[], float] = time.time,
                 remote_check: RemoteCheck | None = None) -> list[web.RouteDef]:
    async def usage(request: web.Request) -> web.Response:
        return await usage_response(service, request.query, clock(), None)

    async def request_detail(request: web.Request) -> web.Response:
        request_id = request.match_info["request_id"]
        try:
            got = await service.ledger.request(request_id)
        except LedgerError as exc:
            return _error(exc, 503)
        if got is None:
            got = service.pending_request(request_id)
        if got is None:
            return _error(RequestError(f"no request {request_id!r} in the ledger",
                                       code="request_not_found"), 404)
        return _json(got)

    async def energy_check(request: web.Request) -> web.Response:
        """Per engine, the counters' growth not found in the ledger (J; 0 while nothing is
        lost, None before the first reading) against one counter step, its tolerance; from
        the apportioner, in this process or in its own."""
        got = service.energy_check()
        if got is None and remote_check is not None:
            got = await remote_check()
        if got is None:
            return _error(WattgateError(
                "the apportioner runs in another process and did not answer: ask its own "
                "/energy-check (wattgate apportioner --port)", code="apportioner_unavailable"),
                503)
        return _json(got)

    return [web.get("/admin/v1/usage", usage),
            web.get("/admin/v1/requests/{request_id}", request_detail),
            web.get("/admin/v1/energy-check", energy_check)]
