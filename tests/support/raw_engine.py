"""A scripted HTTP/1.1 server on 127.0.0.1 for client-side tests: it reads each request
(Content-Length body), then a script writes whatever bytes the test needs, well-formed or not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

# per request: (writer, request number on the whole server, request number on its connection)
# -> True to keep the connection open for another request
Script = Callable[[asyncio.StreamWriter, int, int], Awaitable[bool]]


class RawEngine:
    """A scripted HTTP/1.1 server: reads each request (Content-Length body), then runs `script`."""

    def __init__(self, script: Script):
        self.script = script
        self.port = 0
        self.connections = 0
        self.open_now = 0
        self.most_open = 0
        self.requests: list[bytes] = []
        self.peer_closed = 0  # connections the client closed (EOF or reset)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        on_conn = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                on_conn += 1
                if not await self.script(writer, len(self.requests), on_conn):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.peer_closed += 1
        finally:
            self.open_now -= 1
            writer.close()


@asynccontextmanager
async def raw_engine(script: Script) -> AsyncIterator[RawEngine]:
    engine = RawEngine(script)
    server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
    engine.port = server.sockets[0].getsockname()[1]
    try:
        yield engine
    finally:
        server.close()
