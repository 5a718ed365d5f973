"""One request on a front connection, answered with raw HTTP/1.1 bytes encoded by
wire/response_encoder.py: a whole answer in one `transport.write`, a stream as chunked pieces
(its head rides with the first piece).

Where `holds_last` (a node's worker, whose records go to the node's accounting child at once),
the answer's last write (a whole answer, or a stream's end) is held until `flush`, which the
connection calls once the request's record has gone (`after_records`): a process killed at
any instant has either not answered the request or already handed its record to the
kernel. Elsewhere it goes out at once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from wire.request_head import RequestHead
from wire.response_encoder import LAST_CHUNK, chunk, encode_response, encode_stream_head


class Connection(Protocol):
    """What an exchange needs of its client connection (gateway/front/protocol.py)."""

    lost: bool  # the client is gone
    write_paused: bool  # the socket's buffer is full
    on_drain: Callable[[], None] | None  # called once when it empties, or the client is gone

    def send(self, data: bytes) -> None: ...


class FrontExchange:
    """A `wire.exchange.ServerExchange` over a front connection."""

    __slots__ = ("_body", "_conn", "_final", "_head", "_pending_head", "content_length",
                 "finished", "holds_last", "path", "started")

    def __init__(self, conn: Connection, head: RequestHead, body: bytes, holds_last: bool):
        self._conn = conn
        self._head = head
        self._body = body
        self.path = head.path
        self.content_length: int | None = head.content_length
        self.started = False
        self.finished = False
        self._pending_head = b""
        self._final = b""  # the answer's last write, held until `flush`
        self.holds_last = holds_last

    def header(self, name: str) -> str | None:
        value = self._head.headers.get(name.encode())
        return None if value is None else value.decode("latin-1")

    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]:
        return self._head.raw_headers

    async def read_body(self, limit: int) -> bytes:
        return self._body  # the head parser handed over anything beyond the limit

    def reply(self, status: int, body: bytes, content_type: str,
              headers: Mapping[str, str]) -> None:
        if self.started:
            if self.finished:
                return
            if not self._pending_head:
                # a stream already went out (a request deadline cut it): the error is its last
                # event, and the stream ends properly, as a stall's does
                self.finished = True
                self._last(chunk(b"data: " + body + b"\n\n") + LAST_CHUNK)
                return
            # the stream's head is still held back: nothing went out, answer plainly
            self._pending_head = b""
        self.started = self.finished = True
        self._last(encode_response(status, body, content_type, headers, self._head.keep_alive))

    async def start_stream(self, headers: Mapping[str, str]) -> None:
        # sent with the first piece: one write instead of two, and the client learns nothing
        # from a head alone
        self.started = True
        self._pending_head = encode_stream_head(headers, self._head.keep_alive)

    def write_now(self, data: bytes) -> bool:
        conn = self._conn
        if conn.lost:
            return False
        frame = chunk(data)
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
        frame = chunk(last) + LAST_CHUNK if last else LAST_CHUNK
        head, self._pending_head = self._pending_head, b""
        self._last(head + frame)

    def _last(self, data: bytes) -> None:
        if self.holds_last:
            self._final = data
        else:
            self._conn.send(data)

    def flush(self) -> None:
        """Send the answer's last write (after the request's record went out)."""
        final, self._final = self._final, b""
        if final:
            self._conn.send(final)
