"""The accounting child's end of the records' link (link.py): frames in, records to the
child's `LedgerRecorder`, acknowledgements out.

A frame's records are decoded in one call (core/codec.py `decode_lines`), handed to the
recorder with their lines (which its journal writes as they are), and the frame is
acknowledged once the recorder has written every record it carried to the ledger. The
frame's head carries the gateway's watermark, which the child publishes (`open_since`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from collections import deque
from typing import NamedTuple, cast

from accounting.link import ACK, FRAME_HEAD, MAX_FRAME
from accounting.priority import Background
from accounting.recorder import LedgerRecorder
from core.codec import DecodeError, decode_head, decode_lines

log = logging.getLogger("wattgate.accounting")


class ReceivedFrame(NamedTuple):
    """A frame whose records are not all written yet."""

    through: int  # records received through this frame (its own included)
    seq: int
    sent_wall_s: float  # the gateway's clock when it sent the frame


class RecordIntake:
    """The child's end: frames in, records to the recorder, acknowledgements out."""

    def __init__(self, recorder: LedgerRecorder, priority: Background | None = None, *,
                 floor: float | None = None):
        """`floor`: the gateway's `RecordLink.floor()` when it started this child, the
        watermark until its first frame (the default, the time of this call, suits a
        gateway that had nothing open)."""
        self.recorder = recorder
        self.priority = priority or Background(False, behind_s=math.inf)
        self.closed = asyncio.Event()
        self._buf = bytearray()
        self._frames: deque[ReceivedFrame] = deque()
        self._received = 0
        self._open_since: float | None = None
        # Until the first frame: requests may be open at the gateway since its floor
        self._sent_wall: float | None = time.time() if floor is None else floor
        self._transport: asyncio.Transport | None = None
        self._base = 0
        recorder.watch(self.open_since)
        recorder.on_written = self._written

    def open_since(self) -> float | None:
        """The gateway's oldest open request, or its last frame's time if earlier: requests
        arriving after that are not known here yet."""
        a, b = self._open_since, self._sent_wall
        if a is None:
            return b
        return a if b is None else min(a, b)

    async def start(self, fd: int) -> None:
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        # Records already in the recorder (a journal replay whose write failed) are written
        # before any of the link's, so they are not counted as the link's
        self._base = self.recorder.records_written + self.recorder.queued
        self.priority.start()
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(lambda: _IntakeProtocol(self), sock)

    def _frame(self, seq: int, body: bytes) -> None:
        try:
            cut = body.index(b"\n") + 1
            head = decode_head(body[:cut])
        except (DecodeError, ValueError):
            log.error("accounting child: a frame from the gateway could not be read: closing")
            if self._transport is not None:
                self._transport.close()
            return
        lines = body[cut:]
        recs, bad = decode_lines(lines)
        if bad:
            log.error("accounting child: %d records from the gateway could not be read", bad)
        if recs:
            self.recorder.record_encoded(recs, lines)
        self._received += len(recs)
        self._open_since, self._sent_wall = head.open_since_s, head.sent_wall_s
        self._frames.append(ReceivedFrame(self._received, seq, head.sent_wall_s))
        if not recs:
            self._written(self.recorder.records_written)
        self._judge_lag()

    def _data(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        while len(buf) >= FRAME_HEAD.size:
            size, seq = FRAME_HEAD.unpack_from(buf)
            if size > MAX_FRAME:
                log.error("accounting child: a frame of %d bytes from the gateway: closing", size)
                if self._transport is not None:
                    self._transport.close()
                return
            end = FRAME_HEAD.size + size
            if len(buf) < end:
                break
            self._frame(seq, bytes(buf[FRAME_HEAD.size:end]))
            del buf[:end]
            if self._transport is None or self._transport.is_closing():
                return

    def _written(self, records_written: int) -> None:
        """The recorder wrote its records through `records_written`: acknowledge the frames
        whose records all are among them."""
        done = records_written - self._base
        last = None
        frames = self._frames
        while frames and frames[0].through <= done:
            last = frames.popleft().seq
        if last is not None and self._transport is not None and not self._transport.is_closing():
            self._transport.write(ACK.pack(last))
        self._judge_lag()

    def _judge_lag(self) -> None:
        """How far behind the oldest record not yet written is, past the flush period."""
        if self._frames:
            age = time.time() - self._frames[0].sent_wall_s - self.recorder.config.flush_s
            self.priority.lag(age)


class _IntakeProtocol(asyncio.Protocol):
    def __init__(self, intake: RecordIntake):
        self.intake = intake

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they implement it
        self.intake._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.intake._data(data)

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.intake._transport = None
        self.intake.closed.set()
