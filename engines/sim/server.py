"""The simulated engine's HTTP server: the OpenAI API of a dialect plus /sim/* ground truth.

Handlers are thin: validation and response shapes live in protocol.py, metrics rendering
in engine_metrics.py, the /sim/* routes in truth_api.py, the engine in a pure core driven by
runtime.py.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import orjson
from aiohttp import web

from engines.sim.catalog import Deployment
from engines.sim.config import SimConfig
from engines.sim.detok import TokenTexts, empty_share
from engines.sim.embeddings import embedding_body, parse_embedding_request
from engines.sim.engine_metrics import render_trtllm, render_vllm
from engines.sim.fixed import FixedTimingCore
from engines.sim.perf import kernel_profile
from engines.sim.protocol import (
    CHAT,
    COMPLETION,
    DONE_EVENT,
    ApiError,
    ChunkMaker,
    Fault,
    parse_fault,
    parse_request,
    tokenize_count,
)
from engines.sim.runtime import Channel, SimRuntime
from engines.sim.scheduler import BatchingCore
from engines.sim.state import DuplicateRequestError, EngineCore
from engines.sim.truth_api import STATE, SimState, add_truth_routes

ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError",
               429: "RateLimitError", 500: "InternalServerError", 502: "BadGatewayError",
               503: "ServiceUnavailableError", 504: "GatewayTimeoutError"}
OWNED_BY = {"vllm": "vllm", "trtllm": "tensorrt_llm"}




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


async def tokenize(request: web.Request) -> web.Response:
    """vLLM's `POST /tokenize`: the prompt's count as its usage would say (token ids are
    not simulated: zeros)."""
    st = request.app[STATE]
    try:
        count = tokenize_count(await request.read(), st.cfg.model_name)
    except ApiError as exc:
        return _error(exc)
    return _json({"count": count, "max_model_len": st.deployment.max_model_len,
                  "tokens": [0] * count, "token_strs": None})


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, COMPLETION)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, CHAT)


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    st = request.app[STATE]
    received_s = st.runtime.engine_now()  # the HTTP request reached the engine
    try:
        fault = await _apply_fault(request)
        gen = parse_request(await request.read(), kind, st.cfg.model_name,
                            st.deployment.max_model_len)
    except ApiError as exc:
        return _error(exc)
    prefix = "chatcmpl-" if kind == CHAT else "cmpl-"
    response_id = f"{prefix}{st.rng.getrandbits(128):032x}"
    share = empty_share(st.cfg.empty_text_share, st.cfg.empty_text_share_non_ascii,
                        gen.non_ascii)
    texts = TokenTexts(st.rng.getrandbits(64), share)
    request_id = request.headers.get("x-request-id") or response_id
    submitted = _submit(st, request_id, gen.prompt_tokens, gen.max_tokens)
    if isinstance(submitted, web.Response):
        return submitted
    channel = submitted
    channel.received_s = received_s
    maker = ChunkMaker(gen, response_id, int(time.time()))
    try:
        if gen.stream:
            return await _stream(request, channel, maker, texts, fault, st.cfg.tokens_per_event)
        return await _unary(request, channel, fault, lambda n: maker.full_body(n, texts.take(n)))
    finally:
        if not channel.done:
            st.runtime.cancel(request_id)


async def embeddings(request: web.Request) -> web.StreamResponse:
    """Prompt work only: one engine request of all inputs' tokens, no token generated."""
    st = request.app[STATE]
    received_s = st.runtime.engine_now()
    try:
        fault = await _apply_fault(request)
        emb = parse_embedding_request(await request.read(), st.cfg.model_name,
                                      st.deployment.max_model_len, st.deployment.model.hidden)
    except ApiError as exc:
        return _error(exc)
    response_id = f"embd-{st.rng.getrandbits(128):032x}"
    request_id = request.headers.get("x-request-id") or response_id
    submitted = _submit(st, request_id, emb.total_tokens, 0)
    if isinstance(submitted, web.Response):
        return submitted
    submitted.received_s = received_s
    created = int(time.time())
    try:
        return await _unary(request, submitted, fault,
                            lambda _: embedding_body(emb, response_id, created))
    finally:
        if not submitted.done:
            st.runtime.cancel(request_id)


