"""The aiohttp application: routes, shared state (AppKeys) and lifecycle (cleanup_ctx)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import aiohttp
import orjson
from aiohttp import web

from accounting.service import AccountingService, EngineInfo
from accounting.supervisor import ApportionerChild
from core.errors import AuthError, ConfigError, WattgateError, error_body
from core.tokenizer import PromptCounter, TokenizerNotFound, load_tokenizer
from gateway.accesslog import AccessLog
from gateway.config import GatewayConfig
from gateway.front.aiohttp_errors import SERVER_NAME, refuse_shape
from gateway.front.connections import FrontConnections
from gateway.metrics import CONTENT_TYPE, GatewayMetrics
from gateway.proxy import Proxy, Sink
from gateway.routing.learner import RoutingModels, capacity_context
from gateway.telemetry.wiring import start_telemetry
from gateway.tenancy.controls import TenantControls
from gateway.upstreams import Upstreams
from wire.client import ClientSettings, UpstreamClient

log = logging.getLogger("wattgate.app")

CONFIG = web.AppKey("config", GatewayConfig)
METRICS = web.AppKey("metrics", GatewayMetrics)
UPSTREAMS = web.AppKey("upstreams", Upstreams)
PROXY = web.AppKey("proxy", Proxy)
ACCOUNTING = web.AppKey("accounting", AccountingService)
APPORTIONER = web.AppKey("apportioner", ApportionerChild)
CONNECTIONS = web.AppKey("connections", FrontConnections)
ROUTING_MODELS = web.AppKey("routing_models", RoutingModels)
CONTROLS = web.AppKey("controls", TenantControls)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

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


async def no_server_header(request: web.Request, response: web.StreamResponse) -> None:
    """aiohttp names itself and Python's version in `Server`; the gateway names itself."""
    response.headers["Server"] = SERVER_NAME


async def completions(request: web.Request) -> web.StreamResponse:
    return await request.app[PROXY].handle(request)


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


async def metrics(request: web.Request) -> web.Response:
    if not request.app[PROXY].auth.may_scrape(request.headers.get("Authorization")):
        raise AuthError("/metrics needs the metrics API key", code="invalid_metrics_key")
    body = request.app[METRICS].render()
    if APPORTIONER in request.app:
        # The apportioner process's series (tenant/engine energy, carbon, cost), appended:
        # one scrape target per gateway, whichever process counts them.
        body += await request.app[APPORTIONER].metrics_text()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


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


def require_admin(request: web.Request) -> None:
    if not request.app[PROXY].auth.is_admin(request.headers.get("Authorization")):
        raise AuthError("admin endpoints need the admin API key", code="invalid_admin_key")


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


def _admin_only(handler: Handler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        require_admin(request)
        return await handler(request)

    return guarded


def _accounting_service(config: GatewayConfig, gateway_metrics: GatewayMetrics,
                        child: ApportionerChild | None) -> AccountingService:
    """Linked to the accounting child where `wattgate serve` started one (it records and, for
    `process`, apportions); recorder only for `external` without a child (an app built
    without `wattgate serve`); inline otherwise (`inline`, or `process` without a child)."""
    acct = config.accounting
    assert acct is not None
    engines = [EngineInfo(name=ep.name, model=model, precision=ep.precision, gpus=ep.gpus,
                          kind=ep.kind)
               for model, ep in config.endpoints()]
    inline = acct.apportioner == "inline" or (acct.apportioner == "process" and child is None)
    return AccountingService(acct, engines, registry=gateway_metrics.registry, apportion=inline,
                             link=child.link if child is not None else None)


def _routing_models(config: GatewayConfig, accounting: AccountingService | None,
                    gateway_metrics: GatewayMetrics) -> RoutingModels:
    """The learnt endpoint models (a record sink), fed with the energy the accounting service
    has apportioned (its per-engine boundary: in memory where this process apportions, else
    read back from the ledger), and the capacity gauge."""
    models = RoutingModels.for_config(config,
                                      accounting.boundary if accounting is not None else None)
    ctx = capacity_context(config)
    for model, precision in {(m, ep.precision) for m, ep in config.endpoints()}:
        def needed(pool: tuple[str, str] = (model, precision)) -> float:
            need = models.pool_needs(ctx, time.monotonic()).get(pool)
            return float(need.needed) if need is not None else 0.0

        gateway_metrics.pool_engines_needed.labels(model, precision).set_function(needed)
    return models


def upstream_client(config: GatewayConfig) -> UpstreamClient:
    """The request path's keep-alive client to all engines (lean HTTP/1.1 on uvloop)."""
    t = config.timeouts
    return UpstreamClient(ClientSettings(connect_s=t.connect_s, first_byte_s=t.first_byte_s,
                                         read_s=t.read_s))


def upstream_session(config: GatewayConfig) -> aiohttp.ClientSession:
    """The aiohttp session for health checks and load scrapes (off the request path)."""
    t = config.timeouts
    connector = aiohttp.TCPConnector(limit=4096, limit_per_host=0, keepalive_timeout=60.0,
                                     ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=None, connect=t.connect_s, sock_connect=t.connect_s,
                                    sock_read=t.read_s)
    # auto_decompress off: bytes are relayed as the engine sent them.
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                 skip_auto_headers=("User-Agent",))


