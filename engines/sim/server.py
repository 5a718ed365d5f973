"""The simulated engine's HTTP server: the OpenAI API of a dialect plus /sim/* ground truth.

Handlers are thin: validation and response shapes live in protocol.py, metrics rendering
in metrics.py, the engine in a pure core driven by runtime.py.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
from aiohttp import web

from engines.sim.catalog import Deployment
from engines.sim.config import SimConfig
from engines.sim.fixed import FixedTimingCore
from engines.sim.metrics import render_trtllm, render_vllm
from engines.sim.perf import kernel_profile
from engines.sim.power import idle_power_w
from engines.sim.protocol import (
    CHAT,
    COMPLETION,
    DONE_EVENT,
    ApiError,
    ChunkMaker,
    Fault,
    GenRequest,
    parse_fault,
    parse_request,
)
from engines.sim.runtime import Channel, SimRuntime
from engines.sim.scheduler import BatchingCore
from engines.sim.state import DuplicateRequestError, EngineCore

ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError",
               429: "RateLimitError", 500: "InternalServerError", 502: "BadGatewayError",
               503: "ServiceUnavailableError", 504: "GatewayTimeoutError"}
OWNED_BY = {"vllm": "vllm", "trtllm": "tensorrt_llm"}


@dataclass(slots=True)
class SimState:
    cfg: SimConfig
    deployment: Deployment
    runtime: SimRuntime
    rng: random.Random
    created: int


STATE = web.AppKey("sim_state", SimState)


def build_core(cfg: SimConfig, d: Deployment) -> EngineCore:
    profile = kernel_profile(cfg.dialect, d.precision.key)
    if cfg.fixed_ttft_ms is not None:
        return FixedTimingCore(d, profile, ttft_s=cfg.fixed_ttft_ms / 1000.0,
                               itl_s=(cfg.fixed_itl_ms or 0.0) / 1000.0)
    return BatchingCore(d, profile, max_batch=cfg.max_batch)


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _error(exc: ApiError) -> web.Response:
    error_type = exc.error_type
    if error_type == "BadRequestError" and exc.status != 400:
        error_type = ERROR_TYPES.get(exc.status, "Error")
    body = ApiError(exc.status, exc.message, error_type, exc.param).body()
    return web.Response(body=body, status=exc.status, content_type="application/json")


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def models(request: web.Request) -> web.Response:
    st = request.app[STATE]
    return _json({"object": "list", "data": [{
        "id": st.cfg.model_name, "object": "model", "created": st.created,
        "owned_by": OWNED_BY[st.cfg.dialect], "root": st.deployment.model.hf_name,
        "parent": None, "max_model_len": st.deployment.max_model_len, "permission": [],
    }]})


async def metrics(request: web.Request) -> web.Response:
    st = request.app[STATE]
    rt = st.runtime
    if st.cfg.dialect == "trtllm":
        body = render_trtllm(rt.take_iterations(), rt.start_unix_s, rt.time_scale, st.cfg.max_batch)
        return web.Response(body=body, content_type="application/json")
    rt.sync()
    running, waiting, kv = rt.core.load()
    body = render_vllm(rt.stats, st.cfg.model_name, running, waiting, kv)
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, COMPLETION)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, CHAT)


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    st = request.app[STATE]
    received_s = st.runtime.engine_now()  # the HTTP request reached the engine
    try:
        fault = parse_fault(request.headers.get("x-sim-fault"))
        if fault.stall_s:
            await asyncio.sleep(fault.stall_s)
        if fault.status is not None:
            raise ApiError(fault.status, f"injected fault: status {fault.status}",
                           ERROR_TYPES.get(fault.status, "Error"))
        gen = parse_request(await request.read(), kind, st.cfg.model_name,
                            st.deployment.max_model_len)
    except ApiError as exc:
        return _error(exc)
    prefix = "chatcmpl-" if kind == CHAT else "cmpl-"
    response_id = f"{prefix}{st.rng.getrandbits(128):032x}"
    request_id = request.headers.get("x-request-id") or response_id
    try:
        channel = st.runtime.submit(request_id, gen.prompt_tokens, gen.max_tokens)
        channel.received_s = received_s
    except DuplicateRequestError as exc:
        return _error(ApiError(409, str(exc), "ConflictError"))
    except ValueError as exc:  # the core refused the request (it cannot fit the KV cache)
        return _error(ApiError(400, str(exc)))
    maker = ChunkMaker(gen, response_id, int(time.time()))
    try:
        if gen.stream:
            return await _stream(request, channel, maker, gen, fault, st.cfg.tokens_per_event)
        return await _unary(request, channel, maker, fault)
    finally:
        if not channel.done:
            st.runtime.cancel(request_id)


async def _unary(request: web.Request, ch: Channel, maker: ChunkMaker,
                 fault: Fault) -> web.StreamResponse:
    while not ch.done:
        await ch.event.wait()
        ch.event.clear()
        if fault.abort_after is not None and ch.generated >= fault.abort_after:
            return _abort(request)
    return web.Response(body=maker.full_body(ch.generated), content_type="application/json")


async def _stream(request: web.Request, ch: Channel, maker: ChunkMaker, gen: GenRequest,
                  fault: Fault, per_event: int) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    if fault.abort_after == 0:
        return _abort(request, resp)
    sent_tokens = sent_events = held = 0
    while True:
        await ch.event.wait()
        ch.event.clear()
        held += ch.pending
        ch.pending = 0
        out: list[bytes] = []
        if gen.kind == CHAT and sent_tokens == 0 and held:
            out.append(maker.role_event())
        while held:
            # The first token goes out alone (TTFT); later events carry `per_event` tokens.
            size = 1 if sent_tokens == 0 else per_event
            if held < size and not ch.done:
                break
            k = min(size, held)
            held -= k
            sent_tokens += k
            out.append(maker.token_event(k, sent_tokens, ch.done and not held))
            sent_events += 1
            if fault.abort_after is not None and sent_events >= fault.abort_after:
                await resp.write(b"".join(out))
                return _abort(request, resp)
        if out:
            await resp.write(b"".join(out))
            if sent_tokens:
                ch.note_write(request.app[STATE].runtime.engine_now())
        if ch.done and not held:
            break
    tail = maker.usage_event(sent_tokens) + DONE_EVENT if gen.include_usage else DONE_EVENT
    await resp.write(tail)
    await resp.write_eof()
    return resp


def _abort(request: web.Request, resp: web.StreamResponse | None = None) -> web.StreamResponse:
    """Close the connection without finishing the response (an engine crash, seen by a client)."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    if resp is None:
        resp = web.Response(status=500)
    resp.force_close()
    return resp


