"""The two ends a relay joins, as Protocols: the client's request being served, and the
response coming back from the server the request went on to.

Both sides are push-style with back-pressure, so one relay serves every server at the speed of
the fastest: the response hands body pieces to a callback as they arrive (`stream_to`), the
relay writes each piece to the client at once (`write_now`), and when the client's socket is
full (`write_paused`) it pauses the response and resumes it from `when_drained`. No task wakes
up per piece on a server that can write from a callback; one that cannot (aiohttp) keeps the
same contract by reporting itself paused while its own write is in flight.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from wire.response import ResponseHead

BodySink = Callable[[bytes, bool], None]  # (body piece, the response ended with it)


class ServerExchange(Protocol):
    """One client request and its answer, whichever HTTP server carried it."""

    path: str
    content_length: int | None

    def header(self, name: str) -> str | None:
        """A request header by lower-case name."""

    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]:
        """The request headers as sent."""

    async def read_body(self, limit: int) -> bytes:
        """The whole request body; the server's own error beyond `limit` bytes."""

    # True where the server holds the answer's last write (a whole answer, the stream's end)
    # until the request's record is out of the process: the relay then keeps a stream's
    # `[DONE]` for that last write
    holds_last: bool

    def reply(self, status: int, body: bytes, content_type: str,
              headers: Mapping[str, str]) -> None:
        """Answer in one piece (ignored once a stream has started); held where `holds_last`
        until the request's handling is over (its record sent first)."""

    async def start_stream(self, headers: Mapping[str, str]) -> None:
        """Begin a 200 event-stream answer; the body follows in `write_now` calls."""

    def write_now(self, data: bytes) -> bool:
        """Hand a piece of the stream to the client now, from a plain callback; False once the
        client has gone away. After it the caller checks `write_paused`."""

    @property
    def write_paused(self) -> bool:
        """The client takes data slower than it is written: stop the source until
        `when_drained` calls back."""

    @property
    def client_gone(self) -> bool:
        """The client's connection is lost; nothing written reaches it."""

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the client takes data again, or is gone (at once if neither
        applies)."""

    async def end_stream(self, last: bytes = b"") -> None:
        """Send `last` (if any) after every piece written, and end the stream, in one write
        where the server can (the client may already be gone); held as `reply`'s is."""


class UpstreamBody(Protocol):
    """A response whose head has arrived, as a relay reads its body."""

    @property
    def status(self) -> int: ...

    @property
    def content_type(self) -> str: ...

    @property
    def head(self) -> ResponseHead: ...

    async def read_all(self) -> bytes:
        """The whole body (for answers relayed in one piece)."""

    def whole(self) -> bytes | None:
        """The whole body when all of it has arrived and none was read, without a wait; None
        otherwise (then `read_all`)."""

    def stream_to(self, sink: BodySink) -> None:
        """From now on hand body pieces to `sink(piece, at_end)` as they arrive."""

    def finished(self) -> Awaitable[None]:
        """Wait until the body streaming to the sink has ended; raises its failure."""

    def pause(self) -> None:
        """Stop reading while the client catches up (no stall timeout runs meanwhile)."""

    def resume(self) -> None: ...

    def abort(self) -> None:
        """Drop the connection now: the server sees the request cancelled."""
