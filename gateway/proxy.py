"""The request path: authenticate, parse, route, relay, time, record.

One `Proxy` per process holds the shared upstream session and live endpoint state. Every request,
good or bad, ends in exactly one `RequestRecord` handed to the sinks (metrics, accounting).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from gateway.auth import Authenticator
from gateway.config import GatewayConfig, Tenant
from gateway.errors import (
    ModelNotFoundError,
    OverloadedError,
    RoutingError,
    ShuttingDownError,
    UpstreamError,
    UpstreamTimeoutError,
    WattgateError,
    engine_error,
    error_body,
)
from gateway.exchange import AiohttpExchange, Exchange
from gateway.front.protocol import FrontExchange
from gateway.metrics import GatewayMetrics
from gateway.records import RequestRecord
from gateway.requests import (
    ParsedRequest,
    check_content_type,
    parse_body,
    prefix_key,
    upstream_body,
)
from gateway.routing import RoutingContext, policy_for, select_precisions
from gateway.routing.learner import RoutingModels
from gateway.routing.slo_energy import next_full, request_size
from gateway.sse import SseScanner, usage_of_body
from gateway.tenancy.admission import Admission, Ticket, request_tokens
from gateway.timing import latency_of, slo_met
from gateway.tokenizer import PromptCounter
from gateway.upstream import (
    UpstreamClient,
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamFailure,
    UpstreamHeadTimeout,
    UpstreamProtocolError,
    UpstreamReadTimeout,
    UpstreamResponse,
)
from gateway.upstreams import EndpointState, Upstreams

log = logging.getLogger("wattgate.proxy")

Sink = Callable[[RequestRecord], None]
REQUEST_ID_HEADER = "x-wattgate-request-id"
EMBEDDINGS_PATH = "/v1/embeddings"
_X_PREFIXES = (b"x-", b"X-")


class Flight:
    """Mutable timeline and outcome of one request while it is served."""

    __slots__ = ("arrived_s", "arrived_wall_s", "attempts", "body", "completion_tokens",
                 "delivered", "dispatched_s", "endpoint", "engine_done_s", "engine_failed",
                 "first_byte_s",
                 "first_token_s", "http_status", "model", "prompt_source", "prompt_tokens",
                 "read_events", "read_times", "request_id", "slo_class", "status", "stream",
                 "tenant", "ticket", "upstream_status", "usage_known")

    def __init__(self, request_id: str, arrived_s: float, arrived_wall_s: float, slo_class: str):
        self.request_id = request_id
        self.arrived_s = arrived_s
        self.arrived_wall_s = arrived_wall_s
        self.tenant = "unauthenticated"
        self.model = "unknown"
        self.slo_class = slo_class
        self.stream = False
        self.endpoint: EndpointState | None = None
        self.dispatched_s: float | None = None
        self.first_byte_s: float | None = None
        self.first_token_s: float | None = None
        self.read_times: list[float] = []
        self.read_events: list[int] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.prompt_source = "engine"
        self.usage_known = False  # the engine's usage arrived
        self.body: dict[str, Any] | None = None  # the parsed request, to count its prompt
        self.upstream_status: int | None = None
        self.engine_done_s: float | None = None
        # The client got the whole answer ([DONE], or the final usage chunk it asked for, was
        # handed to its socket): whoever closes first after that, the request is `ok`.
        self.delivered = False
        self.engine_failed = False  # the engine broke the response (outlier detection counts it)
        self.attempts = 0
        self.status = "ok"
        self.http_status = 200
        self.ticket: Ticket | None = None  # what tenant controls hold for it

    def take_usage(self, usage: dict[str, Any]) -> None:
        self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        self.completion_tokens = int(usage.get("completion_tokens") or 0)
        self.usage_known = True

    def needs_prompt_count(self) -> bool:
        """The engine may have read the prompt but its usage never came (client disconnect,
        engine failure, timeout, or an engine that reports none): the gateway counts it."""
        return (not self.usage_known and self.body is not None and self.dispatched_s is not None
                and self.upstream_status in (None, 200))

    def token_read(self, now: float, tokens: int) -> None:
        """One engine read that carried `tokens` token-bearing events, at `now`."""
        if self.first_token_s is None:
            self.first_token_s = now
        self.read_times.append(now)
        self.read_events.append(tokens)

    def fail(self, exc: WattgateError) -> None:
        self.status = exc.code
        self.http_status = exc.status


class Proxy:
    def __init__(self, config: GatewayConfig, upstreams: Upstreams, client: UpstreamClient,
                 metrics: GatewayMetrics, sinks: Sequence[Sink], *, clock: Callable[[], float],
                 wall: Callable[[], float], counter: PromptCounter | None = None,
                 admission: Admission | None = None):
        self.config = config
        self.admission = admission or Admission(config, None, clock=clock)
        self.counter = counter or PromptCounter({})
        self._counting: set[asyncio.Task[None]] = set()  # records waiting for a prompt count
        self._retrying = 0  # retry attempts in flight (the retry budget)
        self.metrics = metrics
        self.upstreams = upstreams
        self.client = client
        self.sinks = [metrics.observe, *sinks]
        # the learnt per-endpoint models are one of the sinks (gateway/routing/learner.py)
        self.routing_models = next((k for k in sinks if isinstance(k, RoutingModels)), None)
        self.clock = clock
        self.wall = wall
        self.auth = Authenticator(config)
        self.policy = policy_for(config.routing.policy)
        self.draining = False
        # request ids: 64 random bits per process + a counter (24 hex digits, unique across
        # replicas without a random read per request)
        self._id_prefix = os.urandom(8).hex()
        self._served = 0
        self.inflight = 0
        self._open: dict[str, float] = {}  # request id -> wall-clock arrival, oldest first
        self.idle = asyncio.Event()
        self.idle.set()

    def open_since(self) -> float | None:
        """Wall-clock arrival of the oldest request being served (None: none)."""
        for arrived in self._open.values():
            return arrived
        return None

    # --- entry point --------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The aiohttp handler for the completion routes (connections the front handed over)."""
        listen = self.config.listen
        length = request.content_length
        deadline_s = listen.body_timeout_s + (length or 0) / listen.body_min_bytes_per_s
        exchange = AiohttpExchange(request, deadline_s)
        await self.serve(exchange)
        assert exchange.response is not None
        return exchange.response

    async def serve(self, exchange: Exchange) -> None:
        """Serve one completion request; always ends in exactly one record to the sinks."""
        self._served += 1
        flight = Flight(f"{self._id_prefix}{self._served & 0xFFFFFFFF:08x}", self.clock(),
                        self.wall(),
                        self.config.default_slo_class)
        self.inflight += 1
        self._open[flight.request_id] = flight.arrived_wall_s
        self.idle.clear()
        try:
            await self._serve(exchange, flight)
        except WattgateError as exc:
            flight.fail(exc)
            if exc.status >= 500:  # the gateway's or an engine's failure: one line, its id
                log.warning("request %s: %d %s on %s", flight.request_id, exc.status, exc.code,
                            flight.endpoint.endpoint.name if flight.endpoint else "no engine")
            exchange.reply(exc.status, exc.body(), "application/json",
                           {REQUEST_ID_HEADER: flight.request_id, **exc.headers()})
        except asyncio.CancelledError:
            if not flight.delivered:
                flight.status, flight.http_status = "client_disconnected", 499
            raise
        except Exception:  # last line of defence: log the trace, show the client none of it
            log.exception("request %s failed", flight.request_id)
            flight.status, flight.http_status = "internal_error", 500
            exchange.reply(500, error_body("internal gateway error", "server_error",
                                           "internal_error"), "application/json",
                           {REQUEST_ID_HEADER: flight.request_id})
        finally:
            if flight.needs_prompt_count():
                # counted off the loop, then recorded; the request stays in flight till then
                task = asyncio.get_running_loop().create_task(self._count_then_finish(flight))
                self._counting.add(task)
                task.add_done_callback(self._counting.discard)
            else:
                self._done(flight)

    def _done(self, flight: Flight) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self.idle.set()
        del self._open[flight.request_id]  # and its record goes to the sinks right away
        self._finish(flight)

    async def _count_then_finish(self, flight: Flight) -> None:
        finished = self.clock()  # the request ended now, not when its prompt was counted
        try:
            assert flight.body is not None
            if self.counter.has_tokenizer(flight.model):
                tokens, source = await asyncio.to_thread(self.counter.count, flight.model,
                                                         flight.body)
            else:  # the byte estimate: cheap enough for the loop
                tokens, source = self.counter.count(flight.model, flight.body)
            flight.prompt_tokens, flight.prompt_source = tokens, source
        except Exception:  # a tokenizer failure must not lose the record: it keeps 0 tokens
            log.warning("request %s: counting its prompt failed", flight.request_id,
                        exc_info=True)
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self.idle.set()
            del self._open[flight.request_id]
            self._finish(flight, finished)

    async def _serve(self, exchange: Exchange, flight: Flight) -> None:
        if self.draining:
            raise ShuttingDownError("the gateway is shutting down; retry on another replica")
        if self.inflight > self.config.listen.max_inflight:
            raise OverloadedError("the gateway is serving as many requests as it takes at once "
                                  "(listen.max_inflight); retry shortly")
        tenant = self.auth.tenant(exchange.header("authorization"))
        flight.tenant, flight.slo_class = tenant.name, tenant.slo_class
        check_content_type(exchange.header("content-type") or "")
        raw = await exchange.read_body(self.config.max_body_bytes)
        parsed = parse_body(raw, exchange.header("x-wattgate-precision"))
        flight.stream = parsed.stream
        flight.body = parsed.body
        if self.config.model(parsed.model) is None:
            raise ModelNotFoundError(f"the model {parsed.model!r} does not exist",
                                     param="model")
        flight.model = parsed.model
        parsed = await self._admit(flight, tenant, parsed)
        await self._dispatch(exchange, flight, tenant, parsed, raw)

    async def _admit(self, flight: Flight, tenant: Tenant, parsed: ParsedRequest
                     ) -> ParsedRequest:
        """Tenant controls (gateway/tenancy): 429 past a limit; a budget downgrade forces
        a cheaper precision."""
        if not self.admission.controlled(tenant):
            return parsed
        prompt, max_tokens = request_tokens(parsed.body)
        available = {s.endpoint.precision for s in self.upstreams.healthy(parsed.model)}
        flight.ticket = await self.admission.admit(tenant, flight.request_id, prompt,
                                                   max_tokens, parsed.precision, available)
        if flight.ticket.precision is not None:
            return dataclasses.replace(parsed, precision=flight.ticket.precision)
        return parsed

    # --- routing and retries ------------------------------------------------------------

    def _choose(self, tenant: Tenant, parsed: ParsedRequest, tried: Sequence[str],
                path: str = "") -> EndpointState:
        healthy = self.upstreams.healthy(parsed.model, exclude=tried)
        if path == EMBEDDINGS_PATH:  # only engine kinds that serve embeddings
            healthy = [s for s in healthy if s.adapter.serves_embeddings]
        precisions = select_precisions(tenant.precision, parsed.precision,
                                       {s.endpoint.precision for s in healthy})
        states = [s for s in healthy if s.endpoint.precision in precisions]
        if not states:
            wanted = f" at precision {parsed.precision}" if parsed.precision else ""
            raise RoutingError(f"no healthy endpoint can serve model {parsed.model!r}{wanted}")
        routing = self.config.routing
        floor = dict(routing.min_quality).get(tenant.slo_class)
        if floor is not None and parsed.precision is None:
            quality = dict(routing.quality)
            states = [s for s in states if quality.get(s.endpoint.precision, 1.0) >= floor]
            if not states:
                raise RoutingError(f"no healthy endpoint of model {parsed.model!r} meets the "
                                   f"quality floor {floor:g} of SLO class {tenant.slo_class!r}")
        candidates = [s.candidate() for s in states]
        # The learnt models see the loads routing saw, to pair each record with the load it
        # was dispatched at.
        models = self.routing_models
        if models is not None:
            models.observe_loads(self.clock(), candidates)
        if len(states) == 1:
            return states[0]
        key = (prefix_key(parsed.body, routing.prefix_chars)
               if routing.policy == "prefix_affinity" else b"")
        ctx = RoutingContext(self.upstreams.next_sequence(parsed.model), key, routing.load_bound)
        if routing.policy == "slo_energy" and models is not None:
            slo = self.config.slo(tenant.slo_class)
            prompt, output = request_size(parsed.body, routing.default_output_tokens)
            ctx = dataclasses.replace(ctx, ttft_slo_s=slo.ttft_s, tpot_slo_s=slo.tpot_s,
                                      slo_margin=routing.slo_margin, prompt_tokens=prompt,
                                      output_tokens=output, curves=models.curves())
            pool = (parsed.model, tenant.slo_class)
            full = next_full(models.full.get(pool, frozenset()), candidates, ctx,
                             routing.hysteresis)
            models.full[pool] = full
            ctx = dataclasses.replace(ctx, full=full)
        return states[self.policy(candidates, ctx)]

    async def _dispatch(self, exchange: Exchange, flight: Flight, tenant: Tenant,
                        parsed: ParsedRequest, raw: bytes) -> None:
        retries = self.config.retries
        deadline = flight.arrived_s + retries.deadline_s
        tried: list[str] = []
        last_error: WattgateError | None = None
        while flight.attempts < retries.max_attempts and (not tried or self.clock() < deadline):
            try:
                state = self._choose(tenant, parsed, tried, exchange.path)
            except RoutingError:
                if last_error is not None:
                    raise last_error from None
                raise
            retry = bool(tried)
            if retry:
                if not self._retry_allowed():
                    assert last_error is not None
                    self.metrics.retries_refused.labels(parsed.model).inc()
                    raise last_error
                self.metrics.retries.labels(parsed.model).inc()
                self._retrying += 1
            tried.append(state.endpoint.name)
            flight.attempts += 1
            flight.endpoint = state
            try:
                return await self._attempt(exchange, flight, state, parsed, raw)
            except _RetryableError as exc:
                last_error = exc.error
            finally:
                if retry:
                    self._retrying -= 1
        assert last_error is not None
        raise last_error

    def _retry_allowed(self) -> bool:
        """Envoy's retry budget: retries in flight within budget_percent of the requests in
        flight, min_retry_concurrency always allowed."""
        retries = self.config.retries
        return self._retrying < max(retries.min_retry_concurrency,
                                    retries.budget_percent / 100.0 * self.inflight)

    def upstream_error(self, engine: str, reason: str) -> None:
        self.metrics.upstream_errors.labels(engine, reason).inc()

    async def _attempt(self, exchange: Exchange, flight: Flight, state: EndpointState,
                       parsed: ParsedRequest, raw: bytes) -> None:
        ep = state.endpoint
        headers = [("Content-Type", "application/json"), ("x-request-id", flight.request_id)]
        headers += forwarded_headers(exchange.raw_headers)
        body = upstream_body(parsed, raw, ep.upstream_model)
        state.inflight += 1
        flight.dispatched_s = self.clock()
        timeouts = self.config.timeouts
        try:
            # One deadline for the whole attempt. Connect, first-byte and per-read stalls are
            # the client's own lazy timer, so no timer is rescheduled per read.
            async with asyncio.timeout(timeouts.total_s - (flight.dispatched_s - flight.arrived_s)):
                try:
                    upstream = await self.client.post(ep.url, exchange.path, body, headers)
                except (UpstreamConnectError, UpstreamClosedError) as exc:
                    reason = local_resource_error(exc)
                    if reason is not None:  # the gateway's own limit, not the engine's fault
                        self.metrics.local_errors.labels(reason).inc()
                        raise OverloadedError("the gateway is out of a local resource "
                                              f"({reason}); retry shortly") from None
                    self.upstream_error(ep.name, "connect")
                    self.upstreams.failed(state)
                    raise _RetryableError(UpstreamError(
                        f"engine {ep.name} is unreachable")) from exc
                except UpstreamHeadTimeout:
                    self.upstream_error(ep.name, "timeout")
                    self.upstreams.failed(state)
                    raise UpstreamTimeoutError(
                        f"engine {ep.name} did not answer within "
                        f"{timeouts.first_byte_s:g} s") from None
                except UpstreamProtocolError:
                    self.upstream_error(ep.name, "protocol")
                    self.upstreams.failed(state)
                    raise UpstreamError(f"engine {ep.name} sent an invalid HTTP response",
                                        code="upstream_protocol_error") from None
                try:
                    flight.first_byte_s = self.clock()
                    flight.upstream_status = upstream.status
                    if upstream.status >= 500:
                        error_bytes = b""
                        with contextlib.suppress(UpstreamFailure):
                            error_bytes = await upstream.read_all()
                        self.upstream_error(ep.name, f"http_{upstream.status}")
                        self.upstreams.failed(state)
                        raise _RetryableError(engine_error(upstream.status, error_bytes,
                                                           upstream.head.headers))
                    if parsed.stream and upstream.status == 200:
                        await self._relay_stream(exchange, flight, upstream, parsed)
                    else:
                        await self._relay_body(exchange, flight, upstream)
                    if flight.engine_failed:
                        self.upstreams.failed(state)
                    else:
                        self.upstreams.succeeded(state)
                finally:
                    # back to the pool only if the whole response was read; else dropped, so
                    # the engine sees the request aborted
                    upstream.close()
        except TimeoutError:
            self.upstream_error(ep.name, "timeout")
            self.upstreams.failed(state)
            raise UpstreamTimeoutError("the engine did not finish within the request deadline"
                                       ) from None
        finally:
            state.inflight -= 1

    # --- relays -------------------------------------------------------------------------

    def _response_headers(self, flight: Flight) -> dict[str, str]:
        ep = flight.endpoint
        headers = {REQUEST_ID_HEADER: flight.request_id}
        if flight.ticket is not None:
            headers.update(flight.ticket.headers)
        if ep is not None:
            headers["x-wattgate-endpoint"] = ep.endpoint.name
            headers["x-wattgate-precision"] = ep.endpoint.precision
        return headers

    async def _relay_body(self, exchange: Exchange, flight: Flight, upstream: UpstreamResponse
                          ) -> None:
        engine = flight.endpoint.endpoint.name if flight.endpoint else ""
        try:
            body = await upstream.read_all()
        except UpstreamReadTimeout:
            self.upstream_error(engine, "timeout")
            flight.engine_failed = True
            raise UpstreamTimeoutError("the engine stalled longer than the read timeout"
                                       ) from None
        except UpstreamFailure as exc:
            self.upstream_error(engine, "body")
            flight.engine_failed = True
            raise UpstreamError("the engine closed the connection before the response ended"
                                ) from exc
        # A non-streamed answer's head leaves the engine once its body is ready: that, not
        # the gateway's read of the body (late on a busy gateway), is when the engine finished.
        flight.engine_done_s = flight.first_byte_s
        if upstream.status >= 400:  # the engine's error, in the gateway's one shape
            error = engine_error(upstream.status, body, upstream.head.headers)
            flight.status, flight.http_status = f"upstream_http_{upstream.status}", upstream.status
            exchange.reply(upstream.status, error.body(), "application/json",
                           {**self._response_headers(flight), **error.headers()})
            return
        usage = usage_of_body(body) if upstream.status == 200 else None
        if usage:
            flight.take_usage(usage)
        exchange.reply(upstream.status, body, upstream.content_type or "application/json",
                       self._response_headers(flight))

    async def _relay_stream(self, exchange: Exchange, flight: Flight,
                            upstream: UpstreamResponse, parsed: ParsedRequest) -> None:
        await exchange.start_stream(self._response_headers(flight))
        scanner = SseScanner(strip_usage=not parsed.client_wants_usage)
        error: WattgateError | None = None
        last: bytes | None = b""  # the final piece, sent with the end of the stream in one write
        try:
            if isinstance(exchange, FrontExchange):
                last = await self._pipe(exchange, flight, upstream, scanner)
            else:
                last = await self._pump(exchange, flight, upstream, scanner)
            if last is None:  # the client went away; the engine request was aborted
                return
        except UpstreamReadTimeout:
            flight.engine_failed = True
            error = UpstreamTimeoutError("the engine stream stalled longer than the read timeout",
                                         code="upstream_timeout")
        except UpstreamFailure as exc:
            flight.engine_failed = True
            log.warning("request %s: engine stream broke: %s", flight.request_id,
                        type(exc).__name__)
            error = UpstreamError("the engine stream ended before the response was complete",
                                  code="upstream_stream_error")
        except asyncio.CancelledError:
            upstream.abort()  # the client went away (handler cancelled): abort the engine request
            raise
        finally:
            _stream_tokens(flight, scanner)  # however the stream ended
        if error is not None:
            self.upstream_error(flight.endpoint.endpoint.name if flight.endpoint else "",
                                "stream")
            flight.fail(error)
            last = b"data: " + error_body(error.message, error.error_type, error.code) + b"\n\n"
        else:
            last = (last or b"") + scanner.pending()
            if scanner.error:
                flight.status, flight.http_status = "upstream_error_event", 200
        await exchange.end_stream(last)

    async def _pump(self, exchange: Exchange, flight: Flight, upstream: UpstreamResponse,
                    scanner: SseScanner) -> bytes | None:
        """Relay with one awaited read and write per engine read (any server). Returns the
        final piece (to go out with the end of the stream), None if the client went away."""
        clock = self.clock
        while data := await upstream.read():
            now = clock()
            out, tokens = scanner.feed(data)
            if tokens:
                flight.token_read(now, tokens)
            if out and upstream.at_end():
                return out
            if out:
                if not await exchange.write(out):
                    if not flight.delivered:
                        flight.status, flight.http_status = "client_disconnected", 499
                    upstream.abort()  # drops the connection: the engine aborts the request
                    return None
                if scanner.complete:
                    flight.delivered = True
        return b""

    async def _pipe(self, exchange: FrontExchange, flight: Flight, upstream: UpstreamResponse,
                    scanner: SseScanner) -> bytes | None:
        """Relay from the engine connection's own callback straight to the client's socket:
        no task wake-up per engine read. Same results as `_pump`."""
        clock = self.clock
        last = b""
        gone = False

        def on_body(data: bytes, at_end: bool) -> None:
            nonlocal last, gone
            now = clock()
            out, tokens = scanner.feed(data)
            if tokens:
                flight.token_read(now, tokens)
            if at_end:
                last = out
            elif out:
                if not exchange.write_now(out):
                    gone = True
                    upstream.abort()  # drops the connection: the engine aborts the request
                    return
                if scanner.complete:
                    flight.delivered = True
                if exchange.write_paused:  # the client reads slower than the engine writes
                    upstream.pause()
                    exchange.when_drained(upstream.resume)

        upstream.stream_to(on_body)
        try:
            await upstream.finished()
        except UpstreamFailure:
            if not gone:
                raise
        if gone:
            if not flight.delivered:
                flight.status, flight.http_status = "client_disconnected", 499
            return None
        return last

    # --- recording ----------------------------------------------------------------------

    def _finish(self, flight: Flight, finished: float | None = None) -> None:
        if finished is None:
            finished = self.clock()
        ep = flight.endpoint
        ok = flight.status == "ok"
        times, events = tuple(flight.read_times), tuple(flight.read_events)
        lat = latency_of(flight.arrived_s, times, events, flight.completion_tokens,
                         finished if flight.first_byte_s is not None else None)
        slo = self.config.slo(flight.slo_class)
        record = RequestRecord(
            request_id=flight.request_id, tenant=flight.tenant, model=flight.model,
            engine=ep.endpoint.name if ep else "", precision=ep.endpoint.precision if ep else "",
            slo_class=flight.slo_class, status=flight.status, http_status=flight.http_status,
            stream=flight.stream, arrived_wall_s=flight.arrived_wall_s,
            arrived_s=flight.arrived_s, dispatched_s=flight.dispatched_s,
            first_byte_s=flight.first_byte_s, first_token_s=flight.first_token_s,
            finished_s=finished, read_times=times, read_events=events,
            prompt_tokens=flight.prompt_tokens,
            completion_tokens=flight.completion_tokens, attempts=flight.attempts, latency=lat,
            slo_met=slo_met(slo, lat, ok), prompt_source=flight.prompt_source,
            engine_done_s=flight.engine_done_s,
        )
        if flight.ticket is not None:
            self.admission.release(flight.ticket, record)
        for sink in self.sinks:
            try:
                sink(record)
            except Exception:  # a broken sink must not lose the record for the others
                log.exception("record sink failed for request %s", flight.request_id)


