"""One client request/response as the proxy sees it, whichever HTTP server carried it.

The proxy reads a few headers and the body, then either answers in one piece (`reply`) or
streams (`start_stream`, `write`, `end_stream`). Two servers implement it: the lean front
(gateway/front) for the completion routes, and aiohttp (`AiohttpExchange`) for everything the
front hands over (other routes, chunked uploads, HTTP/1.0, oversized bodies).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

from aiohttp import web

from gateway.errors import PayloadTooLargeError, RequestTimeoutError


class Exchange(Protocol):
    path: str
    content_length: int | None

    def header(self, name: str) -> str | None:
        """A request header by lower-case name."""

    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]:
        """The request headers as sent (for the `x-*` pass-through)."""

    async def read_body(self, limit: int) -> bytes:
        """The whole request body; PayloadTooLargeError beyond `limit` bytes."""

    def reply(self, status: int, body: bytes, content_type: str,
              headers: Mapping[str, str]) -> None:
        """Answer in one piece (ignored once a stream has started)."""

    async def start_stream(self, headers: Mapping[str, str]) -> None:
        """Send a 200 event-stream head; the body follows in `write` calls."""

    async def write(self, data: bytes) -> bool:
        """Send a piece of the stream; False once the client has gone away."""

    async def end_stream(self, last: bytes = b"") -> None:
        """Send `last` (if any) and end the stream, in one write where the server can (the
        client may already be gone)."""


class AiohttpExchange:
    """An aiohttp request; `response` is what the handler returns."""

    __slots__ = ("_body_deadline_s", "_request", "content_length", "path", "response")

    def __init__(self, request: web.Request, body_deadline_s: float | None = None):
        self._request = request
        self.path = request.path
        self.content_length = request.content_length
        self.response: web.StreamResponse | None = None
        self._body_deadline_s = body_deadline_s  # the whole body must come within this

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
            return  # a stream already began; it ends as it is
        self.response = web.Response(status=status, body=body, content_type=content_type,
                                     headers=headers)
        if status == 408:  # the rest of the body may still be coming: end the connection
            self.response.force_close()

    async def start_stream(self, headers: Mapping[str, str]) -> None:
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers})
        self.response = response
        await response.prepare(self._request)

    async def write(self, data: bytes) -> bool:
        assert self.response is not None
        try:
            await self.response.write(data)
        except ConnectionError:
            return False
        return True

    async def end_stream(self, last: bytes = b"") -> None:
        assert self.response is not None
        try:
            await self.response.write_eof(last)
        except ConnectionError:
            pass
