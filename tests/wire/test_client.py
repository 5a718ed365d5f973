"""The pooled client (wire.client) against scripted raw HTTP servers on 127.0.0.1: connection
reuse, limits, idle expiry, error kinds, back-pressure, aborts, and requests encoded ahead."""
from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from tests.support.procs import free_port
from tests.support.raw_engine import RawEngine, raw_engine
from wire.client import ClientSettings, UpstreamClient
from wire.connection import HIGH_WATER_BYTES
from wire.errors import (
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamHeadTimeout,
    UpstreamProtocolError,
    UpstreamReadTimeout,
)

pytestmark = pytest.mark.timeout(30)

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
@asynccontextmanager
async def client(**settings: float) -> AsyncIterator[UpstreamClient]:
    c = UpstreamClient(ClientSettings(**settings))  # type: ignore[arg-type]
    try:
        yield c
    finally:
        c.close()
        await asyncio.sleep(0)  # let the transports finish closing


async def ok(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
    writer.write(OK)
    return True


async def get(c: UpstreamClient, engine: RawEngine) -> bytes:
    r = await c.post(f"http://127.0.0.1:{engine.port}", "/v1/completions", b"{}", [])
    try:
        return await r.read_all()
    finally:
        r.close()


async def eventually(check: Callable[[], bool], timeout_s: float = 3.0) -> bool:
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_connection_is_reused_after_a_complete_response() -> None:
    async with raw_engine(ok) as eng, client() as c:
        bodies = [await get(c, eng) for _ in range(3)]
        pool = c.pool(f"http://127.0.0.1:{eng.port}")
        assert bodies == [b"{}"] * 3
        assert eng.connections == 1 and pool.connects == 1 and pool.idle == 1


async def test_no_reuse_after_an_incomplete_response() -> None:
    """A response the caller stopped reading is dropped: the engine sees the close, the next
    request gets a new connection."""
    async def partial(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")
            return True
        return await ok(writer, n, on_conn)

    async with raw_engine(partial) as eng, client() as c:
        r = await c.post(f"http://127.0.0.1:{eng.port}", "/", b"", [])
        assert await r.read() == b"12345"
        r.close()
        assert await get(c, eng) == b"{}"
        assert eng.connections == 2
        assert await eventually(lambda: eng.peer_closed == 1)


async def test_connection_close_response_is_not_reused() -> None:
    async def closing(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi")
        return True  # the server would even keep it; the client must not

    async with raw_engine(closing) as eng, client() as c:
        assert [await get(c, eng) for _ in range(2)] == [b"hi", b"hi"]
        assert eng.connections == 2


async def test_idle_connections_expire() -> None:
    async with raw_engine(ok) as eng, client(idle_s=0.2) as c:
        await get(c, eng)
        pool = c.pool(f"http://127.0.0.1:{eng.port}")
        assert pool.idle == 1
        assert await eventually(lambda: eng.peer_closed == 1)  # the sweep closed it
        assert pool.idle == 0 and pool.open == 0
        await get(c, eng)
        assert eng.connections == 2


async def test_open_connections_are_bounded_and_waiters_get_served() -> None:
    async def slow(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        await asyncio.sleep(0.05)
        writer.write(OK)
        return True

    async with raw_engine(slow) as eng, client(max_connections=2) as c:
        bodies = await asyncio.gather(*(get(c, eng) for _ in range(6)))
        assert bodies == [b"{}"] * 6
        assert eng.most_open == 2 and eng.connections == 2


async def test_stale_pooled_connection_is_retried_once_on_a_new_one() -> None:
    """The engine closed a kept-alive connection just as it was reused: the request goes out
    again on a fresh connection instead of failing."""
    async def close_second(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        if on_conn == 2:
            return False  # closes without answering
        return await ok(writer, n, on_conn)

    async with raw_engine(close_second) as eng, client() as c:
        assert await get(c, eng) == b"{}"
        assert await get(c, eng) == b"{}"
        assert eng.connections == 2 and len(eng.requests) == 3


async def test_connect_failure_and_close_before_answer_are_told_apart() -> None:
    async def hang_up(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        return False

    async with client(connect_s=1) as c:
        with pytest.raises(UpstreamConnectError):
            await c.post(f"http://127.0.0.1:{free_port()}", "/", b"", [])
        async with raw_engine(hang_up) as eng:
            with pytest.raises(UpstreamClosedError):
                await c.post(f"http://127.0.0.1:{eng.port}", "/", b"", [])


async def test_head_timeout_and_read_stall_raise_their_own_errors() -> None:
    async def stall(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        if n == 1:
            await asyncio.sleep(2)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await asyncio.sleep(2)
        return False

    async with raw_engine(stall) as eng, client(first_byte_s=0.3, read_s=0.2) as c:
        url = f"http://127.0.0.1:{eng.port}"
        start = time.monotonic()
        with pytest.raises(UpstreamHeadTimeout):
            await c.post(url, "/", b"", [])
        assert 0.25 <= time.monotonic() - start < 1.5
        r = await c.post(url, "/", b"", [])
        try:
            assert await r.read() == b"abc"
            start = time.monotonic()
            with pytest.raises(UpstreamReadTimeout):
                await r.read()
            assert 0.15 <= time.monotonic() - start < 1.5
        finally:
            r.close()


async def test_connection_lost_mid_body_and_malformed_head() -> None:
    async def broken(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        else:
            writer.write(b"HTTP/1.1 OK\r\n\r\n")
        return False

    async with raw_engine(broken) as eng, client() as c:
        url = f"http://127.0.0.1:{eng.port}"
        r = await c.post(url, "/", b"", [])
        try:
            with pytest.raises(UpstreamClosedError):
                await r.read_all()
        finally:
            r.close()
        with pytest.raises(UpstreamProtocolError):
            await c.post(url, "/", b"", [])


async def test_slow_reader_pauses_the_engine_socket_without_unbounded_buffering() -> None:
    total = 16 * 1024 * 1024
    sent = []

    async def flood(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        piece = b"x" * 65536
        for _ in range(total // len(piece)):
            writer.write(piece)
            await writer.drain()
            sent.append(len(piece))
        return True

    async with raw_engine(flood) as eng, client() as c:
        r = await c.post(f"http://127.0.0.1:{eng.port}", "/", b"", [])
        try:
            await asyncio.sleep(0.5)  # the caller reads nothing for a while
            conn = r._conn
            assert conn._paused
            assert conn._buffered <= HIGH_WATER_BYTES + 1024 * 1024  # one socket read past it
            assert sum(sent) < total  # the engine is held back, not buffered in full here
            received = 0
            while data := await r.read():
                received += len(data)
            assert received == total
        finally:
            r.close()


async def test_abort_mid_stream_closes_the_engine_connection() -> None:
    async def endless(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"5\r\nhello\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)

    async with raw_engine(endless) as eng, client() as c:
        r = await c.post(f"http://127.0.0.1:{eng.port}", "/", b"", [])
        assert (await r.read()).startswith(b"hello")
        r.abort()
        r.close()
        assert await eventually(lambda: eng.peer_closed == 1)
        assert c.pool(f"http://127.0.0.1:{eng.port}").open == 0


async def test_deadlines_hold_on_a_reused_connection() -> None:
    """The per-connection timer carries over between requests: a stall on the third request of
    a kept-alive connection is still caught at the read timeout."""
    async def third_stalls(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        if on_conn < 3:
            writer.write(OK)
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n")
        await asyncio.sleep(3)
        return False

    async with raw_engine(third_stalls) as eng, client(first_byte_s=5, read_s=0.3) as c:
        url = f"http://127.0.0.1:{eng.port}"
        assert [await get(c, eng) for _ in range(2)] == [b"{}", b"{}"]
        await asyncio.sleep(0.2)
        r = await c.post(url, "/", b"", [])
        try:
            assert await r.read() == b"hi"
            start = time.monotonic()
            with pytest.raises(UpstreamReadTimeout):
                await r.read()
            assert 0.25 <= time.monotonic() - start < 1.5
        finally:
            r.close()
        assert eng.connections == 1


def collect(into: list[tuple[bytes, bool]], data: bytes, at_end: bool) -> None:
    into.append((data, at_end))


async def test_a_request_encoded_ahead_streams_to_a_callback_and_reuses_its_connection() -> None:
    """The load client's path: `encode_post` before the clock, then `send`, each read handed to
    a callback (chunked, split across writes), the connection back in the pool after."""
    async def chunks(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                     b"x-wattgate-request-id: r%d\r\n\r\n5\r\nhel" % n)
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"lo\r\n0\r\n\r\n")
        return True

    async with raw_engine(chunks) as eng, client() as c:
        base = f"http://127.0.0.1:{eng.port}/base"
        request = c.encode_post(base, "/v1/completions", b"{}", [("x-a", "1")])
        for n in (1, 2):
            got: list[tuple[bytes, bool]] = []
            r = await c.send(base, request)
            assert r.head.header(b"x-wattgate-request-id") == b"r%d" % n
            r.stream_to(functools.partial(collect, got))
            await r.finished()
            r.close()
            assert b"".join(d for d, _ in got) == b"hello" and got[-1][1]
        assert eng.requests[0].startswith(b"POST /base/v1/completions HTTP/1.1\r\n")
        assert eng.connections == 1


async def test_whole_takes_a_body_that_came_with_its_head_and_waits_for_none() -> None:
    """`whole` hands over a body that arrived in full with its head, with no wait, and the
    connection goes back to the pool; for a body still arriving it gives None, consumes
    nothing, and `read_all` waits for the rest."""
    rest = asyncio.Event()

    async def script(writer: asyncio.StreamWriter, n: int, on_conn: int) -> bool:
        if n == 1:
            writer.write(OK)  # head and body in one write: one read on loopback
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
        await writer.drain()
        await rest.wait()
        writer.write(b"cd")
        return True

    async with raw_engine(script) as eng, client() as c:
        url = f"http://127.0.0.1:{eng.port}"
        r = await c.post(url, "/", b"", [])
        assert r.whole() == b"{}"
        r.close()
        assert c.pool(url).idle == 1
        r = await c.post(url, "/", b"", [])
        assert r.whole() is None  # the head came, the body has not ended
        rest.set()
        assert await r.read_all() == b"abcd"
        r.close()
        assert eng.connections == 1
