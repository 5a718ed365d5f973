"""The composition root: `build_app` builds the aiohttp application from the config, puts
the shared state on it (gateway/appkeys.py), wires the record sinks, the lifecycle
(cleanup_ctx) and the routes to the handlers of gateway/handlers/."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
from aiohttp import web

from accounting.mode import AccountingMode, accounting_mode
from accounting.service import AccountingService, EngineInfo
from accounting.supervisor import ApportionerChild
from core.errors import ConfigError
from core.tokenizer import PromptCounter, TokenizerNotFound, load_tokenizer
from gateway.accesslog import AccessLog
from gateway.appkeys import (
    ACCOUNTING,
    APPORTIONER,
    CONFIG,
    CONNECTIONS,
    CONTROLS,
    METRICS,
    PROXY,
    ROUTING_MODELS,
    UPSTREAMS,
)
from gateway.config import GatewayConfig
from gateway.front.connections import FrontConnections
from gateway.handlers.admin import admin_endpoints, admin_only
from gateway.handlers.completions import completions
from gateway.handlers.health import health, healthz, readyz
from gateway.handlers.middlewares import MIDDLEWARES, no_server_header
from gateway.handlers.model_list import models
from gateway.handlers.scrape import metrics
from gateway.handlers.usage import tenant_usage
from gateway.proxy import Proxy, Sink
from gateway.routing.learner import RoutingModels, capacity_context
from gateway.serving_metrics import GatewayMetrics
from gateway.telemetry.wiring import start_telemetry
from gateway.tenancy.controls import TenantControls
from gateway.tenancy.rate_store import BucketStore
from gateway.upstreams import Upstreams
from wire.client import ClientSettings, UpstreamClient


def _accounting_service(config: GatewayConfig, mode: AccountingMode,
                        gateway_metrics: GatewayMetrics, child: ApportionerChild | None
                        ) -> AccountingService:
    """The roles of `mode` in this process; linked to the accounting child where the mode
    records there."""
    acct = config.accounting
    assert acct is not None
    engines = [EngineInfo(name=ep.name, model=model, precision=ep.precision, gpus=ep.gpus,
                          kind=ep.kind)
               for model, ep in config.endpoints()]
    # recorded under the child's replica name: a node's workers share their child's
    return AccountingService(acct, engines, registry=gateway_metrics.registry, mode=mode,
                             link=child.link if child is not None else None,
                             replica=child.replica if child is not None else None)


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


# the routes of the handlers in gateway/handlers/ (the admin API's accounting routes are added
# with the accounting service)
ROUTES = (
    web.post("/v1/chat/completions", completions),
    web.post("/v1/completions", completions),
    web.post("/v1/embeddings", completions),
    web.get("/v1/models", models),  # GET routes answer HEAD too
    web.get("/v1/usage", tenant_usage),
    web.get("/healthz", healthz),
    web.get("/health", health),
    web.get("/readyz", readyz),
    web.get("/metrics", metrics),
    web.get("/admin/v1/endpoints", admin_endpoints),
)


def build_app(config: GatewayConfig, *, sinks: Sequence[Sink] = (),
              clock: Callable[[], float] = time.monotonic,
              wall: Callable[[], float] = time.time, accounting: AccountingMode | None = None,
              apportioner: ApportionerChild | None = None,
              node_store: BucketStore | None = None) -> web.Application:
    """The gateway application; engine sessions and health checks start with the app.
    `accounting`: the accounting mode `wattgate serve` decided (None: an app built in code,
    `accounting_mode(config.accounting, "code")`); `apportioner`: the accounting child
    `wattgate serve` started where that mode records there; `node_store`: a node's rate
    store, for a worker of `wattgate serve --workers N`."""
    mode = accounting if accounting is not None else accounting_mode(config.accounting, "code")
    assert (apportioner is not None) == (mode.child is not None), mode
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=MIDDLEWARES)
    app.on_response_prepare.append(no_server_header)
    app[CONFIG] = config
    app[CONNECTIONS] = FrontConnections()
    gateway_metrics = app[METRICS] = GatewayMetrics()
    upstreams = app[UPSTREAMS] = _upstreams(config, gateway_metrics)
    counter = prompt_counter(config)
    all_sinks = list(sinks)
    if config.access_log:
        all_sinks.append(_access_log(app, config.access_log))
    service = (_accounting(app, config, mode, gateway_metrics, apportioner) if mode.enabled
               else None)
    if service is not None:
        all_sinks.append(service.record)
    controls = app[CONTROLS] = TenantControls(
        config, gateway_metrics.registry, clock=clock, wall=wall,
        replica=service.replica if service is not None else None, node_store=node_store)
    routing_models = app[ROUTING_MODELS] = _routing_models(config, service, gateway_metrics)
    all_sinks.append(routing_models)
    tracing = start_telemetry(app, config, all_sinks, service.apportioner_metrics
                              if service is not None else None)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        session = upstream_session(config)
        client = upstream_client(config)
        app[PROXY] = proxy = Proxy(config, upstreams, client, gateway_metrics, all_sinks,
                                   clock=clock, wall=wall, counter=counter,
                                   admission=controls.admission, tracing=tracing,
                                   after_records=service.link.after_sent
                                   if service is not None and service.link is not None
                                   else None)
        if service is not None:
            service.watch(proxy.open_since)
        async with upstreams.running(session):
            yield
            await drain(app)
        client.close()
        await session.close()

    app.cleanup_ctx.append(controls.cleanup_ctx)  # stops after the proxy drained
    app.cleanup_ctx.append(lifecycle)
    app.router.add_routes(ROUTES)
    return app


def _upstreams(config: GatewayConfig, gateway_metrics: GatewayMetrics) -> Upstreams:
    """The endpoints' live state, with the gauges that read it at each scrape."""
    upstreams = Upstreams(config)
    for state in upstreams.by_name.values():
        ep = state.endpoint
        gateway_metrics.inflight.labels(state.model, ep.name).set_function(state.inflight_now)
        gateway_metrics.endpoint_healthy.labels(state.model, ep.name, ep.precision).set_function(
            state.healthy_now)
    for model in upstreams.pools:
        gateway_metrics.pool_panic.labels(model).set_function(
            functools.partial(upstreams.panic_now, model))
    return upstreams


