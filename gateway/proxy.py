"""The request path, as the steps of gateway/pipeline run in order: admit -> route ->
dispatch (relay) -> record.

One `Proxy` per process holds the steps and what it knows of the requests in flight (for
draining and the accounting watermark). Every request, good or bad, ends in exactly one
`RequestRecord` handed to the sinks (metrics, accounting).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Sequence

from aiohttp import web

from core.errors import OverloadedError, ShuttingDownError, WattgateError, error_body
from core.tokenizer import PromptCounter
from core.trace_context import TRACEPARENT, TraceStarter
from gateway.config import GatewayConfig
from gateway.front.aiohttp_exchange import AiohttpExchange
from gateway.pipeline.admit import Admit
from gateway.pipeline.dispatch import Dispatch
from gateway.pipeline.flight import REQUEST_ID_HEADER, Flight
from gateway.pipeline.record import RecordPublisher, Sink
from gateway.pipeline.route import Router
from gateway.routing.learner import RoutingModels
from gateway.serving_metrics import GatewayMetrics
from gateway.tenancy.admission import Admission
from gateway.upstreams import Upstreams
from wire.client import UpstreamClient
from wire.exchange import ServerExchange as Exchange

log = logging.getLogger("wattgate.proxy")

__all__ = ["Proxy", "Sink"]


class Proxy:
    """Runs each request through admit -> route -> dispatch (relay) -> record, and keeps
    what the process needs to know of the requests in flight (draining, readiness)."""

    def __init__(self, config: GatewayConfig, upstreams: Upstreams, client: UpstreamClient,
                 metrics: GatewayMetrics, sinks: Sequence[Sink], *, clock: Callable[[], float],
                 wall: Callable[[], float], counter: PromptCounter | None = None,
                 admission: Admission | None = None, tracing: TraceStarter | None = None,
                 after_records: Callable[[Callable[[], None]], None] | None = None):
        """`tracing`: starts each request's trace context (telemetry on), else None;
        `after_records(callback)`: calls back once the records published so far are out of
        this process (a node worker's link to its accounting child), the answer's last write
        held until then; None: at once."""
        self.config = config
        self.after_records = after_records
        self.tracing = tracing
        self.clock = clock
        self.wall = wall
        admission = admission or Admission(config, None, clock=clock)
        # the learnt per-endpoint models are one of the sinks (gateway/routing/learner.py)
        models = next((k for k in sinks if isinstance(k, RoutingModels)), None)
        router = Router(config, upstreams, models, clock)
        counter = counter or PromptCounter({})
        self.admit = Admit(config, admission, upstreams, prefix_chars=router.prefix_chars,
                           estimate=router.slo_energy, counter=counter)
        self.auth = self.admit.auth
        self.dispatch = Dispatch(config, upstreams, client, metrics, router, clock=clock,
                                 inflight=lambda: self.inflight)
        self.publisher = RecordPublisher(config, admission, counter,
                                         [metrics.observe, *sinks], clock, client)
        self._counting: set[asyncio.Task[None]] = set()  # records waiting for a prompt count
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
        exchange = AiohttpExchange(request, deadline_s, self.after_records is not None)
        await self.serve(exchange)
        await self.answers_sent()  # aiohttp writes the answer after this
        await exchange.finish()
        assert exchange.response is not None
        return exchange.response

    async def answers_sent(self) -> None:
        """Wait until the records published so far are out of this process, and with them
        the answers' last writes held for them (at once where none is held)."""
        if self.after_records is not None:
            sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.after_records(functools.partial(_settle, sent))
            await sent

    async def serve(self, exchange: Exchange) -> None:
        """Serve one completion request; always ends in exactly one record to the sinks."""
        self._served += 1
        flight = Flight(f"{self._id_prefix}{self._served & 0xFFFFFFFF:08x}", self.clock(),
                        self.wall(), self.config.default_slo_class)
        if self.tracing is not None:
            flight.trace = self.tracing.begin(exchange.path, exchange.header(TRACEPARENT))
        self.inflight += 1
        self._open[flight.request_id] = flight.arrived_wall_s
        if self.inflight == 1:  # idle is set exactly while none is in flight
            self.idle.clear()
        try:
            await self._serve(exchange, flight)
        except WattgateError as exc:
            flight.fail(exc)
            if exc.status >= 500:  # the gateway's or an engine's failure: one line, its id
                log.warning("request %s: %d %s on %s", flight.request_id, exc.status, exc.code,
                            flight.endpoint.endpoint.name if flight.endpoint else "no engine")
            # an engine's own error answer names the engine, as its other answers do
            headers = (flight.response_headers() if exc.from_engine
                       else {REQUEST_ID_HEADER: flight.request_id})
            exchange.reply(exc.status, exc.body(), "application/json",
                           {**headers, **exc.headers()})
        except asyncio.CancelledError:
            flight.client_gone()
            raise
        except Exception:  # last line of defence: log the trace, show the client none of it
            log.exception("request %s failed", flight.request_id)
            flight.end("internal_error")
            exchange.reply(flight.http_status, error_body("internal gateway error",
                                                          "server_error", flight.status),
                           "application/json", {REQUEST_ID_HEADER: flight.request_id})
        finally:
            if flight.needs_prompt_count():
                # counted off the loop, then recorded; the request stays in flight till then
                task = asyncio.get_running_loop().create_task(self._count_then_finish(flight))
                self._counting.add(task)
                task.add_done_callback(self._counting.discard)
            else:
                self._done(flight)

    async def _serve(self, exchange: Exchange, flight: Flight) -> None:
        if self.draining:
            raise ShuttingDownError("the gateway is shutting down; retry on another replica")
        if self.inflight > self.config.listen.max_inflight:
            raise OverloadedError("the gateway is serving as many requests as it takes at once "
                                  "(listen.max_inflight); retry shortly")
        req = await self.admit.admit(exchange, flight)
        if flight.trace is not None:
            flight.trace.admitted_s = self.clock()
        assert flight.tenant_config is not None  # admit knows the tenant
        await self.dispatch.send(exchange, flight, req, flight.tenant_config)

    def _done(self, flight: Flight, finished: float | None = None) -> None:
        """Out of flight, and its record to the sinks right away."""
        self.inflight -= 1
        if self.inflight == 0:
            self.idle.set()
        del self._open[flight.request_id]
        self.publisher.publish(flight, finished)

    async def _count_then_finish(self, flight: Flight) -> None:
        finished = self.clock()  # the request ended now, not when its prompt was counted
        try:
            await self.publisher.count_prompt(flight)
        finally:
            self._done(flight, finished)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
