"""The accounting child's end of the records' link (link.py): frames in, records to the
child's `LedgerRecorder`, acknowledgements out.

The frames of one read are taken as one: their records are decoded in one call (core/codec.py
`decode_lines`), handed to the recorder with their lines (which its journal writes as they
are), and acknowledged by the last frame's sequence number (acknowledgements are cumulative)
once the recorder has written every record they carried to the ledger.

One gateway (a socket pair, `start`) or the workers of a node (`wattgate serve --workers N`:
a Unix socket they connect to, `listen`), each on a connection of its own. The recorder
writes records in the order they were received whatever their connection, so a frame is
written once the records received through it are: one count for all connections.

The watermark the child publishes (`open_since`) is the earliest over the connections: each
one's oldest open request, or its last frame's time if earlier (a request may have arrived
after its last frame). A connection that has not sent its first frame yet holds the
watermark where it was when it connected (its worker may have requests open since before);
until the first frame of each of the `expect` workers the node starts (or FLOOR_HOLD_S after
the child started, for a worker that never comes), the `floor` holds it. A connection that closes
while its worker process lives (the link broke; it reconnects) keeps holding its last
watermark for up to GHOST_S; one whose process is gone (killed) holds nothing: its
unanswered requests are never recorded, and its answered ones are in the recorder already.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import struct
import time
from collections import deque
from pathlib import Path
from typing import NamedTuple, cast

from accounting.link import ACK, FRAME_HEAD, MAX_FRAME, SHIP_S
from accounting.priority import Background
from accounting.recorder import LedgerRecorder, untrack
from core.codec import DecodeError, FrameHead, decode_head, decode_lines
from core.records import RequestRecord

log = logging.getLogger("wattgate.accounting")

FLOOR_HOLD_S = 10.0  # the floor holds at most this long for the workers' first frames
GHOST_S = 30.0  # a closed connection of a live worker holds its watermark this long at most
PEERCRED = struct.Struct("3i")  # pid, uid, gid
# A node worker sends each record the moment its request ends (so a SIGKILL loses no answered
# one); the child reads a worker's socket at most this often, so that the records of this
# span share one read, one journal write and one acknowledgement (one wake-up of each side)
# as a single gateway's batches do. What waits is in the kernel's socket buffer, which
# outlives the worker.
READ_EVERY_S = SHIP_S


class ReceivedFrame(NamedTuple):
    """A frame whose records are not all written yet."""

    through: int  # records received through this frame (its own included), all connections
    seq: int
    sent_wall_s: float  # the gateway's clock when it sent the frame
    arrived_s: float  # its earliest record's arrival (inf: none)


class Ghost(NamedTuple):
    """A closed connection's last watermark, held while its process may reconnect."""

    pid: int
    since: float | None
    until_s: float  # monotonic


