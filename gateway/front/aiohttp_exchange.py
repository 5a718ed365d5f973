"""A completion request that aiohttp serves (a connection the front handed over: chunked
uploads, HTTP/1.0, oversized bodies), as a `wire.exchange.ServerExchange`.

aiohttp writes only from a coroutine, so `write_now` starts one write task and reports the
exchange paused until it is done: the relay stops the engine meanwhile and resumes it from
`when_drained`, one write in flight at a time, as the lean front does when its socket is full.
This path carries little of the traffic; the front serves the completion routes itself.

A whole answer aiohttp writes once the handler returns; where `holds_last`, as on the front,
the handler first waits for the request's record to leave the process, and a stream's end
waits for `finish` too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from aiohttp import web

from core.errors import PayloadTooLargeError, RequestTimeoutError


class AiohttpExchange:
    """An aiohttp request; `response` is what the handler returns."""

    __slots__ = ("_body_deadline_s", "_ended", "_lost", "_on_drain", "_request", "_tail",
                 "_writing", "content_length", "holds_last", "path", "response")

    def __init__(self, request: web.Request, body_deadline_s: float | None = None,
                 holds_last: bool = False):
        self._request = request
        self.holds_last = holds_last
        self.path = request.path
        self.content_length = request.content_length
        self.response: web.StreamResponse | None = None
        self._body_deadline_s = body_deadline_s  # the whole body must come within this
        self._writing: asyncio.Task[None] | None = None  # the write in flight
        self._on_drain: Callable[[], None] | None = None
        self._lost = False
        self._ended = False  # the stream's end is decided (held in `_tail` for `finish`)
        self._tail: bytes | None = None  # the stream's last piece, written by `finish`

    def header(self, name: str) -> str | None:
        return self._request.headers.get(name)

    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]:
        return self._request.raw_headers

    async def read_body(self, limit: int) -> bytes:
        if self.content_length is not None and self.content_length > limit:
            raise PayloadTooLargeError(f"request body exceeds {limit} bytes")
        try:
            async with asyncio.timeout(self._body_deadline_s):
                return await self._request.read()
        except web.HTTPRequestEntityTooLarge:
            raise PayloadTooLargeError(f"request body exceeds {limit} bytes") from None
        except TimeoutError:
            raise RequestTimeoutError("the request body did not arrive in time "
                                      "(listen.body_timeout_s)") from None

    def reply(self, status: int, body: bytes, content_type: str,
              headers: Mapping[str, str]) -> None:
        if self.response is not None and self.response.prepared:
            # a stream already began (a request deadline cut it): the error is its last
            # event, written by `finish` (aiohttp writes only from a coroutine)
            if not self._ended:
                self._ended = True
                self._tail = b"data: " + body + b"\n\n"
            return
        self.response = web.Response(status=status, body=body, content_type=content_type,
                                     headers=headers)
        if status == 408:  # the rest of the body may still be coming: end the connection
            self.response.force_close()

    async def start_stream(self, headers: Mapping[str, str]) -> None:
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers})
        self.response = response
        await response.prepare(self._request)

    # --- the relay's contract: write from a callback, paused while a write is in flight ----

    @property
    def client_gone(self) -> bool:
        transport = self._request.transport
        return self._lost or transport is None or transport.is_closing()

    def write_now(self, data: bytes) -> bool:
        if self.client_gone:
            return False
        task = asyncio.get_running_loop().create_task(self._write(data, self._writing))
        self._writing = task
        task.add_done_callback(self._written)
        return True

    @property
    def write_paused(self) -> bool:
        return self._writing is not None

    def when_drained(self, callback: Callable[[], None]) -> None:
        if self._writing is None:
            callback()
        else:
            self._on_drain = callback

    async def finish(self) -> None:
        """Write what waits for the end: a stream's end held since `end_stream`, or the error
        that cut a stream after it began, as its last event (as a stall's ends); nothing for
        a whole answer."""
        tail, self._tail = self._tail, None
        if tail is not None:
            await self._end(tail)

    async def end_stream(self, last: bytes = b"") -> None:
        self._ended = True
        if self.holds_last:
            self._tail = last
        else:
            await self._end(last)

    async def _end(self, last: bytes) -> None:
        assert self.response is not None
        if self._writing is not None:
            await self._writing
        if self._lost:
            return
        try:
            await self.response.write_eof(last)
        except ConnectionError:
            pass

    async def _write(self, data: bytes, before: asyncio.Task[None] | None) -> None:
        if before is not None:  # a caller that wrote on past `write_paused`: keep the order
            await before
        assert self.response is not None
        try:
            await self.response.write(data)
        except ConnectionError:
            self._lost = True

    def _written(self, task: asyncio.Task[None]) -> None:
        if self._writing is not task:
            return  # a later write is in flight; its own completion wakes the relay
        self._writing = None
        callback, self._on_drain = self._on_drain, None
        if callback is not None:
            callback()
