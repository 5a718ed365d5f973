"""One keep-alive HTTP/1.1 client connection (the gateway: to an engine), an `asyncio.Protocol`.

It carries one request at a time: `send` writes the request in one `transport.write`,
`head` waits for the response head, `read` returns the body bytes buffered so far (one item
for however many reads and chunks arrived), `b""` at the end. Deadlines run on one lazy timer
per connection, not one per read or per request: it stays armed across back-to-back requests,
re-arms itself from the current response's deadlines when it fires, and lapses once idle.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import cast

from wire.errors import (
    UpstreamClosedError,
    UpstreamHeadTimeout,
    UpstreamProtocolError,
    UpstreamReadTimeout,
    UpstreamStaleConnection,
)
from wire.response import MalformedResponse, ResponseHead, ResponseParser

HIGH_WATER_BYTES = 256 * 1024  # buffered body bytes that pause reading from the engine
# uvloop's clock ticks in milliseconds: a timer may fire a hair before its due time
_SLACK_S = 0.002


class UpstreamConnection(asyncio.Protocol):
    __slots__ = ("_body", "_buffered", "_exc", "_first_byte_at", "_last_read_at", "_loop",
                 "_parser", "_paused", "_read_s", "_sink", "_spare", "_timer", "_transport",
                 "_waiter", "closed", "idle_since", "requests", "seen_bytes")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser: ResponseParser | None = None  # the response in progress
        self._spare: ResponseParser | None = None  # the last one's, reset for the next
        self._waiter: asyncio.Future[None] | None = None
        self._body: list[bytes] = []
        self._buffered = 0
        self._exc: BaseException | None = None
        self._paused = False
        # body bytes go straight to this callback (body, at_end) instead of the buffer
        self._sink: Callable[[bytes, bool], None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._first_byte_at = 0.0
        self._last_read_at = 0.0
        self._read_s = 0.0
        self.closed = False
        self.idle_since = 0.0
        self.requests = 0  # requests sent on this connection
        self.seen_bytes = False  # any byte of the current response arrived

    # --- protocol callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass, but has its methods
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # without it the last small write of a stream waits for a delayed ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:  # bytes while idle: the engine broke the protocol
            self._fail(UpstreamProtocolError("the engine sent bytes outside a response"))
            return
        self.seen_bytes = True
        self._last_read_at = self._loop.time()
        try:
            body = parser.feed(data)
        except MalformedResponse as exc:
            self._fail(UpstreamProtocolError(str(exc)))
            return
        sink = self._sink
        if sink is not None:
            done = parser.done
            if body or done:
                sink(body, done)
            if done:
                self._sink = None
                if parser.extra:
                    self._close_transport()
                self._wake()
            return
        if body:
            self._body.append(body)
            self._buffered += len(body)
            if self._buffered > HIGH_WATER_BYTES and not self._paused:
                self._paused = True
                assert self._transport is not None
                self._transport.pause_reading()
        if parser.done:
            if parser.extra:  # bytes past the response: never reuse this connection
                self._close_transport()
        elif parser.head is None:
            return
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def eof_received(self) -> bool:
        parser = self._parser
        if parser is not None and parser.until_close:
            parser.feed_eof()
            self._wake()
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        parser = self._parser
        if parser is None or parser.done:
            self._wake()
            return
        if parser.until_close and exc is None:
            parser.feed_eof()
            self._wake()
            return
        if not self.seen_bytes and self.requests > 1:
            error: BaseException = UpstreamStaleConnection(
                "a reused connection closed before the response started")
        else:
            error = UpstreamClosedError("the engine closed the connection "
                                        + ("mid-response" if self.seen_bytes else
                                           "before answering"))
        if exc is not None:
            error.__cause__ = exc
        self._fail(error, close=False)

    def pause_writing(self) -> None:  # the request is one write; nothing else to stop
        pass

    def resume_writing(self) -> None:
        pass

    # --- the request/response cycle ---------------------------------------------------------

    def send(self, request: bytes, *, first_byte_s: float, read_s: float) -> None:
        """Write one request and start waiting for its response."""
        assert self._transport is not None and not self.closed
        parser = self._spare
        if parser is None:
            parser = ResponseParser()
        else:
            parser.reset()
            self._spare = None
        self._parser = parser
        self._body = []
        self._buffered = 0
        self._sink = None
        self._exc = None
        self.seen_bytes = False
        self.requests += 1
        self._read_s = read_s
        now = self._loop.time()
        self._first_byte_at = now + first_byte_s
        self._last_read_at = now
        due = now + min(first_byte_s, read_s)
        timer = self._timer
        if timer is None or timer.when() > due:  # else the armed one fires early enough
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(due, self._on_timer)
        self._transport.write(request)

    async def head(self) -> ResponseHead:
        """Wait for the response head. Raises `UpstreamFailure` subclasses."""
        parser = self._parser
        assert parser is not None
        while parser.head is None:
            if self._exc is not None:
                raise self._exc
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return parser.head

    def stream_to(self, sink: Callable[[bytes, bool], None]) -> None:
        """From now on hand body bytes to `sink(body, at_end)` as they arrive, with no task
        wake-up per read; what is buffered already goes first. `finished` waits for the end."""
        body = self._body
        parser = self._parser
        done = parser is None or parser.done
        if body or done:
            self._body = []
            self._buffered = 0
            sink(body[0] if len(body) == 1 else b"".join(body), done and self._exc is None)
        if self._paused:
            self.resume()
        if not done and self._exc is None:
            self._sink = sink

    async def finished(self) -> None:
        """Wait until the response streaming to the sink has ended; raises its failure."""
        while True:
            if self._exc is not None:
                self._sink = None
                raise self._exc
            parser = self._parser
            if parser is None or parser.done:
                return
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def pause(self) -> None:
        """Stop reading from the engine while the client catches up (no stall timeout)."""
        if not self._paused and self._transport is not None and not self.closed:
            self._paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self._last_read_at = self._loop.time()  # the pause was ours, not a stall
            if self._transport is not None and not self.closed:
                self._transport.resume_reading()

    def at_end(self) -> bool:
        """The whole response arrived and every body byte was read: the next `read` is b""."""
        parser = self._parser
        return not self._body and self._exc is None and (parser is None or parser.done)

    async def read(self) -> bytes:
        """Body bytes that arrived since the last call (waits for some); b"" at the end."""
        while True:
            if self._body:
                body = self._body
                data = body[0] if len(body) == 1 else b"".join(body)
                self._body = []
                self._buffered = 0
                if self._paused:
                    self._paused = False
                    self._last_read_at = self._loop.time()  # the pause was ours, not a stall
                    if self._transport is not None:
                        self._transport.resume_reading()
                return data
            if self._exc is not None:
                raise self._exc
            parser = self._parser
            if parser is None or parser.done:
                return b""
            # inline, not a helper coroutine: this runs once per engine write
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def whole(self) -> bytes | None:
        """The whole body if the response has ended and nothing of it was read (None
        otherwise, and after a failure: `read` says which)."""
        parser = self._parser
        if parser is None or not parser.done or self._exc is not None or self._paused:
            return None
        body = self._body
        self._body = []
        self._buffered = 0
        return body[0] if len(body) == 1 else b"".join(body)

    @property
    def complete(self) -> bool:
        """The whole response arrived and was read: the connection may serve another."""
        parser = self._parser
        return (parser is not None and parser.done and not self._body and not self.closed
                and parser.head is not None and parser.head.keep_alive and not parser.extra)

    def reset(self, now: float) -> None:
        """Back to idle, after a complete response."""
        self._spare = self._parser
        self._parser = None
        self.idle_since = now

    def abort(self) -> None:
        """Drop the connection now; the engine sees the request cancelled."""
        self._sink = None
        self._cancel_timer()
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    # --- internals --------------------------------------------------------------------------

    def _on_timer(self) -> None:
        self._timer = None
        parser = self._parser
        if parser is None or parser.done or self._exc is not None:
            return
        now = self._loop.time()
        if parser.head is None:  # only the first-byte deadline applies before the head
            if now >= self._first_byte_at - _SLACK_S:
                self._fail(UpstreamHeadTimeout("no response head within the first-byte timeout"))
                return
            # not later than a read timeout away: the head may come and the body then stall
            due = min(self._first_byte_at, now + self._read_s)
        elif self._paused:  # back-pressure from the client, not an engine stall
            due = now + self._read_s
        else:
            due = self._last_read_at + self._read_s
            if now >= due - _SLACK_S:
                self._fail(UpstreamReadTimeout("the engine sent nothing for longer than the "
                                               "read timeout"))
                return
        self._timer = self._loop.call_at(due, self._on_timer)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, exc: BaseException, *, close: bool = True) -> None:
        self._sink = None
        if self._exc is None:
            self._exc = exc
        self._cancel_timer()
        if close:
            self._close_transport()
        self._wake()

    def _close_transport(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
