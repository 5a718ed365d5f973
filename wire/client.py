"""The pooled HTTP/1.1 keep-alive client: one pool per origin, one request at a time per
connection. The gateway sends engine requests with it; the load generator its load.

Built on `asyncio.Protocol` (uvloop) with an incremental llhttp response parser: one
`transport.write` per request, body handed over once per socket read (or straight to a
callback, `stream_to`), one lazy timer per connection. TCP_NODELAY on every socket.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from wire.connection import UpstreamConnection
from wire.errors import UpstreamStaleConnection
from wire.pool import EndpointPool
from wire.request import Origin, encode_request
from wire.response import ResponseHead


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Timeouts in seconds and pool bounds. There is no total timeout: the caller has its own."""

    connect_s: float = 2.0
    first_byte_s: float = 60.0  # request sent -> response head
    read_s: float = 30.0  # longest silence between two reads of a body
    max_connections: int = 1024  # per engine origin
    # below uvicorn's 5 s keep-alive (vLLM, trtllm-serve), so the engine rarely closes first
    idle_s: float = 4.0


class UpstreamResponse:
    """A response whose head has arrived; the body is read with `read` / `read_all`.

    `close` must be called once: it returns the connection to the pool if the whole response
    was read, and drops it otherwise (the engine then sees the request aborted).
    """

    __slots__ = ("_conn", "_pool", "at_end", "content_type", "finished", "head", "pause", "read",
                 "resume", "status", "stream_to", "whole")

    def __init__(self, pool: EndpointPool, conn: UpstreamConnection, head: ResponseHead):
        self._pool = pool
        self._conn = conn
        self.head = head
        self.status = head.status
        self.content_type = head.content_type
        # The body bytes that arrived since the last call (waits for some); b"" at the end.
        # The connection's own method: no extra coroutine per read.
        self.read: Callable[[], Awaitable[bytes]] = conn.read
        # True once the response is complete and read: the last piece can end the client's too
        self.at_end: Callable[[], bool] = conn.at_end
        # The whole body when all of it has arrived and none was read, else None: what
        # `read_all` would return, without its coroutines
        self.whole: Callable[[], bytes | None] = conn.whole
        # Callback mode: body pieces go to a sink as they arrive (see UpstreamConnection)
        self.stream_to: Callable[[Callable[[bytes, bool], None]], None] = conn.stream_to
        self.finished: Callable[[], Awaitable[None]] = conn.finished
        self.pause: Callable[[], None] = conn.pause
        self.resume: Callable[[], None] = conn.resume

    async def read_all(self) -> bytes:
        conn = self._conn
        parts = []
        while data := await conn.read():
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def abort(self) -> None:
        """Drop the connection now, whatever was read."""
        self._conn.abort()

    def close(self) -> None:
        self._pool.release(self._conn)


class UpstreamClient:
    """HTTP/1.1 keep-alive client for a set of origins (the engines, or a load target)."""

    def __init__(self, settings: ClientSettings, *, ssl_context: ssl.SSLContext | None = None):
        self.settings = settings
        self._ssl = ssl_context
        self._pools: dict[str, EndpointPool] = {}
        self.closed = False

    def pool(self, base_url: str) -> EndpointPool:
        pool = self._pools.get(base_url)
        if pool is None:
            origin = Origin.from_url(base_url)
            s = self.settings
            context = self._ssl
            if origin.tls and context is None:
                context = self._ssl = ssl.create_default_context()
            pool = self._pools[base_url] = EndpointPool(
                origin, limit=s.max_connections, idle_s=s.idle_s, connect_s=s.connect_s,
                loop=asyncio.get_running_loop(), ssl_context=context)
        return pool

    def pools(self) -> dict[str, EndpointPool]:
        return dict(self._pools)

    def encode_post(self, base_url: str, path: str, body: bytes,
                    headers: Sequence[tuple[str, str]]) -> bytes:
        """The bytes of `POST base_url + path`, for `send` (a load client builds them before
        its clock starts)."""
        origin = (self._pools.get(base_url) or self.pool(base_url)).origin
        return encode_request("POST", origin.base_path + path, origin.host_header, headers,
                              body)

    def post(self, base_url: str, path: str, body: bytes, headers: Sequence[tuple[str, str]]
             ) -> Coroutine[Any, Any, UpstreamResponse]:
        """Send `POST base_url + path` and wait for the response head (see `send`). (`send`'s
        coroutine itself, not one awaiting it: one frame less per request.)"""
        return self.send(base_url, self.encode_post(base_url, path, body, headers))

    async def send(self, base_url: str, request: bytes) -> UpstreamResponse:
        """Send one encoded request to `base_url`'s origin and wait for the response head.

        Raises `UpstreamConnectError` (no connection), `UpstreamClosedError` (closed before
        the head), `UpstreamHeadTimeout`, `UpstreamProtocolError`. When a reused keep-alive
        connection turns out to have been closed by the server before any response byte, the
        request is sent once more on a new connection: the server never saw the first one.
        """
        pool = self._pools.get(base_url) or self.pool(base_url)
        s = self.settings
        retried = False
        while True:
            conn = pool.pop_idle()
            if conn is None:
                conn = await pool.acquire()
            try:
                conn.send(request, first_byte_s=s.first_byte_s, read_s=s.read_s)
                head = await conn.head()
            except UpstreamStaleConnection:
                pool.release(conn)
                if retried:
                    raise
                retried = True
                pool.drop_idle()
                continue
            except BaseException:
                pool.release(conn)
                raise
            return UpstreamResponse(pool, conn, head)

    def close(self) -> None:
        """Close every connection; in-flight responses see their connection dropped."""
        self.closed = True
        for pool in self._pools.values():
            pool.close()