def prompt_counter(config: GatewayConfig) -> PromptCounter:
    """Each model's tokenizer, loaded once before the port is bound (ConfigError if missing)."""
    tokenizers = {}
    for i, pool in enumerate(config.models):
        if pool.tokenizer:
            try:
                tokenizers[pool.name] = load_tokenizer(pool.tokenizer)
            except TokenizerNotFound as exc:
                raise ConfigError(f"models[{i}].tokenizer", str(exc)) from None
    return PromptCounter(tokenizers)


def build_app(config: GatewayConfig, *, sinks: Sequence[Sink] = (),
              clock: Callable[[], float] = time.monotonic,
              wall: Callable[[], float] = time.time,
              apportioner: ApportionerChild | None = None) -> web.Application:
    """The gateway application; engine sessions and health checks start with the app.
    `apportioner`: the apportioner child `wattgate serve` started (this process then only
    records; without one, `accounting.apportioner: process` apportions inline)."""
    app = web.Application(client_max_size=config.max_body_bytes,
                          middlewares=[http_shape, edge_activity, json_errors])
    app.on_response_prepare.append(no_server_header)
    app[CONFIG] = config
    app[CONNECTIONS] = FrontConnections()
    gateway_metrics = GatewayMetrics()
    app[METRICS] = gateway_metrics
    upstreams = Upstreams(config)
    app[UPSTREAMS] = upstreams
    for state in upstreams.by_name.values():
        ep = state.endpoint
        gateway_metrics.inflight.labels(state.model, ep.name).set_function(state.inflight_now)
        gateway_metrics.endpoint_healthy.labels(state.model, ep.name, ep.precision).set_function(
            state.healthy_now)
    for model in upstreams.pools:
        gateway_metrics.pool_panic.labels(model).set_function(
            functools.partial(upstreams.panic_now, model))

    counter = prompt_counter(config)
    all_sinks = list(sinks)
    if config.access_log:
        access_log = AccessLog(config.access_log)
        all_sinks.append(access_log)

        async def access_log_ctx(_app: web.Application) -> AsyncIterator[None]:
            access_log.start()
            yield
            access_log.stop()  # after the proxy's context: in-flight requests are written too

        app.cleanup_ctx.append(access_log_ctx)
    if config.accounting is not None and config.accounting.enabled:
        accounting = _accounting_service(config, gateway_metrics, apportioner)
        app[ACCOUNTING] = accounting
        if apportioner is not None:
            app[APPORTIONER] = apportioner
            apportioner.register(gateway_metrics.registry)
        all_sinks.append(accounting.record)
        # registered before the proxy's context, so it stops after in-flight requests drained
        app.cleanup_ctx.append(accounting.cleanup_ctx)
        from accounting.admin import admin_routes

        for route in admin_routes(accounting, remote_check=(
                apportioner.energy_check if apportioner is not None else None)):
            assert isinstance(route, web.RouteDef)
            app.router.add_route(route.method, route.path, _admin_only(route.handler))

    controls = app[CONTROLS] = TenantControls(
        config, gateway_metrics.registry, clock=clock, wall=wall,
        replica=app[ACCOUNTING].replica if ACCOUNTING in app else None)

    routing_models = _routing_models(config, app.get(ACCOUNTING), gateway_metrics)
    app[ROUTING_MODELS] = routing_models
    all_sinks.append(routing_models)
    tracing = start_telemetry(app, config, all_sinks, app[ACCOUNTING].apportioner_metrics
                              if ACCOUNTING in app else None)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        session = upstream_session(config)
        client = upstream_client(config)
        app[PROXY] = proxy = Proxy(config, upstreams, client, gateway_metrics, all_sinks,
                                   clock=clock, wall=wall, counter=counter,
                                   admission=controls.admission, tracing=tracing)
        if ACCOUNTING in app:
            app[ACCOUNTING].watch(proxy.open_since)
        async with upstreams.running(session):
            yield
            await drain(app)
        client.close()
        await session.close()

    app.cleanup_ctx.append(controls.cleanup_ctx)  # stops after the proxy drained
    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/usage", tenant_usage)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/health", health)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/v1/endpoints", admin_endpoints)
    return app


async def drain(app: web.Application) -> None:
    """Refuse new requests and wait (bounded) for in-flight ones to finish."""
    proxy = app[PROXY]
    proxy.draining = True
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(app[CONFIG].drain_timeout_s):
            await proxy.idle.wait()
