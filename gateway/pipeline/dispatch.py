"""The dispatch step: attempts on the routed endpoints, retries, and the relay of the answer.

Connect errors and 5xx before the first byte go to another endpoint, within the attempt
limit, the retry deadline and Envoy's retry budget. Every attempt tells the endpoint's
outlier detection how it went; the engine's failures are counted by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import Callable, Sequence

from gateway.config import GatewayConfig, Tenant
from gateway.errors import (
    OverloadedError,
    RoutingError,
    UpstreamError,
    UpstreamTimeoutError,
    WattgateError,
    engine_error,
)
from gateway.metrics import GatewayMetrics
from gateway.pipeline.deadline import Deadlines
from gateway.pipeline.flight import Flight
from gateway.pipeline.route import Router
from gateway.relay import Relay
from gateway.requests import PreparedRequest
from gateway.upstreams import EndpointState, Upstreams
from wire.client import UpstreamClient
from wire.errors import (
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamFailure,
    UpstreamHeadTimeout,
    UpstreamProtocolError,
)
from wire.exchange import ServerExchange

_X_PREFIXES = (b"x-", b"X-")
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

    async def __call__(self, exchange: ServerExchange, flight: Flight, req: PreparedRequest,
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
                state = self.router(req, tenant.precision, tenant.slo_class, precision, tried,
                                    exchange.path)
            except RoutingError:
                if last_error is not None:
                    raise last_error from None
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
                if upstream.status >= 500:
                    error_bytes = b""
                    with contextlib.suppress(UpstreamFailure):
                        error_bytes = await upstream.read_all()
                    self.upstream_error(ep.name, f"http_{upstream.status}")
                    self.upstreams.failed(state)
                    raise _RetryableError(engine_error(upstream.status, error_bytes,
                                                       upstream.head.headers))
                await self.relay(exchange, flight, upstream, engine=ep.name,
                                 stream=req.stream,
                                 client_wants_usage=req.client_wants_usage,
                                 headers=flight.response_headers())
                if flight.engine_failed:
                    self.upstreams.failed(state)
                else:
                    self.upstreams.succeeded(state)
            finally:
                # back to the pool only if the whole response was read; else dropped, so
                # the engine sees the request aborted
                upstream.close()
        except asyncio.CancelledError:
            if not deadline.expired():
                raise
            raise self._timed_out(state) from None
        except TimeoutError:
            raise self._timed_out(state) from None
        finally:
            deadline.disarm()
            state.inflight -= 1

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
