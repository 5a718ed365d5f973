"""The one relay: an engine's response to the client, whichever server carries the client.

A streamed answer goes from the engine connection's own callback straight to the client
(`ServerExchange.write_now`), one step per engine read: the SSE scanner times the token events
and reads the usage, and back-pressure pauses the engine while the client's socket is full. A
non-streamed answer is read whole and answered in one piece. Every ending lands on the flight:
tokens relayed, who broke the stream, whether the client got the whole answer.

The engine broke the answer (`flight.engine_failed`, which outlier detection and the success
weighting count) when it stalled past the read timeout, closed early, sent a non-streamed
200 that is not a JSON object (an SSE stream, garbage: a 502, never relayed as a 200), ended
a stream without `data: [DONE]` (garbage, or a cut) or put an error event in it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from core.errors import (
    UpstreamError,
    UpstreamTimeoutError,
    WattgateError,
    engine_error,
    error_body,
)
from core.vocab import Outcome
from gateway.sse import SseScanner, json_object
from wire.errors import UpstreamFailure, UpstreamReadTimeout
from wire.exchange import ServerExchange, UpstreamBody

log = logging.getLogger("wattgate.proxy")


class RelayFlight(Protocol):
    """What the relay reads and writes of a request in flight (the proxy's `Flight`)."""

    request_id: str
    delivered: bool
    engine_failed: bool
    first_byte_s: float | None
    engine_done_s: float | None
    read_events: list[int]
    completion_tokens: int

    def token_read(self, now: float, tokens: int) -> None: ...

    def take_usage(self, usage: dict[str, Any]) -> None: ...

    def fail(self, exc: WattgateError) -> None: ...

    def end(self, outcome: Outcome) -> None: ...

    def client_gone(self) -> None: ...

    def engine_refused(self, http_status: int) -> None: ...


class Relay:
    """Relays for one proxy: its clock, and where an engine's failures are counted
    (`upstream_error(engine, reason)`)."""

    __slots__ = ("clock", "upstream_error")

    def __init__(self, clock: Callable[[], float],
                 upstream_error: Callable[[str, str], None]):
        self.clock = clock
        self.upstream_error = upstream_error

    def forward(self, exchange: ServerExchange, flight: RelayFlight, upstream: UpstreamBody,
                *, engine: str, stream: bool, client_wants_usage: bool,
                headers: Mapping[str, str], choices: int = 1) -> Coroutine[Any, Any, None]:
        """Relay `upstream` to `exchange`: streamed if the client asked and the engine said
        200, else in one piece. `headers` go on the client's response; `choices`: the
        request's `n`. (The coroutine of the one that applies, not a wrapper around it: one
        frame less per request.)"""
        if stream and upstream.status == 200:
            return self._stream(exchange, flight, upstream, engine, client_wants_usage, headers,
                                choices)
        return self._body(exchange, flight, upstream, engine, headers)

    async def _body(self, exchange: ServerExchange, flight: RelayFlight, upstream: UpstreamBody,
                    engine: str, headers: Mapping[str, str]) -> None:
        # a body that came with its head (the usual case) is taken as it is, with no wait
        body = upstream.whole()
        if body is None:
            body = await self._read_all(flight, upstream, engine)
        # A non-streamed answer's head leaves the engine once its body is ready: that, not
        # the gateway's read of the body (late on a busy gateway), is when the engine finished.
        flight.engine_done_s = flight.first_byte_s
        if upstream.status >= 400:  # the engine's error, in the gateway's one shape
            error = engine_error(upstream.status, body, upstream.head.headers)
            flight.engine_refused(upstream.status)
            exchange.reply(upstream.status, error.body(), "application/json",
                           {**headers, **error.headers()})
            return
        if upstream.status == 200:
            doc = json_object(body)
            if doc is None:  # an SSE stream or garbage where a JSON answer was asked for
                self.upstream_error(engine, "protocol")
                flight.engine_failed = True
                raise UpstreamError("the engine's answer is not a JSON object",
                                    code="upstream_protocol_error")
            usage = doc.get("usage")
            if isinstance(usage, dict) and usage:
                flight.take_usage(usage)
        exchange.reply(upstream.status, body, upstream.content_type or "application/json",
                       headers)

    async def _read_all(self, flight: RelayFlight, upstream: UpstreamBody, engine: str
                        ) -> bytes:
        """The rest of the body, waited for; a stall or a cut is the engine's failure."""
        try:
            return await upstream.read_all()
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

    async def _stream(self, exchange: ServerExchange, flight: RelayFlight,
                      upstream: UpstreamBody, engine: str, client_wants_usage: bool,
                      headers: Mapping[str, str], choices: int) -> None:
        await exchange.start_stream(headers)
        scanner = SseScanner(strip_usage=not client_wants_usage, choices=choices)
        error: WattgateError | None = None
        last = b""  # the final piece, sent with the end of the stream in one write
        try:
            piece = await self._pipe(exchange, flight, upstream, scanner)
            if piece is None:  # the client went away; the engine request was aborted
                return
            last = piece
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
            stream_tokens(flight, scanner)  # however the stream ended
        if error is None and not scanner.done and b"[DONE]" not in scanner.pending():
            # garbage, or cut at an event boundary (a last `[DONE]` without its blank line
            # is let through)
            flight.engine_failed = True
            error = UpstreamError("the engine stream ended without its end marker",
                                  code="upstream_stream_error")
        if error is not None:
            self.upstream_error(engine, "stream")
            flight.fail(error)
            last = b"data: " + error_body(error.message, error.error_type, error.code) + b"\n\n"
        else:
            last += scanner.pending()
            if scanner.error:  # the engine's own error event: its failure all the same
                flight.engine_failed = True
                flight.end("upstream_error_event")
        await exchange.end_stream(last)

    async def _pipe(self, exchange: ServerExchange, flight: RelayFlight, upstream: UpstreamBody,
                    scanner: SseScanner) -> bytes | None:
        """Relay from the engine connection's own callback straight to the client: no task
        wake-up per engine read. Returns the final piece (to go out with the end of the
        stream), None if the client went away."""
        clock = self.clock
        last = b""
        # where the server holds the answer's last write for its record, the engine's `[DONE]`
        # and what follows it go out with the stream's end, not before the record
        hold_done = exchange.holds_last
        held = b""
        gone = False

        def drop() -> None:
            nonlocal gone
            gone = True
            upstream.abort()  # drops the connection: the engine aborts the request

        def drained() -> None:
            if exchange.client_gone:
                drop()
            else:
                upstream.resume()

        def on_body(data: bytes, at_end: bool) -> None:
            nonlocal last, held
            now = clock()
            out, tokens = scanner.feed(data)
            if tokens:
                flight.token_read(now, tokens)
            if at_end:
                last = held + out
            elif out:
                if hold_done and scanner.done:
                    held += out
                    return
                if not exchange.write_now(out):
                    drop()
                    return
                if scanner.complete:
                    flight.delivered = True
                if exchange.write_paused:  # the client reads slower than the engine writes
                    upstream.pause()
                    exchange.when_drained(drained)

        upstream.stream_to(on_body)
        try:
            await upstream.finished()
        except UpstreamFailure:
            if not gone:
                raise
        if gone:
            flight.client_gone()
            return None
        return last


def stream_tokens(flight: RelayFlight, scanner: SseScanner) -> None:
    """The stream's tokens, however it ended: the engine's usage when it came; otherwise the
    token events relayed (less the chat role chunk, which carries none)."""
    if scanner.usage:
        flight.take_usage(scanner.usage)
    elif flight.read_events:
        flight.completion_tokens = max(0, sum(flight.read_events) - scanner.role_events)
