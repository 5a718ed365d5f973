"""One request on a front connection, answered with raw HTTP/1.1 bytes: a whole answer in one
`transport.write`, a stream as chunked pieces (its head rides with the first piece)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol

from wire.request_head import RequestHead

STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}
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


date_header = _DateHeader()


class Connection(Protocol):
    """What an exchange needs of its client connection (gateway/front/protocol.py)."""

    lost: bool  # the client is gone
    write_paused: bool  # the socket's buffer is full
    on_drain: Callable[[], None] | None  # called once when it empties, or the client is gone

    def send(self, data: bytes) -> None: ...


class FrontExchange:
    """A `wire.exchange.ServerExchange` over a front connection."""

    __slots__ = ("_body", "_conn", "_head", "_pending_head", "content_length", "finished",
                 "path", "started")

    def __init__(self, conn: Connection, head: RequestHead, body: bytes):
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
        parts = [STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode(), fixed,
                 date_header()]
        for name, value in headers.items():
            parts.append(f"{name}: {value}\r\n".encode("latin-1"))
        if not self._head.keep_alive:
            parts.append(b"Connection: close\r\n")
        parts.append(b"\r\n")
        return parts

    def reply(self, status: int, body: bytes, content_type: str,
              headers: Mapping[str, str]) -> None:
        if self.started:
            if self.finished:
                return
            if not self._pending_head:
                # a stream already went out (a request deadline cut it): the error is its last
                # event, and the stream ends properly, as a stall's does
                self.finished = True
                self._conn.send(_chunk(b"data: " + body + b"\n\n") + _END)
                return
            # the stream's head is still held back: nothing went out, answer plainly
            self._pending_head = b""
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

    def write_now(self, data: bytes) -> bool:
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
        return self._conn.write_paused

    @property
    def client_gone(self) -> bool:
        return self._conn.lost

    def when_drained(self, callback: Callable[[], None]) -> None:
        conn = self._conn
        if conn.lost or not conn.write_paused:
            callback()
        else:
            conn.on_drain = callback

    async def end_stream(self, last: bytes = b"") -> None:
        self.finished = True
        frame = _chunk(last) + _END if last else _END
        self._conn.send(self._pending_head + frame)
        self._pending_head = b""
