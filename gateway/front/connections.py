"""The open client connections of one listener, and the guard on those handed to aiohttp.

The edge's deadlines (a late head or body, an idle keep-alive) and the connection cap hold for
every connection, whichever protocol serves it; shutdown closes them all.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

from gateway.front.settings import FrontSettings
from wire.response_encoder import encode_response


class FrontConnection(Protocol):
    """What the bookkeeping needs of a front connection (gateway/front/protocol.py)."""

    task: asyncio.Task[None] | None  # the request being served
    last_active: float

    def reading(self) -> bool: ...

    def expire(self, now: float) -> int: ...

    def close(self) -> None: ...


class FrontConnections:
    """The open client connections of one listener (the front's and those handed to aiohttp),
    for the edge's deadlines, the connection cap and shutdown."""

    def __init__(self) -> None:
        self.open: set[FrontConnection] = set()
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
            self.transport.write(encode_response(408, _TIMEOUT_BODY, "application/json", {},
                                                 keep_alive=False))
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
