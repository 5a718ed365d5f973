"""The lean front: an HTTP/1.1 server protocol for the completion routes.

aiohttp's server costs more CPU per request than the rest of the proxy together (request and
response objects, middleware, router, payload writer). The completion routes are the whole
traffic, and their requests have one simple shape, so the front parses that shape itself
(wire/request_head.py) and hands the proxy a `FrontExchange` (gateway/front/exchange.py).
Anything else (other routes, chunked uploads, HTTP/1.0, oversized bodies, malformed heads)
hands the connection to aiohttp's protocol, bytes and all, and aiohttp serves it from then on
(gateway/front/connections.py guards it). A head no server should take (a bare LF, over 16 KiB)
the front refuses itself, at once (wire/request_head.py).

Per request: one task, one head parse, one `transport.write` for a whole answer, one per
stream piece (the stream head rides with the first piece).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import Callable
from typing import cast

from gateway.front.connections import FrontConnections, HandedConnection
from gateway.front.exchange import FrontExchange
from gateway.front.refusals import EDGE_ERRORS
from gateway.front.settings import FrontSettings
from wire.request_head import Refusal, RequestHead, parse_head
from wire.response_encoder import encode_response

log = logging.getLogger("wattgate.front")

MAX_BUFFER_BYTES = 1024 * 1024  # bytes queued behind a request in flight before reading pauses
# After refusing a head, what the client still sends is read and dropped this long before the
# close: closing on unread bytes sends a RST, which can destroy the answer before it is read.
REFUSAL_LINGER_S = 1.0
_RETRY_AFTER = {"Retry-After": "1"}


class FrontProtocol(asyncio.Protocol):
    __slots__ = ("_buf", "_head", "_loop", "_read_paused", "connections", "head_since",
                 "last_active", "lost", "on_drain", "refused", "settings", "task",
                 "transport", "write_paused")

    def __init__(self, settings: FrontSettings, connections: FrontConnections):
        self.settings = settings
        self.connections = connections
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._head: RequestHead | None = None  # parsed, body still arriving
        self.task: asyncio.Task[None] | None = None
        self.lost = False
        self.refused = False  # answered a refusal; what comes now is dropped
        self._read_paused = False
        self.write_paused = False  # the client reads slower than we write
        self.on_drain: Callable[[], None] | None = None  # once it reads again, or is gone
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
        if self.transport is None or self.transport.is_closing() or self.refused:
            return  # rejected, or closing: nothing more is served here
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
                reason: str | None = None, linger: bool = False) -> None:
        """Answer with an OpenAI-style error and close the connection."""
        kind = b"server_error" if status >= 500 else b"invalid_request_error"
        body = (b'{"error":{"message":"' + message + b'","type":"' + kind + b'",'
                b'"param":null,"code":"' + code + b'"}}')
        if self.settings.on_reject is not None:
            self.settings.on_reject(reason or code.decode())
        assert self.transport is not None
        self.transport.write(encode_response(status, body, "application/json",
                                             _RETRY_AFTER if retry_after else {},
                                             keep_alive=False))
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self._loop.call_later(REFUSAL_LINGER_S, self.close)
        else:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.connections.open.discard(self)
        self._wake_writer()
        if self.task is not None and self.settings.cancel_on_disconnect:
            self.task.cancel()  # the proxy records the disconnect and aborts the engine request

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()

    # --- requests ----------------------------------------------------------------------------

    def _next(self) -> None:
        buf = self._buf
        head = self._head or parse_head(buf, self.settings.routes, self.settings.max_body_bytes)
        if head is None:
            return
        if not isinstance(head, RequestHead):
            if isinstance(head, Refusal):
                self._refuse(head)
            else:
                self._handoff()
            return
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
        exchange = FrontExchange(self, head, body, self.settings.holds_last)
        try:
            await self.settings.serve(exchange)
        except BaseException:  # cancelled (the client left); serve answers every error itself
            self.task = None
            exchange.flush()
            raise
        # the answer's last write once the request's record is out of this process; the
        # connection counts as busy till then
        self.settings.after_records(functools.partial(self._answered, exchange, head))

    def _answered(self, exchange: FrontExchange, head: RequestHead) -> None:
        self.task = None
        try:
            exchange.flush()
        except Exception:
            log.exception("an answer's last write failed")
            self.close()
            return
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

    def _refuse(self, refusal: Refusal) -> None:
        """A head no server should take (bare LF, oversized, no or another HTTP version, a
        transfer coding not undone): say why at once, send FIN, and
        close after REFUSAL_LINGER_S, dropping what still comes."""
        self._buf.clear()
        self.refused = True
        error = EDGE_ERRORS[refusal.status]
        self._reject(refusal.status, error.code.encode(), error.message.encode(),
                     reason=refusal.reason, linger=True)

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

    def _wake_writer(self) -> None:
        callback, self.on_drain = self.on_drain, None
        if callback is not None:
            callback()

    def close(self) -> None:
        self.connections.open.discard(self)
        if self.transport is not None and not self.lost:
            self.transport.close()