async def sim_energy(request: web.Request) -> web.Response:
    st = request.app[STATE]
    rt = st.runtime
    rt.sync()
    now_s = rt.engine_now()
    total_j = rt.core.counter_j(now_s)
    gpus = st.deployment.tp
    return _json({
        "timestamp_s": time.time(),
        "engine_time_s": now_s,
        "gpus": [{"index": i, "energy_j": total_j / gpus} for i in range(gpus)],
        "idle_power_w": idle_power_w(st.deployment),
        "idle_power_w_per_gpu": st.deployment.gpu.idle_w,
        "time_scale": rt.time_scale,
    })


async def sim_request(request: web.Request) -> web.Response:
    st = request.app[STATE]
    truth = st.runtime.truth(request.match_info["request_id"])
    if truth is None:
        return _error(ApiError(404, "unknown request id", "NotFoundError"))
    return _json({**truth.to_json(), **st.runtime.wire_timing(truth)})


async def sim_requests(request: web.Request) -> web.Response:
    st = request.app[STATE]
    return _json({"requests": [t.to_json() for t in st.runtime.all_truth()]})


async def sim_stats(request: web.Request) -> web.Response:
    st = request.app[STATE]
    rt = st.runtime
    rt.sync()
    ledger = rt.ledger
    running, waiting, kv = rt.core.load()
    now_s = rt.engine_now()
    return _json({
        "engine_time_s": now_s,
        "engine_start_unix_s": rt.start_unix_s,
        "time_scale": rt.time_scale,
        "idle_energy_j": ledger.idle_j,
        "requests_energy_j": ledger.charged_j,
        "counter_committed_j": ledger.counter_j - ledger.start_j,
        "counter_j": rt.core.counter_j(now_s),
        "requests_served": rt.served,
        "requests_aborted": rt.aborted,
        "running": running,
        "waiting": waiting,
        "kv_cache_usage": kv,
        "gpu": st.deployment.gpu.key,
        "model": st.deployment.model.key,
        "precision": st.deployment.precision.key,
        "tp": st.deployment.tp,
        "dialect": st.cfg.dialect,
        "kv_cache_tokens": st.deployment.kv_tokens,
    })


def build_app(cfg: SimConfig) -> web.Application:
    """The aiohttp application of one simulated engine (the driver starts with the app)."""
    d = cfg.resolve()
    app = web.Application()

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        runtime = SimRuntime(build_core(cfg, d), cfg.time_scale)
        app[STATE] = SimState(cfg, d, runtime, random.Random(cfg.seed), int(time.time()))
        driver = asyncio.create_task(runtime.run(), name=f"sim-driver-{cfg.label}")
        yield
        driver.cancel()
        try:
            await driver
        except asyncio.CancelledError:
            pass

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/sim/energy", sim_energy)
    app.router.add_get("/sim/requests", sim_requests)
    app.router.add_get("/sim/requests/{request_id}", sim_request)
    app.router.add_get("/sim/stats", sim_stats)
    return app


@dataclass(slots=True)
class RunningEngine:
    cfg: SimConfig
    runner: web.AppRunner
    url: str


async def start_engine(cfg: SimConfig) -> RunningEngine:
    """Bind and serve one engine; raises SimConfigError before binding on a bad config."""
    app = build_app(cfg)
    # Cancel a handler when its client goes away, so the engine stops that request.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, backlog=1024)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    port = cfg.port
    sockets = [s for s in runner.addresses if isinstance(s, tuple)]
    if port == 0 and sockets:
        port = int(sockets[0][1])
    return RunningEngine(cfg, runner, f"http://{cfg.host}:{port}")


async def stop_engine(engine: RunningEngine) -> None:
    await engine.runner.cleanup()