async def _apply_fault(request: web.Request) -> Fault:
    """The request's injected fault; waits out a stall; raises ApiError for a status fault."""
    fault = parse_fault(request.headers.get("x-sim-fault"))
    if fault.stall_s:
        await asyncio.sleep(fault.stall_s)
    if fault.status is not None:
        raise ApiError(fault.status, f"injected fault: status {fault.status}",
                       ERROR_TYPES.get(fault.status, "Error"))
    return fault


def _submit(st: SimState, request_id: str, prompt_tokens: int,
            max_tokens: int) -> Channel | web.Response:
    """The request's channel, or the error answer when the engine refuses it."""
    try:
        return st.runtime.submit(request_id, prompt_tokens, max_tokens)
    except DuplicateRequestError as exc:
        return _error(ApiError(409, str(exc), "ConflictError"))
    except ValueError as exc:  # the core refused the request (it cannot fit the KV cache)
        return _error(ApiError(400, str(exc)))


async def _unary(request: web.Request, ch: Channel, fault: Fault,
                 body: Callable[[int], bytes]) -> web.StreamResponse:
    """Wait for the request to finish; answer `body(completion_tokens)` as JSON."""
    while not ch.done:
        await ch.event.wait()
        ch.event.clear()
        if fault.abort_after is not None and ch.generated >= fault.abort_after:
            return _abort(request)
    return web.Response(body=body(ch.generated), content_type="application/json")


async def _stream(request: web.Request, ch: Channel, maker: ChunkMaker, texts: TokenTexts,
                  fault: Fault, per_event: int) -> web.StreamResponse:
    """vLLM's stream: headers at once, then each SSE event in an HTTP chunk (one transport
    write) of its own, as uvicorn writes each item of vLLM's generator; the usage chunk and
    `[DONE]` after a loop turn each, so a client may read either alone and close."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    if fault.abort_after == 0:
        return _abort(request, resp)
    runtime = request.app[STATE].runtime
    sent_tokens = sent_events = held = 0
    while True:
        await ch.event.wait()
        ch.event.clear()
        held += ch.pending
        ch.pending = 0
        if maker.req.kind == CHAT and sent_tokens == 0 and held:
            await resp.write(maker.role_event())  # vLLM sends it with the first output
        while held:
            # The first token goes out alone (TTFT); later events carry `per_event` tokens.
            size = 1 if sent_tokens == 0 else per_event
            if held < size and not ch.done:
                break
            k = min(size, held)
            held -= k
            sent_tokens += k
            await resp.write(maker.token_event(texts.take(k), sent_tokens, ch.done and not held))
            ch.note_write(runtime.engine_now())
            sent_events += 1
            if fault.abort_after is not None and sent_events >= fault.abort_after:
                return _abort(request, resp)
        if ch.done and not held:
            break
    return await _finish_stream(resp, maker, sent_tokens,
                                request.app[STATE].cfg.done_gap_ms / 1000.0)


async def _finish_stream(resp: web.StreamResponse, maker: ChunkMaker,
                         completion_tokens: int, done_gap_s: float) -> web.StreamResponse:
    try:
        if maker.req.include_usage:
            await asyncio.sleep(0)
            await resp.write(maker.usage_event(completion_tokens))
        await asyncio.sleep(0)
        await resp.write(DONE_EVENT)
        # A busy vLLM API server ends the response a moment after [DONE] (its engine and API
        # server share the cores): clients that hang up at [DONE] do it in that moment.
        await asyncio.sleep(done_gap_s)
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the client read what it needed ([DONE], or the usage chunk) and closed
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
    if cfg.dialect == "vllm":  # trtllm-serve has neither embeddings nor /tokenize
        app.router.add_post("/v1/embeddings", embeddings)
        app.router.add_post("/tokenize", tokenize)
    add_truth_routes(app)
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
