"""A round-robin TCP front on 127.0.0.1 for tests that run several gateway replicas, as a
Kubernetes Service spreads connections over pods: each accepted connection goes to the next
replica in turn, and bytes are spliced both ways with flow control.

    python -m tests.support.rr_front --port 8080 --to 8101,8102,8103

What a client sees is what the replica did: its answer, then its close (a replica's reset is
passed on as a close, after the bytes that came before it). A client's half-close is passed
on as one; a client that goes away closes the replica's connection. A replica that cannot be
reached closes the client's connection. The connection to the replica is opened at accept,
so an idle client holds a descriptor on its replica as it would without the front.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import resource
import signal
from collections.abc import Iterator, Sequence
from typing import cast

import uvloop

HOST = "127.0.0.1"
# how long a client's connection is read (and what it sends dropped) after the replica's side
# ended, before it is closed: closing a socket that still receives turns the close into a
# reset, and a reset can cost the client the answer it has not read yet
LINGER_S = 2.0


class Half(asyncio.Protocol):
    """One side of a spliced connection: what it receives is written to its peer."""

    is_replica = False

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: Half | None = None
        self.early = bytearray()  # the client's bytes before the replica's side connected
        self.eof = False
        self.closed = False
        self.draining = False  # the replica's side ended: what the client sends is dropped

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def join(self, peer: Half) -> None:
        """Splice to `peer`: each side hands the other whatever arrived before (a replica may
        answer and close before its connection is handed over: an overloaded one does)."""
        self.peer, peer.peer = peer, self
        for half in (self, peer):
            half._catch_up()

    def _catch_up(self) -> None:
        assert self.peer is not None and self.peer.transport is not None
        assert self.transport is not None
        if self.early:
            self.peer.transport.write(bytes(self.early))
            self.early.clear()
        if self.closed:
            self.peer.end()
        elif self.eof:
            self._pass_eof()
        else:
            self.transport.resume_reading()

    def end(self) -> None:
        """Close this side after what is buffered is sent; a client's side is half-closed
        first and read for up to LINGER_S (a lingering close, as web servers do)."""
        t = self.transport
        if t is None or t.is_closing():
            return
        if self.is_replica or not t.can_write_eof():
            t.close()
            return
        self.draining = True
        t.write_eof()
        t.resume_reading()
        asyncio.get_running_loop().call_later(LINGER_S, t.close)

    def data_received(self, data: bytes) -> None:
        if self.draining:
            return
        if self.peer is None or self.peer.transport is None:
            self.early += data
            if len(self.early) > 1 << 16 and self.transport is not None:
                self.transport.pause_reading()
            return
        self.peer.transport.write(data)

    def eof_received(self) -> bool:
        if self.draining:
            return False  # the client is done too: close
        self.eof = True
        if self.peer is not None:
            self._pass_eof()
        return True  # keep our write side open: the peer may still answer

    def _pass_eof(self) -> None:
        assert self.peer is not None and self.peer.transport is not None
        peer = self.peer.transport
        if self.is_replica:
            self.peer.end()  # the replica closed: the client gets what came, then the close
        elif peer.can_write_eof() and not peer.is_closing():
            peer.write_eof()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.peer is not None and self.peer.transport is not None:
            self.peer.end()  # flushes what is buffered, then closes

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class ReplicaHalf(Half):
    is_replica = True


class Front:
    """Accepts on `port` and splices each connection to the next of `replicas` (ports)."""

    def __init__(self, replicas: Sequence[int]) -> None:
        self.turn: Iterator[int] = itertools.cycle(replicas)
        self.tasks: set[asyncio.Task[None]] = set()

    def client(self) -> Half:
        half = Half()
        task = asyncio.get_running_loop().create_task(self._connect(half, next(self.turn)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return half

    async def _connect(self, client: Half, port: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, replica = await loop.create_connection(ReplicaHalf, HOST, port)
        except OSError:
            client.end()
            return
        if client.closed:  # the client went away while the replica's side connected
            assert replica.transport is not None
            replica.transport.close()
            return
        client.join(replica)


def _raise_fd_limit() -> None:
    """Room for two descriptors per client connection (an fd flood goes through the front)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for want in (262_144, hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard)))
            return


async def serve(port: int, replicas: Sequence[int]) -> None:
    front = Front(replicas)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(front.client, HOST, port, backlog=4096,
                                      reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--to", required=True, help="the replicas' ports, comma-separated")
    args = p.parse_args(argv)
    _raise_fd_limit()
    uvloop.run(serve(args.port, [int(x) for x in args.to.split(",")]))

if __name__ == "__main__":
    main()
