"""Keep-alive connections to one origin: bounded, reused only after a complete response, closed
after sitting idle."""

from __future__ import annotations

import asyncio
import collections
import ssl

from wire.connection import UpstreamConnection
from wire.errors import UpstreamConnectError
from wire.request import Origin


class EndpointPool:
    """Connections to one origin. At most `limit` are open; further acquirers wait in order.

    Idle connections are kept newest-last and reused newest first (warm); one sweep timer per
    pool closes those idle for `idle_s` or longer.
    """

    def __init__(self, origin: Origin, *, limit: int, idle_s: float, connect_s: float,
                 loop: asyncio.AbstractEventLoop, ssl_context: ssl.SSLContext | None = None):
        self.origin = origin
        self.limit = limit
        self.idle_s = idle_s
        self.connect_s = connect_s
        self._loop = loop
        self._ssl = ssl_context if origin.tls else None
        self._idle: list[UpstreamConnection] = []
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self.open = 0  # connections open, idle or in use
        self.connects = 0  # connections ever opened
        self.closed = False

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def acquire(self) -> UpstreamConnection:
        """A connection for one request: a live idle one, else a new one within the limit."""
        while True:
            conn = self.pop_idle()
            if conn is not None:
                return conn
            if self.open < self.limit:
                break
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif not waiter.cancelled():
                    self._wake_one()  # pass the slot we were given on to the next waiter
                raise
        self.open += 1
        try:
            conn = await self._connect()
        except BaseException:
            self.open -= 1
            self._wake_one()
            raise
        self.connects += 1
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        """Take a connection back: kept if its response completed, else closed."""
        if conn.complete and not self.closed:
            conn.reset(self._loop.time())
            self._idle.append(conn)
            if self._sweeper is None:
                self._sweeper = self._loop.call_later(self.idle_s, self._sweep)
        else:
            conn.abort()
            self.open -= 1
        self._wake_one()

    def drop_idle(self) -> None:
        """Close every idle connection (after one turned out stale, the others likely are)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.abort()
        self.open -= len(idle)

    def close(self) -> None:
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self.drop_idle()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(UpstreamConnectError("the upstream client is closed"))
        self._waiters.clear()

    # --- internals --------------------------------------------------------------------------

    def pop_idle(self) -> UpstreamConnection | None:
        """A live idle connection, None when there is none (`acquire` then waits or
        connects): the usual case costs no coroutine."""
        idle = self._idle
        if not idle:
            return None
        oldest_ok = self._loop.time() - self.idle_s
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.idle_since > oldest_ok:
                return conn
            conn.abort()
            self.open -= 1
        return None

    async def _connect(self) -> UpstreamConnection:
        if self.closed:
            raise UpstreamConnectError("the upstream client is closed")
        origin = self.origin
        loop = self._loop
        try:
            async with asyncio.timeout(self.connect_s):
                _, conn = await loop.create_connection(
                    lambda: UpstreamConnection(loop), origin.host, origin.port, ssl=self._ssl,
                    server_hostname=origin.host if self._ssl is not None else None)
        except (OSError, TimeoutError) as exc:
            raise UpstreamConnectError(
                f"cannot connect to {origin.host}:{origin.port}: {type(exc).__name__}") from exc
        return conn

    def _wake_one(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _sweep(self) -> None:
        self._sweeper = None
        oldest_ok = self._loop.time() - self.idle_s
        keep = []
        for conn in self._idle:
            if conn.closed or conn.idle_since <= oldest_ok:
                conn.abort()
                self.open -= 1
            else:
                keep.append(conn)
        self._idle = keep
        if keep:
            due = min(c.idle_since for c in keep) + self.idle_s
            self._sweeper = self._loop.call_at(due, self._sweep)
        if self._waiters:
            self._wake_one()
