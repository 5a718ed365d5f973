"""The front holds an answer's last write until `after_records` calls back (a node worker's
records reach its accounting child first): on a real socket, a whole answer and a stream's
end wait for it, the stream's earlier pieces do not, and the connection serves its next
request only after that."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from gateway.front.connections import FrontConnections
from gateway.front.protocol import FrontProtocol
from gateway.front.settings import FrontSettings
from tests.gateway.test_front import read_response, request
from wire.exchange import ServerExchange

pytestmark = pytest.mark.timeout(30)


async def _serve(exchange: ServerExchange) -> None:
    if b'"stream":true' in await exchange.read_body(1 << 20):
        await exchange.start_stream({"x-kind": "stream"})
        exchange.write_now(b"data: first\n\n")
        await exchange.end_stream(b"data: [DONE]\n\n")
    else:
        exchange.reply(200, b'{"ok":true}', "application/json", {})


async def _nothing_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        await asyncio.wait_for(reader.read(1), seconds)
    except TimeoutError:
        return True
    return False


async def test_the_last_write_waits_for_after_records() -> None:
    held: list[Callable[[], None]] = []
    settings = FrontSettings(serve=_serve, handoff=asyncio.Protocol,
                             routes=("/v1/completions",), max_body_bytes=1 << 20,
                             after_records=held.append)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FrontProtocol(settings, FrontConnections()),
                                      "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request())
        await asyncio.sleep(0.2)
        assert len(held) == 1
        assert await _nothing_within(reader, 0.2)  # the whole answer is held
        held.pop()()
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b'{"ok":true}')

        writer.write(request(stream=True))
        head = await asyncio.wait_for(reader.readuntil(b"data: first\n\n\r\n"), 5)
        assert b"x-kind: stream" in head  # the stream's pieces are not held
        assert len(held) == 1
        assert await _nothing_within(reader, 0.2)  # its end is
        writer.write(request())  # the next request waits for the held end too
        await asyncio.sleep(0.2)
        assert len(held) == 1
        held.pop()()
        end = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
        assert end.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
        await asyncio.sleep(0.1)
        assert len(held) == 1
        held.pop()()
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b'{"ok":true}')
    finally:
        writer.close()
        server.close()
        await server.wait_closed()
