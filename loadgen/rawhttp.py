"""A lean HTTP/1.1 keep-alive client for plain-http targets: the load client's fast transport.

aiohttp costs ~150-300 us of CPU per streamed request (request object, header merging, a
coroutine resume per read), which caps one process near 1000 req/s with schedule lag already in
the milliseconds. This transport writes a request prepared before the run in one `write`, and
parses the response inside `data_received`: each read is timestamped and handed to the
request's sink synchronously, with no task switch per read. Responses may be chunked,
Content-Length or close-delimited. TCP_NODELAY is set on every socket.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit


class HttpError(Exception):
    """The connection failed or the response could not be parsed."""


Sink = Callable[[bytes], None]  # called once per read with that read's de-chunked body bytes


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.future: asyncio.Future[None] | None = None
        self.sink: Sink | None = None
        self.status = 0
        self.request_id = ""
        self.head_done = False
        self.chunked = False
        self.remaining = -1  # Content-Length bytes left; -1: not length-delimited
        self.chunk_left = 0  # bytes left in the current chunk (+2 for its CRLF once started)
        self.keep_alive = True
        self.closed = False
        self.rid_header = b""

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        fut = self.future
        if fut is not None and not fut.done():
            if self.head_done and not self.chunked and self.remaining < 0:
                fut.set_result(None)  # close-delimited body: the close is its end
            else:
                fut.set_exception(HttpError(f"connection lost: {exc!r}"))

    def request(self, wire: bytes, sink: Sink, request_id_header: bytes
                ) -> asyncio.Future[None]:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.future = loop.create_future()
        self.sink = sink
        self.rid_header = request_id_header
        self.buf = b""
        self.status = 0
        self.request_id = ""
        self.head_done = False
        self.chunked = False
        self.remaining = -1
        self.chunk_left = 0
        self.transport.write(wire)
        return self.future

    def data_received(self, data: bytes) -> None:
        try:
            self._feed(data)
        except (ValueError, IndexError) as exc:
            # A malformed response fails its request and retires the connection.
            self.keep_alive = False
            if self.future is not None and not self.future.done():
                self.future.set_exception(HttpError(f"bad response: {exc!r}"))
            if self.transport is not None:
                self.transport.close()

    def _feed(self, data: bytes) -> None:
        if not self.head_done:
            self.buf += data
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self._head(self.buf[:end])
            data, self.buf = self.buf[end + 4:], b""
            if not self.chunked and self.remaining == 0:
                self._finish()
                return
        if self.chunked:
            body = self._dechunk(data)
        elif self.remaining >= 0:
            body = data[: self.remaining]
            self.remaining -= len(body)
        else:
            body = data
        if body and self.sink is not None:
            self.sink(body)
        if (self.chunked and self.chunk_left == -1) or self.remaining == 0:
            self._finish()

    def _head(self, head: bytes) -> None:
        # A previous response's final CRLF may arrive late, ahead of this head.
        lines = head.lstrip(b"\r\n").split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        self.status = int(parts[1])
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                self.remaining = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
            elif name == b"connection" and value.lower() == b"close":
                self.keep_alive = False
            elif name == self.rid_header:
                self.request_id = value.decode("latin-1")
        self.head_done = True
        if lines[0].startswith(b"HTTP/1.0") and not self.chunked:
            self.keep_alive = False

    def _dechunk(self, data: bytes) -> bytes:
        """Body bytes of `data` (with any carried partial size line); sets chunk_left = -1 at
        the terminating zero-size chunk."""
        data = self.buf + data if self.buf else data
        self.buf = b""
        out: list[bytes] = []
        pos, n = 0, len(data)
        while pos < n:
            if self.chunk_left > 0:
                take = min(self.chunk_left, n - pos)
                out.append(data[pos: pos + take])
                pos += take
                self.chunk_left -= take
                if self.chunk_left == 0:
                    self.chunk_left = -2  # the chunk's trailing CRLF comes next
                continue
            if self.chunk_left == -2:
                if n - pos < 2:
                    self.buf = data[pos:]
                    break
                pos += 2
                self.chunk_left = 0
                continue
            if self.chunk_left == -1:
                break  # after the last chunk: ignore trailers
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                self.buf = data[pos:]
                break
            size = int(data[pos:eol].split(b";", 1)[0], 16)
            pos = eol + 2
            if size == 0:
                self.chunk_left = -1
                break
            self.chunk_left = size
        return b"".join(out)

    def _finish(self) -> None:
        fut = self.future
        self.sink = None
        if fut is not None and not fut.done():
            fut.set_result(None)


class Pool:
    """Keep-alive connections to one host:port, at most `limit` open."""

    def __init__(self, base_url: str, limit: int, connect_timeout_s: float):
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"raw transport needs an http:// URL, got {base_url!r}")
        self.host = u.hostname
        self.port = u.port or 80
        self.prefix = u.path.rstrip("/")
        self.limit = limit
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[_Conn] = []
        self.open = 0
        self._sem = asyncio.Semaphore(limit)

    @property
    def host_header(self) -> str:
        return f"{self.host}:{self.port}"

    async def acquire(self) -> _Conn:
        await self._sem.acquire()
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
            self.open -= 1
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(_Conn, self.host, self.port), self.connect_timeout_s)
        except BaseException:
            self._sem.release()
            raise
        self.open += 1
        return proto

    def release(self, conn: _Conn, reusable: bool) -> None:
        if reusable and conn.keep_alive and not conn.closed:
            self.idle.append(conn)
        else:
            conn.sink = None  # an abandoned response must not reach its request any more
            if conn.transport is not None:
                conn.transport.close()
            self.open -= 1
        self._sem.release()

    def close(self) -> None:
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        self.idle.clear()


def request_bytes(pool: Pool, path: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"POST {pool.prefix}{path} HTTP/1.1", f"Host: {pool.host_header}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
