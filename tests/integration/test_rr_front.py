"""The replicas mode's round-robin front (tests/support/rr_front.py): connections go to the
replicas in turn, bytes pass both ways, a client's half-close reaches the replica, and a
replica's close (after its answer) reaches the client."""

from __future__ import annotations

import asyncio
import sys

import pytest

from tests.support.procs import free_port, running

pytestmark = pytest.mark.timeout(60)


async def _replica(index: int) -> asyncio.Server:
    """Reads to the client's EOF, answers `<index>:<what came>`, closes."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = await reader.read(-1)
        writer.write(f"{index}:".encode() + got)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def _ask(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    writer.write_eof()
    async with asyncio.timeout(10):
        got = await reader.read(-1)  # to the replica's close
    writer.close()
    return got


async def test_connections_go_round_robin_and_closes_pass_both_ways() -> None:
    servers = [await _replica(i) for i in range(3)]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    front = free_port()
    cmd = [sys.executable, "-m", "tests.support.rr_front", "--port", str(front),
           "--to", ",".join(map(str, ports))]
    try:
        with running(cmd):
            for _ in range(100):
                try:
                    first = await _ask(front, b"x")
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            got = [first] + [await _ask(front, b"y" * 100_000) for _ in range(5)]
    finally:
        for s in servers:
            s.close()
    owners = [int(g.split(b":", 1)[0]) for g in got]
    assert owners[1:4] == [(owners[0] + k) % 3 for k in range(1, 4)], owners
    assert sorted(set(owners)) == [0, 1, 2]
    assert all(g.split(b":", 1)[1] == b"y" * 100_000 for g in got[1:])


async def test_an_answer_sent_at_accept_and_closed_reaches_the_silent_client() -> None:
    """A replica that answers and closes as soon as it accepts (as an overloaded gateway
    sheds a connection) before the front has handed the connection over: the client still
    gets the answer, then the close."""
    async def shed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(shed, "127.0.0.1", 0)
    front = free_port()
    cmd = [sys.executable, "-m", "tests.support.rr_front", "--port", str(front),
           "--to", str(server.sockets[0].getsockname()[1])]
    got = []
    try:
        with running(cmd):
            for _ in range(100):
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", front)
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            writer.close()
            for _ in range(20):
                reader, writer = await asyncio.open_connection("127.0.0.1", front)
                async with asyncio.timeout(10):
                    got.append(await reader.read(-1))
                writer.close()
    finally:
        server.close()
    assert got == [b"HTTP/1.1 503 Service Unavailable\r\n\r\n"] * 20
