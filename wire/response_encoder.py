"""Encoding an HTTP/1.1 server's response (pure but for the clock the Date header reads): a
whole answer in one piece, and an event stream as a head plus chunked pieces. The gateway's
front and the load generator's self-test engine answer through it.

The head is the status line, the fixed lines the caller passes (Content-Type and
Content-Length, or the event stream's), `Date`, the caller's headers in order, then
`Connection: close` when the connection ends after this response. Header text is written as
latin-1, as HTTP/1.1 defines it, and not checked for CR or LF: the values come from the
caller, or from a request head parsed by `wire.request_head`, which has none.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Final

STATUS_LINES: Final = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode()
                       for s in HTTPStatus}
EVENT_STREAM_LINES: Final = (b"Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                             b"Transfer-Encoding: chunked\r\n")
LAST_CHUNK: Final = b"0\r\n\r\n"
_CLOSE = b"Connection: close\r\n"


def chunk(data: bytes) -> bytes:
    """One piece in chunked transfer coding."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class DateLine:
    """`Date: ...\\r\\n` for now, formatted once a second."""

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


date_line: Final = DateLine()  # a cache of one line per process, not state


def head_parts(status: int, fixed: bytes, headers: Mapping[str, str], keep_alive: bool
               ) -> list[bytes]:
    """The head's pieces, ending with its blank line; the caller joins them with what goes out
    in the same write."""
    parts = [STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode(), fixed,
             date_line()]
    for name, value in headers.items():
        parts.append(f"{name}: {value}\r\n".encode("latin-1"))
    if not keep_alive:
        parts.append(_CLOSE)
    parts.append(b"\r\n")
    return parts


def encode_response(status: int, body: bytes, content_type: str,
                    headers: Mapping[str, str], keep_alive: bool) -> bytes:
    """A whole answer, head and body, for one `transport.write`."""
    parts = head_parts(status, f"Content-Type: {content_type}\r\nContent-Length: "
                               f"{len(body)}\r\n".encode(), headers, keep_alive)
    parts.append(body)
    return b"".join(parts)


def encode_stream_head(headers: Mapping[str, str], keep_alive: bool) -> bytes:
    """The head of a 200 event stream; its body follows as `chunk`s and ends with
    LAST_CHUNK."""
    return b"".join(head_parts(200, EVENT_STREAM_LINES, headers, keep_alive))