def _stream_tokens(flight: Flight, scanner: SseScanner) -> None:
    """The stream's tokens, however it ended: the engine's usage when it came; otherwise the
    token events relayed (less the chat role chunk, which carries none)."""
    if scanner.usage:
        flight.take_usage(scanner.usage)
    elif flight.read_events:
        flight.completion_tokens = max(0, sum(flight.read_events) - scanner.role_events)


class _RetryableError(Exception):
    """An attempt failed before any byte reached the client; another endpoint may try."""

    def __init__(self, error: WattgateError):
        super().__init__(error.message)
        self.error = error


_LOCAL_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EADDRNOTAVAIL}


def local_resource_error(exc: BaseException) -> str | None:
    """The errno name when a connect failed for lack of the gateway's own resources (file
    descriptors, memory, buffers, local ports), None when the engine's side failed."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _LOCAL_ERRNOS:
            return errno.errorcode[seen.errno]
        seen = seen.__cause__ or seen.__context__
    return None


def forwarded_headers(raw_headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The client's `x-*` headers that go on to the engine (not `x-wattgate-*`, which are for
    the gateway, nor `x-request-id`, which the gateway sets). Most requests carry none, so the
    loop is one prefix test per header."""
    out = []
    for name, value in raw_headers:
        if name.startswith(_X_PREFIXES):
            lname = name.lower()
            if not lname.startswith(b"x-wattgate-") and lname != b"x-request-id":
                out.append((name.decode("utf-8", "surrogateescape"),
                            value.decode("utf-8", "surrogateescape")))
    return out
