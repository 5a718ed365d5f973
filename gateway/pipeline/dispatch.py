"""The dispatch step: attempts on the routed endpoints, retries, and the relay of the answer.

Connect errors, 5xx and an engine's 429 before the first byte, and a non-streamed answer
the engine broke (cut short, or not JSON), go to another endpoint, within the attempt limit,
the retry deadline and Envoy's retry budget; a 429 also backs its engine off for its
Retry-After. Every attempt tells the endpoint's outlier detection and success weighting how
it went, whether it failed before the response head or after it; the engine's failures are
counted by reason.

The client's `x-*` headers go on to the engine only when each is visible ASCII, at most
MAX_FORWARDED_HEADERS of them and MAX_FORWARDED_BYTES in all: an engine's error may echo them
back, and a client must not fill the engine's head.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import Callable, Sequence

from core.errors import (
    ClientTooSlowError,
    OverloadedError,
    RequestError,
    RoutingError,
    UpstreamError,
    UpstreamHttpError,
    UpstreamTimeoutError,
    WattgateError,
    engine_error,
)
from core.outcomes import OUTCOMES
from gateway.config import GatewayConfig, Tenant
from gateway.pipeline.deadline import Deadlines
from gateway.pipeline.flight import Flight
from gateway.pipeline.route import Router
from gateway.relay import Relay
from gateway.requests import PreparedRequest
from gateway.serving_metrics import GatewayMetrics
from gateway.upstreams import EndpointState, Upstreams
from wire.client import UpstreamClient
from wire.errors import (
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamFailure,
    UpstreamHeadTimeout,
    UpstreamProtocolError,
)
from wire.exchange import ServerExchange, UpstreamBody

_X_PREFIXES = (b"x-", b"X-")
MAX_FORWARDED_HEADERS = 16  # client x-* headers passed to the engine; more are dropped
MAX_FORWARDED_BYTES = 4096  # their names and values in all
_VISIBLE = bytes(range(0x20, 0x7F)) + b"\t"  # what a forwarded value may hold
_TOKEN = bytes(c for c in range(0x21, 0x7F) if c != ord(":"))  # what a forwarded name may hold
CLIENT_GONE_STATUS = OUTCOMES["client_disconnected"].http_status
DEFAULT_BACKOFF_S = 1.0  # an engine's 429 without a usable Retry-After
MAX_BACKOFF_S = 60.0  # the longest a 429's Retry-After keeps an engine out
# the attempt got no answer's head (a read or connect timeout, a closed or broken connection)
_UNANSWERED = (UpstreamConnectError, UpstreamClosedError, UpstreamHeadTimeout,
               UpstreamProtocolError)
_LOCAL_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EADDRNOTAVAIL}


class Dispatch:
    """Sends a request to the endpoints the router picks until one answers it."""

    def __init__(self, config: GatewayConfig, upstreams: Upstreams, client: UpstreamClient,
                 metrics: GatewayMetrics, router: Router, *, clock: Callable[[], float],
                 inflight: Callable[[], int]):
        """`inflight`: the requests the process is serving now (the retry budget's base)."""
        self.retries = config.retries
        self.timeouts = config.timeouts
        self.upstreams = upstreams
        self.client = client
        self.metrics = metrics
        self.router = router
        self.clock = clock
        self.inflight = inflight
        self.relay = Relay(clock, self.upstream_error)
        self.retrying = 0  # retry attempts in flight (the retry budget)
        self.deadlines = Deadlines()

    def upstream_error(self, engine: str, reason: str) -> None:
        self.metrics.upstream_errors.labels(engine, reason).inc()

    async def send(self, exchange: ServerExchange, flight: Flight, req: PreparedRequest,
                   tenant: Tenant) -> None:
        """Serve `req` from the first endpoint that answers; raises the error the client
        gets when none does."""
        retries = self.retries
        deadline = flight.arrived_s + retries.deadline_s
        ticket = flight.ticket
        precision = ticket.precision if ticket is not None and ticket.precision is not None \
            else req.precision  # a budget downgrade forces its precision
        tried: list[str] = []
        last_error: WattgateError | None = None
        while flight.attempts < retries.max_attempts and (not tried or self.clock() < deadline):
            try:
                state = self.router.choose(req, tenant.precision, tenant.slo_class, precision,
                                           tried, exchange.path)
            except RoutingError:
                if last_error is not None:
                    raise last_error from None
                if precision is not None and precision == req.precision:
                    self._check_served(req.model, precision)
                raise
            retry = bool(tried)
            if retry:
                if not self._retry_allowed():
                    assert last_error is not None
                    self.metrics.retries_refused.labels(req.model).inc()
                    raise last_error
                self.metrics.retries.labels(req.model).inc()
                self.retrying += 1
            tried.append(state.endpoint.name)
            flight.attempts += 1
            flight.endpoint = state
            try:
                return await self._attempt(exchange, flight, state, req)
            except _RetryableError as exc:
                last_error = exc.error
            finally:
                if retry:
                    self.retrying -= 1
        assert last_error is not None
        raise last_error

    def _retry_allowed(self) -> bool:
        """Envoy's retry budget: retries in flight within budget_percent of the requests in
        flight, min_retry_concurrency always allowed."""
        retries = self.retries
        return self.retrying < max(retries.min_retry_concurrency,
                                   retries.budget_percent / 100.0 * self.inflight())

    async def _attempt(self, exchange: ServerExchange, flight: Flight, state: EndpointState,
                       req: PreparedRequest) -> None:
        ep = state.endpoint
        headers = [("Content-Type", "application/json"), ("x-request-id", flight.request_id)]
        headers += forwarded_headers(exchange.raw_headers)
        if flight.trace is not None:  # telemetry on: the engine joins the request's trace
            headers += flight.trace.engine_headers()
        body = req.upstream_body(ep.upstream_model)
        state.inflight += 1
        flight.engine_failed = False  # this attempt's engine, not an earlier one
        flight.dispatched_s = self.clock()
        # One deadline for the whole attempt. Connect, first-byte and per-read stalls are the
        # client's own lazy timer, so no timer is rescheduled per read.
        deadline = self.deadlines.arm(self.timeouts.total_s
                                      - (flight.dispatched_s - flight.arrived_s))
        try:
            try:
                upstream = await self.client.post(ep.url, exchange.path, body, headers)
            except _UNANSWERED as exc:
                error = self._unanswered(state, exc)
                raise error from (exc if isinstance(error, _RetryableError) else None)
            try:
                flight.first_byte_s = self.clock()
                flight.upstream_status = upstream.status
                if upstream.status >= 500 or upstream.status == 429:
                    raise _RetryableError(await self._engine_failed(state, upstream))
                await self._relay(exchange, flight, state, upstream, req)
            finally:
                # back to the pool only if the whole response was read; else dropped, so
                # the engine sees the request aborted
                upstream.close()
        except asyncio.CancelledError:
            if not deadline.expired():
                raise
            if req.stream and exchange.write_paused and not exchange.client_gone:
                # the stream was held back for a client that did not read it: the time ran
                # out on the client's side; not the engine's failure (a few such clients
                # would eject healthy engines and have their work billed to no one)
                raise ClientTooSlowError("the request deadline passed while the client was "
                                         "not reading its stream") from None
            raise self._timed_out(state) from None
        except TimeoutError:
            raise self._timed_out(state) from None
        finally:
            deadline.disarm()
            state.inflight -= 1

    def _check_served(self, model: str, precision: str) -> None:
        """The client asked (`x-wattgate-precision`, `model@precision`) for a precision no
        endpoint of the pool is configured at: its request cannot be served however healthy
        the pool is, a refusal (400), not the gateway's failure (503 no_healthy_endpoint,
        which would count against the error ratio and attainment)."""
        served = sorted({s.endpoint.precision for s in self.upstreams.pools.get(model, ())})
        if served and precision not in served:
            raise RequestError(f"the model {model!r} is not served at precision {precision!r}; "
                               f"it is served at {', '.join(served)}",
                               code="precision_not_served", param=None)

    async def _engine_failed(self, state: EndpointState, upstream: UpstreamBody
                             ) -> UpstreamHttpError:
        """The engine's 5xx or 429, counted against it (a 429 also backs it off for its
        Retry-After, at most MAX_BACKOFF_S): the error the client gets if no other engine
        answers."""
        error_bytes = b""
        with contextlib.suppress(UpstreamFailure):
            error_bytes = await upstream.read_all()
        self.upstream_error(state.endpoint.name, f"http_{upstream.status}")
        self.upstreams.failed(state)
        error = engine_error(upstream.status, error_bytes, upstream.head.headers)
        if upstream.status == 429:
            wait_s = DEFAULT_BACKOFF_S if error.retry_after_s is None else error.retry_after_s
            self.upstreams.backed_off(state, min(wait_s, MAX_BACKOFF_S))
        return error

    async def _relay(self, exchange: ServerExchange, flight: Flight, state: EndpointState,
                     upstream: UpstreamBody, req: PreparedRequest) -> None:
        """Relay the engine's answer and tell outlier detection how it went, however the relay
        ends (a stall or a broken body raises). A non-streamed answer the engine broke (cut
        short, not JSON) reached the client in no part: another endpoint may try it. A
        timeout is not retried: the engine may still be working on it. A client that left
        says nothing of the engine: no success to end its run of failures."""
        answered = False
        try:
            n = req.body.get("n")  # the choices whose finish_reason ends a stream
            await self.relay.forward(exchange, flight, upstream, engine=state.endpoint.name,
                                     stream=req.stream,
                                     client_wants_usage=req.client_wants_usage,
                                     headers=flight.response_headers(),
                                     choices=n if type(n) is int and n > 1 else 1)
            answered = True
        except UpstreamError as exc:
            if flight.engine_failed and not req.stream \
                    and not isinstance(exc, UpstreamTimeoutError):
                raise _RetryableError(exc) from None
            raise
        finally:
            if flight.engine_failed:
                self.upstreams.failed(state)
            elif answered and flight.http_status != CLIENT_GONE_STATUS:
                self.upstreams.succeeded(state)

    def _timed_out(self, state: EndpointState) -> UpstreamTimeoutError:
        """The attempt ran past the request deadline."""
        self.upstream_error(state.endpoint.name, "timeout")
        self.upstreams.failed(state)
        return UpstreamTimeoutError("the engine did not finish within the request deadline")

    def _unanswered(self, state: EndpointState, exc: Exception) -> Exception:
        """The error for an attempt that got no answer's head: a retryable one where another
        endpoint may do better, the gateway's own overload where it ran out of a resource."""
        ep = state.endpoint
        if isinstance(exc, UpstreamConnectError | UpstreamClosedError):
            reason = local_resource_error(exc)
            if reason is not None:  # the gateway's own limit, not the engine's fault
                self.metrics.local_errors.labels(reason).inc()
                return OverloadedError("the gateway is out of a local resource "
                                       f"({reason}); retry shortly")
            self.upstream_error(ep.name, "connect")
            self.upstreams.failed(state)
            return _RetryableError(UpstreamError(f"engine {ep.name} is unreachable"))
        if isinstance(exc, UpstreamHeadTimeout):
            self.upstream_error(ep.name, "timeout")
            self.upstreams.failed(state)
            return UpstreamTimeoutError(f"engine {ep.name} did not answer within "
                                        f"{self.timeouts.first_byte_s:g} s")
        self.upstream_error(ep.name, "protocol")
        self.upstreams.failed(state)
        return UpstreamError(f"engine {ep.name} sent an invalid HTTP response",
                             code="upstream_protocol_error")


class _RetryableError(Exception):
    """An attempt failed before any byte reached the client; another endpoint may try."""

    def __init__(self, error: WattgateError):
        super().__init__(error.message)
        self.error = error


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
    the gateway, nor `x-request-id`, which the gateway sets): each made of visible ASCII (a
    control character or a non-ASCII byte drops the header), the first MAX_FORWARDED_HEADERS
    of them within MAX_FORWARDED_BYTES. Most requests carry none, so the loop is one prefix
    test per header."""
    out: list[tuple[str, str]] = []
    size = 0
    for name, value in raw_headers:
        if name.startswith(_X_PREFIXES):
            lname = name.lower()
            if lname.startswith(b"x-wattgate-") or lname == b"x-request-id" \
                    or name.translate(None, _TOKEN) or value.translate(None, _VISIBLE):
                continue
            size += len(name) + len(value)
            if len(out) == MAX_FORWARDED_HEADERS or size > MAX_FORWARDED_BYTES:
                break
            out.append((name.decode("ascii"), value.decode("ascii")))
    return out
