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


class FrontSettings:
    __slots__ = ("cancel_on_disconnect", "handoff", "max_body_bytes", "routes", "serve")

    def __init__(self, serve: Callable[[Exchange], object], handoff: Callable[[], asyncio.Protocol],
                 routes: Sequence[str], max_body_bytes: int, cancel_on_disconnect: bool = True):
        self.serve = serve  # the proxy's `serve(exchange)` coroutine function
        self.handoff = handoff  # makes the aiohttp protocol that takes a handed-over connection
        self.routes = frozenset(r.encode() for r in routes)
        self.max_body_bytes = max_body_bytes
        self.cancel_on_disconnect = cancel_on_disconnect


class FrontConnections:
    """The open front connections of one listener, for keep-alive expiry and shutdown."""

    def __init__(self) -> None:
        self.open: set[FrontProtocol] = set()
        self.closing = False

    def close_idle(self, idle_for_s: float = 0.0) -> int:
        """Close connections with no request in flight, idle at least `idle_for_s`."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        closed = 0
        for conn in list(self.open):
            if conn.task is None and now - conn.last_active >= idle_for_s:
                conn.close()
                closed += 1
        return closed

    def abort_all(self) -> None:
        for conn in list(self.open):
            if conn.task is not None:
                conn.task.cancel()
            conn.close()


class FrontProtocol(asyncio.Protocol):
    __slots__ = ("_buf", "_drain", "_head", "_loop", "_on_drain", "_read_paused", "_write_paused",
                 "connections", "last_active", "lost", "settings", "task", "transport")

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
        self.last_active = 0.0

    # --- asyncio callbacks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.last_active = self._loop.time()
        self.connections.open.add(self)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self.last_active = self._loop.time()
        if self.task is None:
            self._next()
        elif len(self._buf) > MAX_BUFFER_BYTES and not self._read_paused:
            self._read_paused = True
            assert self.transport is not None
            self.transport.pause_reading()

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
            self._head = head
            return
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
        handler = self.settings.handoff()
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