def _access_log(app: web.Application, path: str) -> AccessLog:
    """The access log (a record sink), written from the app's start to its end."""
    access_log = AccessLog(path)

    async def access_log_ctx(_app: web.Application) -> AsyncIterator[None]:
        access_log.start()
        yield
        access_log.stop()  # after the proxy's context: in-flight requests are written too

    app.cleanup_ctx.append(access_log_ctx)
    return access_log


def _accounting(app: web.Application, config: GatewayConfig, mode: AccountingMode,
                gateway_metrics: GatewayMetrics, apportioner: ApportionerChild | None
                ) -> AccountingService:
    """The accounting service of `mode` on the app, its lifecycle and its admin routes."""
    service = app[ACCOUNTING] = _accounting_service(config, mode, gateway_metrics, apportioner)
    if apportioner is not None:
        app[APPORTIONER] = apportioner
        apportioner.register(gateway_metrics.registry)
    # registered before the proxy's context, so it stops after in-flight requests drained
    app.cleanup_ctx.append(service.cleanup_ctx)
    from accounting.admin import admin_routes

    for route in admin_routes(service, remote_check=(
            apportioner.energy_check if apportioner is not None else None)):
        assert isinstance(route, web.RouteDef)
        app.router.add_route(route.method, route.path, admin_only(route.handler))
    return service


async def drain(app: web.Application) -> None:
    """Refuse new requests and wait (bounded) for in-flight ones to finish."""
    proxy = app[PROXY]
    proxy.draining = True
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(app[CONFIG].drain_timeout_s):
            await proxy.idle.wait()