def peer_pid(sock: socket.socket) -> int:
    """The process at the other end of a Unix socket (0: unknown)."""
    try:
        pid, _uid, _gid = PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
    except OSError:
        return 0
    return int(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


class RecordIntake:
    """The child's end: frames in, records to the recorder, acknowledgements out."""

    def __init__(self, recorder: LedgerRecorder, priority: Background | None = None, *,
                 floor: float | None = None, expect: int = 1):
        """`floor`: the gateway's `RecordLink.floor()` when it started this child, the
        watermark until a first frame (the default, the time of this call, suits a gateway
        that had nothing open); for a node's child, until the first frames of `expect`
        workers."""
        self.recorder = recorder
        self.priority = priority or Background(False, behind_s=math.inf)
        self.closed = asyncio.Event()  # the socket pair's gateway closed its end
        self._conns: list[IntakeConnection] = []
        self._ghosts: list[Ghost] = []
        self._received = 0
        self._floor: float | None = time.time() if floor is None else floor
        self._heard = False  # the expected first frames came: the floor no longer holds
        self._expect = expect
        self._reported: set[int] = set()  # the worker processes whose first frame came
        self._floor_until = time.monotonic() + FLOOR_HOLD_S
        self._base = 0
        self._batch: list[RequestRecord] = []  # received in this read, not yet handed over
        self._batch_lines: list[bytes] = []
        self._server: asyncio.AbstractServer | None = None
        recorder.watch(self.open_since)
        recorder.on_written = self._written

    @property
    def connections(self) -> int:
        return len(self._conns)

    def open_since(self) -> float | None:
        """The earliest of the connected gateways' watermarks (module docstring)."""
        since = None if self._floor_gone() else self._floor
        for conn in self._conns:
            since = _earliest(since, conn.open_since())
        if self._ghosts:
            now = time.monotonic()
            self._ghosts = [g for g in self._ghosts if g.until_s > now and _alive(g.pid)]
            for ghost in self._ghosts:
                since = _earliest(since, ghost.since)
        return since

    def _floor_gone(self) -> bool:
        if not self._heard and time.monotonic() >= self._floor_until:
            self._heard = True  # a worker that never came holds nothing
        return self._heard

    def watermark(self) -> float | None:
        """`open_since`, or earlier where a record received is not written yet: what a
        successor of this child must take as its floor (the gateways send those again)."""
        since = self.open_since()
        for conn in self._conns:
            if conn.frames:
                arrived = min(f.arrived_s for f in conn.frames)
                if arrived < math.inf:
                    since = _earliest(since, arrived)
        return since

    def _begin(self) -> None:
        # Records already in the recorder (a journal replay whose write failed) are written
        # before any of the link's, so they are not counted as the link's
        self._base = self.recorder.records_written + self.recorder.queued
        self.priority.start()

    async def start(self, fd: int) -> None:
        """One gateway on the socket pair end `fd`."""
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        self._begin()
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(lambda: IntakeConnection(self, pair=True), sock)

    async def listen(self, path: Path) -> None:
        """The workers of a node, each connecting to the Unix socket at `path`."""
        self._begin()
        await asyncio.to_thread(path.unlink, missing_ok=True)
        self._server = await asyncio.get_running_loop().create_unix_server(
            lambda: IntakeConnection(self, pair=False), str(path))

    def close(self) -> None:
        """Stop taking connections and close those open."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.close()

    def _joined(self, conn: IntakeConnection) -> None:
        # until its first frame it holds the watermark where it is now
        conn.held = self.open_since()
        self._ghosts = [g for g in self._ghosts if g.pid != conn.pid]
        self._conns.append(conn)

    def _left(self, conn: IntakeConnection) -> None:
        self._conns.remove(conn)
        if conn.pid and _alive(conn.pid):
            self._ghosts.append(Ghost(conn.pid, conn.open_since(), time.monotonic() + GHOST_S))
        if conn.pair:
            self.closed.set()

    def _received_frames(self, conn: IntakeConnection, frames: list[tuple[int, bytes]]
                         ) -> None:
        """The frames of one read (sequence number, body), taken as one: their records are
        decoded in one call and they are acknowledged together, by the last one's sequence
        number (acknowledgements are cumulative), so what a frame costs here does not grow
        with how many frames a gateway splits its records into (a node's worker sends one
        per turn of its event loop)."""
        heads: list[FrameHead] = []
        parts: list[bytes] = []
        for _seq, body in frames:
            try:
                cut = body.index(b"\n") + 1
                heads.append(decode_head(body[:cut]))
            except (DecodeError, ValueError):
                log.error("accounting child: a frame from the gateway could not be read: "
                          "closing")
                conn.close()
                break
            parts.append(body[cut:])
        if not heads:
            return
        lines = parts[0] if len(parts) == 1 else b"".join(parts)
        recs, bad = decode_lines(lines)
        untrack(recs)  # they wait for the next flush (recorder.untrack)
        if bad:
            log.error("accounting child: %d records from the gateway could not be read", bad)
        if recs:  # handed to the recorder with the other frames of this read (`hand_over`)
            self._batch += recs
            self._batch_lines.append(lines)
        self._received += len(recs)
        last = heads[-1]
        conn.heard(last.open_since_s, last.sent_wall_s)
        if not self._heard:
            self._reported.add(conn.pid)
            self._heard = len(self._reported) >= self._expect
        arrived_s = min([r.arrived_wall_s for r in recs], default=math.inf)
        conn.frames.append(ReceivedFrame(self._received, frames[len(heads) - 1][0],
                                         heads[0].sent_wall_s, arrived_s))
        if not recs:
            self._written(self.recorder.records_written)

    def hand_over(self) -> None:
        """The records of the frames of one read to the recorder at once (one journal write
        for all of them: a node's workers send a frame per record)."""
        if self._batch:
            recs, self._batch = self._batch, []
            lines = self._batch_lines[0] if len(self._batch_lines) == 1 else b"".join(
                self._batch_lines)
            self._batch_lines.clear()
            self.recorder.record_encoded(recs, lines)
        self._judge_lag()

    def _written(self, records_written: int) -> None:
        """The recorder wrote its records through `records_written`: acknowledge the frames
        whose records all are among them."""
        done = records_written - self._base
        for conn in self._conns:
            conn.acknowledge(done)
        self._judge_lag()

    def _judge_lag(self) -> None:
        """How far behind the oldest record not yet written is, past the flush period."""
        oldest = min((c.frames[0].sent_wall_s for c in self._conns if c.frames), default=None)
        if oldest is not None:
            self.priority.lag(time.time() - oldest - self.recorder.config.flush_s)


class IntakeConnection(asyncio.Protocol):
    """One gateway (worker) process's connection: its frames, watermark and acknowledgements."""

    def __init__(self, intake: RecordIntake, *, pair: bool):
        self.intake = intake
        self.pair = pair
        self.pid = 0
        self.frames: deque[ReceivedFrame] = deque()
        self.held: float | None = None  # the watermark held until the first frame
        self._first = True
        self._open_since: float | None = None
        self._sent_wall: float | None = None
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None

    def open_since(self) -> float | None:
        if self._first:
            return self.held
        return _earliest(self._open_since, self._sent_wall)

    def heard(self, open_since: float | None, sent_wall_s: float) -> None:
        self._first = False
        self._open_since, self._sent_wall = open_since, sent_wall_s

    def acknowledge(self, done: int) -> None:
        last = None
        frames = self.frames
        while frames and frames[0].through <= done:
            last = frames.popleft().seq
        transport = self._transport
        if last is not None and transport is not None and not transport.is_closing():
            transport.write(ACK.pack(last))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they implement it
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if not self.pair and sock is not None:
            self.pid = peer_pid(cast(socket.socket, sock))
        self.intake._joined(self)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        frames: list[tuple[int, bytes]] = []
        while len(buf) >= FRAME_HEAD.size:
            size, seq = FRAME_HEAD.unpack_from(buf)
            if size > MAX_FRAME:
                log.error("accounting child: a frame of %d bytes from the gateway: closing", size)
                self.close()
                break
            end = FRAME_HEAD.size + size
            if len(buf) < end:
                break
            frames.append((seq, bytes(buf[FRAME_HEAD.size:end])))
            del buf[:end]
        if frames:
            self.intake._received_frames(self, frames)
        self.intake.hand_over()
        transport = self._transport
        if not self.pair and transport is not None and not transport.is_closing():
            transport.pause_reading()
            asyncio.get_running_loop().call_later(READ_EVERY_S, self._resume)

    def _resume(self) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self.intake._left(self)
