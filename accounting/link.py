"""The records' way from a gateway process to its accounting child, so that turning finished
requests into ledger rows, journalling them and writing them to the ledger never shares the
gateway's event loop or its GIL.

Gateway side (`RecordLink`): `record` appends to a list (O(1)); a timer armed by the first
record ships what is queued every SHIP_S as one frame (the journal's line encoding: one C
call per record) over a Unix socket pair whose other end the child was started with. A frame
stays in memory until the child acknowledges that its records are in the ledger; when the
child dies, the frames not acknowledged are sent again to its successor (the ledger keeps
one row per request id, so a frame written twice is harmless).

While no child is attached (it died, or could not be started: the gateway out of file
descriptors), the records also go to the gateway's own spill journal (journal.py, in the
accounting journal's directory): on its death the unacknowledged frames, then every frame
shipped until a successor is attached. The spill's segments are released once the successor
acknowledged them; a gateway that stops first leaves them, and the next accounting child
(after a restart) replays them as it replays any dead owner's journal.

Child side (`RecordIntake`, intake.py): reads frames, hands their records to the child's
`LedgerRecorder` (which journals, ingests and writes them as in a gateway) and acknowledges the
frames of each read once the records they carried were written, by the last one's sequence
number (an acknowledgement covers every frame through it).

The watermark travels too: every frame carries the gateway's oldest open request and the
wall-clock time it was sent; the child publishes the earlier of the two, since a request may
have arrived at the gateway after its last frame.

Frame, gateway to child: 4-byte body length, 8-byte sequence number (big-endian), then the
body: its head line (core/codec.py `FrameHead`: the version, open_since | null, sent_wall_s),
then one record line per record (core/codec.py, the journal's lines), which the child's
journal writes as they are.
Acknowledgement, child to gateway: the 8-byte sequence number of the last frame written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from accounting.journal import Journal
from core.codec import EncodeError, FrameHead, encode, encode_head, encode_lines
from core.records import RequestRecord

log = logging.getLogger("wattgate.accounting")

SHIP_S = 0.02  # a record waits at most this long on the gateway before it is sent
HEARTBEAT_S = 0.25  # with nothing to send, the watermark is sent this often
# Sent and not acknowledged (about 75 s of 4,000 requests/s, ~150 MB): past this the oldest
# are forgotten, logged and counted
MAX_HELD_RECORDS = 300_000
SOCKET_BUFFER = 4 << 20
FRAME_HEAD = struct.Struct(">IQ")  # body length, sequence number
ACK = struct.Struct(">Q")  # the sequence number of the last frame written
MAX_FRAME = 256 << 20


class HeldFrame(NamedTuple):
    """A frame sent (or to be sent) and not acknowledged, with the records it carries."""

    seq: int
    records: list[RequestRecord]
    frame: bytes


class SpillRelease(NamedTuple):
    """The spill's segments below `segment` may go once the frames through `through_seq`
    are acknowledged."""

    segment: int
    through_seq: int


def _nothing_open() -> float | None:
    return None


def _encodable(recs: list[RequestRecord]) -> tuple[list[RequestRecord], bytes]:
    """The records that encode, and their lines; the others are logged and dropped (a value
    no journal line can hold: the record could never be written)."""
    kept: list[RequestRecord] = []
    lines: list[bytes] = []
    for rec in recs:
        try:
            lines.append(encode(rec))
        except (EncodeError, TypeError, ValueError) as exc:
            log.error("request %s cannot be recorded (%s): dropped", rec.request_id, exc)
        else:
            kept.append(rec)
    return kept, b"".join(lines)


class RecordLink:
    """The gateway's end: queue, ship, hold until acknowledged, re-send to a new child."""

    def __init__(self, *, clock: Callable[[], float] = time.time, eager: bool = False):
        """`eager`: the records of one turn of the event loop are sent together at the start
        of the next turn, instead of every SHIP_S (a node's worker: what is in the kernel's socket
        buffer reaches the child even if this process is killed the next instant); answers
        held with `after_sent` go out right after them."""
        self._clock = clock
        self._eager = eager
        self._soon = False  # an eager ship is scheduled for the end of this turn
        self._after: list[Callable[[], None]] = []  # waiting for that ship
        self._pending: list[RequestRecord] = []
        self._held: deque[HeldFrame] = deque()
        self._held_records = 0
        self._seq = 0
        self._acked = 0
        self._sock: socket.socket | None = None
        self._out = bytearray()
        self._in = bytearray()
        self._timer: asyncio.TimerHandle | None = None
        self._sent_at = 0.0
        self._open_since: Callable[[], float | None] = _nothing_open
        self._loop: asyncio.AbstractEventLoop | None = None
        self._acked_event = asyncio.Event()
        self._detached = asyncio.Event()  # set while no child's socket is attached
        self._detached.set()
        self.forgotten = 0  # records dropped past MAX_HELD_RECORDS (the child may have them)
        self._spill: Journal | None = None
        self._spilled_seq = 0  # frames through this one are in the spill journal
        self._release_at: SpillRelease | None = None
        self.spilled = 0  # records written to the spill journal
        # Spilled records were forgotten here (past MAX_HELD_RECORDS): no successor gets them
        # from memory, so the spill is kept for the next start to replay
        self._keep_spill = False

    def spill_to(self, journal: Journal) -> None:
        """Where records go on disk while no child is attached (an open journal)."""
        self._spill = journal

    async def open_spill(self, directory: Path, retry_s: float) -> Journal:
        """Open this process's own spill journal in `directory` (off the loop) and spill to
        it; a failed write is tried again every `retry_s`."""
        journal = Journal(directory, owner=f"gateway-{os.getpid()}-{secrets.token_hex(4)}",
                          retry_s=retry_s)
        await asyncio.to_thread(journal.open)
        self.spill_to(journal)
        return journal

    # --- hot path ---------------------------------------------------------------------------

    def record(self, rec: RequestRecord) -> None:
        """Queue a finished request for the child (O(1), no I/O)."""
        self._pending.append(rec)
        if self._eager:
            if not self._soon:
                self._soon = True
                (self._loop or asyncio.get_running_loop()).call_soon(self._ship_soon)
        elif self._timer is None:
            loop = self._loop or asyncio.get_running_loop()
            self._timer = loop.call_later(SHIP_S, self._ship)

    def after_sent(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the records queued so far are on the child's socket (or in
        the spill journal): at once where none waits (a link that is not eager ships on its
        timer and holds nothing back)."""
        if self._soon:
            self._after.append(callback)
        else:
            callback()

    def _ship_soon(self) -> None:
        self._soon = False
        try:
            if self._pending:
                if self._timer is not None:
                    self._timer.cancel()
                self._ship()
        finally:  # the answers go out whatever became of their records
            after, self._after = self._after, []
            for callback in after:
                try:
                    callback()
                except Exception:  # one answer's failure is not the others'
                    log.exception("an answer held for its record failed")

    def watch(self, open_since: Callable[[], float | None]) -> None:
        """Where to learn the wall-clock arrival of the oldest request being served."""
        self._open_since = open_since

    # --- the child's socket -----------------------------------------------------------------

    def attach(self, sock: socket.socket) -> None:
        """A new child's end of the pair: everything held goes to it first."""
        self.detach()
        loop = self._loop = asyncio.get_running_loop()
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        self._sock = sock
        self._detached.clear()
        self._in.clear()
        self._out.clear()
        for held in self._held:
            self._out += held.frame
        if self._spill is not None and self._spilled_seq > self._acked and not self._keep_spill:
            # what was spilled goes to the new child first: once it is acknowledged, its
            # segments (all before this cut) may go
            self._release_at = SpillRelease(self._spill.cut(), self._spilled_seq)
        loop.add_reader(sock.fileno(), self._read_acks)
        self._flush_out()

    def detach(self) -> None:
        """Let go of the child's socket; what it has not acknowledged goes to the spill."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        self._detached.set()
        for held in self._held:
            if held.seq > self._spilled_seq:
                self._spill_frame(held)
        loop = self._loop
        if loop is not None:
            loop.remove_reader(sock.fileno())
            loop.remove_writer(sock.fileno())
        sock.close()
        self._out.clear()

    @property
    def attached(self) -> bool:
        return self._sock is not None

    async def detached(self, timeout_s: float) -> None:
        """Wait at most `timeout_s` until no child's socket is attached."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._detached.wait(), max(timeout_s, 0.0))

    def floor(self) -> float:
        """The earliest wall-clock time a new child must take this gateway to still record
        work at until its first frame comes: the oldest request open, held or queued here,
        or now."""
        times = [self._clock()]
        since = self._open_since()
        if since is not None:
            times.append(since)
        times += [r.arrived_wall_s for r in self.unwritten_records()]
        return min(times)

    def _read_acks(self) -> None:
        sock = self._sock
        assert sock is not None
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.warning("accounting child's record socket failed: %s", exc)
            data = b""
        if not data:
            self.detach()  # the child is gone: the supervisor attaches its successor
            return
        self._in += data
        n = len(self._in) - len(self._in) % ACK.size
        if n:
            (last,) = ACK.unpack_from(self._in, n - ACK.size)
            del self._in[:n]
            self._acknowledged(last)

    def _spill_frame(self, held: HeldFrame) -> None:
        if self._spill is None or not held.records:
            return
        cut = held.frame.index(b"\n", FRAME_HEAD.size) + 1  # after the head line: the records
        self._spill.append_encoded(held.frame[cut:], len(held.records))
        self._spilled_seq = held.seq
        self.spilled += len(held.records)

    def _acknowledged(self, seq: int) -> None:
        self._acked = max(self._acked, seq)
        release = self._release_at
        if release is not None and seq >= release.through_seq and self._spill is not None:
            self._spill.release(release.segment)
            self._release_at = None
        held = self._held
        while held and held[0].seq <= seq:
            self._held_records -= len(held.popleft().records)
        self._acked_event.set()

    # --- shipping -----------------------------------------------------------------------------

    def _ship(self) -> None:
        self._timer = None
        recs, self._pending = self._pending, []
        now = self._clock()
        seq = self._seq = self._seq + 1
        head = encode_head(FrameHead(self._open_since(), now))
        lines = b""
        if recs:
            try:
                lines = encode_lines(recs)
            except (EncodeError, TypeError, ValueError):
                recs, lines = _encodable(recs)
        frame = HeldFrame(seq, recs, b"".join(
            (FRAME_HEAD.pack(len(head) + len(lines), seq), head, lines)))
        self._sent_at = now
        self._held.append(frame)
        self._held_records += len(recs)
        while self._held_records > MAX_HELD_RECORDS and len(self._held) > 1:
            old = self._held.popleft()
            self._held_records -= len(old.records)
            self.forgotten += len(old.records)
            spilled = self._spill is not None and old.seq <= self._spilled_seq
            self._keep_spill |= spilled
            log.error("accounting child has not acknowledged %d records: the oldest %d are "
                      "no longer held for it%s", MAX_HELD_RECORDS, len(old.records),
                      " (they are in the spill journal, which the next start replays)"
                      if spilled else "")
        if self._sock is not None:
            self._send(frame.frame)
        else:
            self._spill_frame(frame)

    def _send(self, data: bytes) -> None:
        """`data` to the child's socket: at once, in one call, unless some already waits."""
        if self._out:  # the socket's writer callback is registered: it sends the rest
            self._out += data
            return
        sock = self._sock
        assert sock is not None and self._loop is not None
        n = self._write(sock, data)
        if n is not None and n < len(data):
            self._out += memoryview(data)[n:]
            self._loop.add_writer(sock.fileno(), self._flush_out)

    def _write(self, sock: socket.socket, data: bytes | bytearray) -> int | None:
        """What the socket took of `data` now (0 when full); None where it failed (then
        the link has let go of it)."""
        try:
            return sock.send(data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            log.warning("accounting child's record socket failed: %s", exc)
            self.detach()
            return None

    def _flush_out(self) -> None:
        sock = self._sock
        if sock is None or not self._out:
            return
        n = self._write(sock, self._out)
        if n is None:
            return
        del self._out[:n]
        assert self._loop is not None
        if self._out:
            self._loop.add_writer(sock.fileno(), self._flush_out)
        else:
            self._loop.remove_writer(sock.fileno())

    def step(self) -> None:
        """Off the hot path (the accounting loop): send the watermark when nothing else was
        sent for HEARTBEAT_S."""
        if self._timer is None and self._clock() - self._sent_at >= HEARTBEAT_S:
            self._ship()

    async def drain(self, timeout_s: float) -> bool:
        """Send what is queued and wait until the child acknowledged all of it (False at the
        deadline: the records not acknowledged are logged)."""
        if self._timer is not None:
            self._timer.cancel()
        self._ship()
        deadline = time.monotonic() + timeout_s
        while self._held and self._held[-1].seq > self._acked:
            left = deadline - time.monotonic()
            if left <= 0:
                break  # (a child down meanwhile may be restarted and attached before this)
            self._acked_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acked_event.wait(), min(left, 0.1))
        if self._held_records:
            where = ("; all of them go to the spill journal, which the next start replays"
                     if self._spill is not None else "")
            log.error("stopping with %d request records the accounting child has not "
                      "written to the ledger yet (it writes what it received before it "
                      "stops)%s", self._held_records, where)
        return not self._held_records

    # --- reads ----------------------------------------------------------------------------------

    @property
    def unwritten(self) -> int:
        """Records queued or sent and not yet acknowledged as written."""
        return len(self._pending) + self._held_records

    def unwritten_records(self) -> list[RequestRecord]:
        out = list(self._pending)
        for held in self._held:
            out += held.records
        return out
