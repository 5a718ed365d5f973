"""The lean front: an HTTP/1.1 server protocol for the two completion routes.

aiohttp's server costs more CPU per request than the rest of the proxy together (request and
response objects, middleware, router, payload writer). The completion routes are the whole
traffic, and their requests have one simple shape, so the front parses that shape itself and
hands the proxy a `FrontExchange`. Anything else (other routes, chunked uploads, HTTP/1.0,
oversized bodies, malformed heads) hands the connection to aiohttp's protocol, bytes and all,
and aiohttp serves it from then on.

Per request: one task, one head parse, one `transport.write` for a whole answer, one per
stream piece (the stream head rides with the first piece).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, cast

from gateway.front.head import HANDOFF, RequestHead, parse_head

if TYPE_CHECKING:
    from gateway.exchange import Exchange

MAX_BUFFER_BYTES = 1024 * 1024  # bytes queued behind a request in flight before reading pauses

_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}
_STREAM_HEAD = (b"Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                b"Transfer-Encoding: chunked\r\n")
_END = b"0\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    """One piece in chunked transfer coding."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class _DateHeader:
    """`Date: ...\r\n`, formatted once a second."""

    __slots__ = ("_line", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._line


_date = _DateHeader()


class EdgeLimits:
    """The edge's deadlines and caps (listen.* in the config)."""

    __slots__ = ("body_min_bytes_per_s", "body_timeout_s", "header_timeout_s", "keepalive_s",
                 "max_connections")

    def __init__(self, *, header_timeout_s: float = 10.0, body_timeout_s: float = 30.0,
                 body_min_bytes_per_s: float = 65536.0, keepalive_s: float = 75.0,
                 max_connections: int = 4096):
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.body_min_bytes_per_s = body_min_bytes_per_s
        self.keepalive_s = keepalive_s
        self.max_connections = max_connections

    def body_deadline_s(self, content_length: int) -> float:
        """Seconds a body of this size may take after its head."""
        return self.body_timeout_s + content_length / self.body_min_bytes_per_s


class FrontSettings:
    __slots__ = ("cancel_on_disconnect", "handoff", "limits", "max_body_bytes", "on_reject",
                 "routes", "serve")

    def __init__(self, serve: Callable[[Exchange], object], handoff: Callable[[], asyncio.Protocol],
                 routes: Sequence[str], max_body_bytes: int, cancel_on_disconnect: bool = True,
                 limits: EdgeLimits | None = None,
                 on_reject: Callable[[str], None] | None = None):
        self.serve = serve  # the proxy's `serve(exchange)` coroutine function
        self.handoff = handoff  # makes the aiohttp protocol that takes a handed-over connection
        self.routes = frozenset(r.encode() for r in routes)
        self.max_body_bytes = max_body_bytes
        self.cancel_on_disconnect = cancel_on_disconnect
        self.limits = limits or EdgeLimits()
        self.on_reject = on_reject  # counts connections the edge closed, by reason


class FrontConnections:
    """The open client connections of one listener (the front's and those handed to aiohttp),
    for the edge's deadlines, the connection cap and shutdown."""

    def __init__(self) -> None:
        self.open: set[FrontProtocol] = set()
        self.handed: dict[object, HandedConnection] = {}  # aiohttp's transport -> guard
        self.closing = False

    def __len__(self) -> int:
        return len(self.open) + len(self.handed)

    def close_idle(self, idle_for_s: float = 0.0) -> int:
        """Close front connections with no request in flight and no bytes of the next one,
        idle at least `idle_for_s`."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        closed = 0
        for conn in list(self.open):
            if (conn.task is None and not conn.reading()
                    and now - conn.last_active >= idle_for_s):
                conn.close()
                closed += 1
        return closed

    def expire(self, now: float) -> int:
        """Enforce the deadlines: a head or a body that is late gets 408 and its connection
        closes; an idle keep-alive connection closes. Returns how many closed."""
        closed = 0
        for conn in list(self.open):
            closed += conn.expire(now)
        for guard in list(self.handed.values()):
            closed += guard.expire(now)
        return closed

    def abort_all(self) -> None:
        for conn in list(self.open):
            if conn.task is not None:
                conn.task.cancel()
            conn.close()
        for guard in list(self.handed.values()):
            guard.close()


class FrontProtocol(asyncio.Protocol):
    __slots__ = ("_buf", "_drain", "_head", "_loop", "_on_drain", "_read_paused", "_write_paused",
                 "connections", "head_since", "last_active", "lost", "settings", "task",
                 "transport")

    def __init__(self, settings: FrontSettings, connections: FrontConnections):
        self.settings = settings
        self.connections = connections
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._head: RequestHead | None = None  # parsed, body still arriving
        self.task: asyncio.Task[None] | None = None
        self.lost = False
        self._read_paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._on_drain: Callable[[], None] | None = None
        self.last_active = 0.0  # when the last response ended (or the connection opened)
        # When the head being read started: a new connection's first byte is due at once, a
        # kept-alive one's when its first byte comes. A trickled head does not move it.
        self.head_since: float | None = None

    # --- asyncio callbacks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.last_active = self.head_since = self._loop.time()
        if len(self.connections) >= self.settings.limits.max_connections:
            # past the cap: say so (503 + Retry-After) and close, before the fd runs out
            self._reject(503, b"overloaded", b"the gateway has as many client connections as "
                         b"it takes (listen.max_connections); retry shortly", retry_after=True)
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connections.open.add(self)

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return  # rejected at connect, or closing: nothing more is served here
        self._buf += data
        if self.head_since is None and self._head is None:
            self.head_since = self._loop.time()
        if self.task is None:
            self._next()
        elif len(self._buf) > MAX_BUFFER_BYTES and not self._read_paused:
            self._read_paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    def reading(self) -> bool:
        """Bytes of a request have come and its answer has not started."""
        return self.task is None and (bool(self._buf) or self._head is not None)

    def expire(self, now: float) -> int:
        """Apply the deadlines (1 if this connection was closed)."""
        if self.task is not None or self.lost:
            return 0
        limits = self.settings.limits
        if self._head is not None:
            late = now - self.last_active > limits.body_deadline_s(self._head.content_length)
            if late:
                self._reject(408, b"request_timeout", b"the request body did not arrive in "
                             b"time (listen.body_timeout_s)", reason="body_timeout")
            return int(late)
        if self.head_since is not None:
            if now - self.head_since > limits.header_timeout_s:
                self._reject(408, b"request_timeout", b"the request head did not arrive in "
                             b"time (listen.header_timeout_s)", reason="header_timeout")
                return 1
            return 0
        if now - self.last_active > limits.keepalive_s:
            self.close()
            return 1
        return 0

    def _reject(self, status: int, code: bytes, message: bytes, *, retry_after: bool = False,
                reason: str | None = None) -> None:
        """Answer with an OpenAI-style error and close the connection."""
        body = (b'{"error":{"message":"' + message + b'","type":"invalid_request_error",'
                b'"param":null,"code":"' + code + b'"}}')
        head = [_STATUS_LINES[status], b"Content-Type: application/json\r\n",
                b"Content-Length: %d\r\n" % len(body), b"Connection: close\r\n", _date()]
        if retry_after:
            head.append(b"Retry-After: 1\r\n")
        head.append(b"\r\n")
        if self.settings.on_reject is not None:
            self.settings.on_reject(reason or code.decode())
        assert self.transport is not None
        self.transport.write(b"".join(head) + body)
        self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.connections.open.discard(self)
        self._wake_writer()
        if self.task is not None and self.settings.cancel_on_disconnect:
            self.task.cancel()  # the proxy records the disconnect and aborts the engine request

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    # --- requests ----------------------------------------------------------------------------

    def _next(self) -> None:
        buf = self._buf
        head = self._head or parse_head(buf, self.settings.routes, self.settings.max_body_bytes)
        if head is None:
            return
        if head is HANDOFF:
            self._handoff()
            return
        assert isinstance(head, RequestHead)
        end = head.body_start + head.content_length
        if len(buf) < end:
            if self._head is None:  # the body's deadline runs from its head
                self._head = head
                self.last_active = self._loop.time()
            return
        self.head_since = None
        body = bytes(buf[head.body_start:end])
        del buf[:end]
        self._head = None
        self.task = self._loop.create_task(self._serve(head, body))

    async def _serve(self, head: RequestHead, body: bytes) -> None:
        exchange = FrontExchange(self, head, body)
        try:
            await self.settings.serve(exchange)  # type: ignore[misc]
        finally:
            self.task = None
        if self.lost:
            return
        if not exchange.finished or not head.keep_alive or self.connections.closing:
            self.close()
            return
        self.last_active = self._loop.time()
        if self._buf:  # the next request's bytes came already (pipelined)
            self.head_since = self.last_active
        if self._read_paused:
            self._read_paused = False
            assert self.transport is not None
            self.transport.resume_reading()
        if self._buf:
            self._next()

    def _handoff(self) -> None:
        """aiohttp serves this connection from here on, starting with the buffered bytes."""
        transport = self.transport
        assert transport is not None
        data = bytes(self._buf)
        self._buf.clear()
        self.connections.open.discard(self)
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        handler = HandedConnection(self.settings.handoff(), self.connections, self.settings,
                                   self.head_since or self._loop.time())
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if data:
            handler.data_received(data)

    # --- writing -----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if not self.lost:
            assert self.transport is not None
            self.transport.write(data)

    async def drained(self) -> None:
        """Wait while the client reads slower than the engine writes."""
        while self._write_paused and not self.lost:
            self._drain = self._loop.create_future()
            await self._drain

    def _wake_writer(self) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        callback, self._on_drain = self._on_drain, None
        if callback is not None:
            callback()

    def close(self) -> None:
        self.connections.open.discard(self)
        if self.transport is not None and not self.lost:
            self.transport.close()


class FrontExchange:
    """One request on a front connection, answered with raw HTTP/1.1 bytes."""

    __slots__ = ("_body", "_conn", "_head", "_pending_head", "content_length", "finished",
                 "path", "started")

    def __init__(self, conn: FrontProtocol, head: RequestHead, body: bytes):
        self._conn = conn
        self._head = head
        self._body = body
        self.path = head.path
        self.content_length: int | None = head.content_length
        self.started = False
        self.finished = False
        self._pending_head = b""

    def header(self, name: str) -> str | None:
        value = self._head.headers.get(name.encode())
        return None if value is None else value.decode("latin-1")

    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]:
        return self._head.raw_headers

    async def read_body(self, limit: int) -> bytes:
        return self._body  # the head parser handed over anything beyond the limit

    def _head_bytes(self, status: int, fixed: bytes, headers: Mapping[str, str]) -> list[bytes]:
        parts = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode(), fixed,
                 _date()]
        for name, value in headers.items():
            parts.append(f"{name}: {value}\r\n".encode("latin-1"))
        if not self._head.keep_alive:
            parts.append(b"Connection: close\r\n")
        parts.append(b"\r\n")
        return parts

    def reply(self, status: int, body: bytes, content_type: str,
              headers: Mapping[str, str]) -> None:
        if self.started:
            return  # a stream already began; it ends as it is
        self.started = self.finished = True
        fixed = f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n".encode()
        parts = self._head_bytes(status, fixed, headers)
        parts.append(body)
        self._conn.send(b"".join(parts))

    async def start_stream(self, headers: Mapping[str, str]) -> None:
        # sent with the first piece: one write instead of two, and the client learns nothing
        # from a head alone
        self.started = True
        self._pending_head = b"".join(self._head_bytes(200, _STREAM_HEAD, headers))

    async def write(self, data: bytes) -> bool:
        if not self.write_now(data):
            return False
        conn = self._conn
        if conn._write_paused:
            await conn.drained()
        return not conn.lost

    # --- callback-mode streaming: no task wake-up per piece --------------------------------

    def write_now(self, data: bytes) -> bool:
        """`write`, from a plain callback; False once the client has gone away. The caller
        checks `write_paused` after it and stops its source until `when_drained` calls back."""
        conn = self._conn
        if conn.lost:
            return False
        frame = _chunk(data)
        if self._pending_head:
            frame = self._pending_head + frame
            self._pending_head = b""
        conn.send(frame)
        return True

    @property
    def write_paused(self) -> bool:
        return self._conn._write_paused

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the client's socket takes data again (or the client is gone)."""
        if self._conn.lost or not self._conn._write_paused:
            callback()
        else:
            self._conn._on_drain = callback

    async def end_stream(self, last: bytes = b"") -> None:
        self.finished = True
        frame = _chunk(last) + _END if last else _END
        self._conn.send(self._pending_head + frame)
        self._pending_head = b""


class HandedConnection(asyncio.Protocol):
    """A connection the front handed to aiohttp: aiohttp's protocol does the HTTP, this guard
    passes every callback on and holds it to the edge's deadlines (aiohttp has no head
    deadline, and its keep-alive is its own). The app marks its requests in flight
    (`request_started` / `request_done`), so the guard knows when bytes belong to a new head."""

    __slots__ = ("_conn", "busy", "connections", "head_since", "inner", "last_active",
                 "settings", "transport")

    def __init__(self, inner: asyncio.Protocol, connections: FrontConnections,
                 settings: FrontSettings, head_since: float):
        self.inner = inner
        self.connections = connections
        self.settings = settings
        self.transport: asyncio.Transport | None = None
        self.busy = 0
        self.head_since: float | None = head_since
        self.last_active = head_since

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.connections.handed[transport] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.busy == 0 and self.head_since is None:
            self.head_since = asyncio.get_running_loop().time()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.handed.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def request_started(self) -> None:
        self.busy += 1
        self.head_since = None

    def request_done(self, now: float) -> None:
        self.busy -= 1
        self.last_active = now

    def expire(self, now: float) -> int:
        limits = self.settings.limits
        if self.busy or self.transport is None or self.transport.is_closing():
            return 0
        if self.head_since is not None and now - self.head_since > limits.header_timeout_s:
            if self.settings.on_reject is not None:
                self.settings.on_reject("header_timeout")
            self.transport.write(
                _STATUS_LINES[408] + b"Content-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n" % len(_TIMEOUT_BODY) + _TIMEOUT_BODY)
            self.close()
            return 1
        if self.head_since is None and now - self.last_active > limits.keepalive_s:
            self.close()
            return 1
        return 0

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


_TIMEOUT_BODY = (b'{"error":{"message":"the request head did not arrive in time",'
                 b'"type":"invalid_request_error","param":null,"code":"request_timeout"}}')
