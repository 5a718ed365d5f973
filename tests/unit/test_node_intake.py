"""The accounting child of a node (`wattgate serve --workers N`) takes many workers on one
Unix socket (intake.py `listen`): each worker's frames are acknowledged once written, the
watermark it publishes is the earliest over the workers, a worker that has not sent its
first frame holds it where it was, a worker that reconnects keeps holding it while it is
away, and a worker that was killed stops holding it. An eager link (a node's worker) sends
the records of one turn of the event loop together at the start of the next, and only then
lets the answers held for them go."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from accounting.intake import IntakeConnection, RecordIntake
from accounting.link import ACK, FRAME_HEAD, RecordLink
from core.codec import FrameHead, encode_head, encode_lines
from core.records import RequestRecord
from tests.accounting.test_accounting_recorder import FlakyLedger
from tests.unit.test_record_link import OPENED, closes, gateway_end, recorder, records, until

pytestmark = pytest.mark.timeout(30)


async def node_child(tmp: Path, expect: int = 1) -> tuple[RecordIntake, Path]:
    intake = RecordIntake(recorder(FlakyLedger(fail=0)), floor=1000.0, expect=expect)
    OPENED.append(intake.close)
    path = tmp / "records.sock"
    await intake.listen(path)
    return intake, path


NOW = [0.0]  # the workers' wall clock; a heartbeat is due after HEARTBEAT_S of it


def beat(*links: RecordLink, at: float) -> None:
    """Each link sends its watermark now, its clock at `at`."""
    NOW[0] = at
    for gw in links:
        gw._sent_at = -1e9  # a heartbeat is due
        gw.step()


async def worker(path: Path, open_since: list[float | None], **kw: object) -> RecordLink:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, str(path))
    gw = gateway_end(clock=lambda: NOW[0], **kw)
    gw.watch(lambda: open_since[0])
    gw.attach(sock)
    return gw


@closes
async def test_two_workers_are_acknowledged_and_the_watermark_is_their_earliest() -> None:
    with _tmp() as tmp:
        intake, path = await node_child(tmp)
        assert intake.open_since() == 1000.0  # the floor, till a first frame
        a_open: list[float | None] = [1500.0]
        b_open: list[float | None] = [1200.0]
        NOW[0] = 2000.0
        a = await worker(path, a_open)
        b = await worker(path, b_open)
        await until(lambda: intake.connections == 2, "both connected")
        recs = records(20)
        for i, rec in enumerate(recs):
            (a if i % 2 else b).record(rec)
        await until(lambda: len(intake.recorder._pending) == 20, "the records in the child")
        assert intake.open_since() == 1200.0  # b's oldest open request
        b_open[0] = None
        beat(b, at=2000.0)  # nothing open at b: its last frame's time holds
        await until(lambda: intake.open_since() == 1500.0, "a's watermark")
        intake.recorder.ingest()
        await intake.recorder.flush()
        await until(lambda: a.unwritten == 0 and b.unwritten == 0, "both acknowledged")
        ledger = intake.recorder.ledger
        assert isinstance(ledger, FlakyLedger)
        assert {r.request_id for r in ledger.requests} == {r.request_id for r in recs}


@closes
async def test_a_worker_connecting_holds_the_watermark_until_its_first_frame() -> None:
    with _tmp() as tmp:
        intake, path = await node_child(tmp)
        a = await worker(path, [None])
        beat(a, at=3000.0)
        await until(lambda: intake.open_since() == 3000.0, "a's heartbeat")
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # no frame yet
        OPENED.append(raw.close)
        raw.connect(str(path))
        await until(lambda: intake.connections == 2, "the second connection")
        beat(a, at=4000.0)
        await until(lambda: intake.open_since() == 3000.0 and a._acked, "a's heartbeat")
        await asyncio.sleep(0.05)
        assert intake.open_since() == 3000.0  # the silent one holds it where it was


@closes
async def test_a_worker_away_holds_its_watermark_and_a_killed_one_does_not() -> None:
    with _tmp() as tmp:
        intake, path = await node_child(tmp)
        a = await worker(path, [None])
        b_open: list[float | None] = [4200.0]
        b = await worker(path, b_open)
        beat(a, b, at=5000.0)
        await until(lambda: intake.open_since() == 4200.0, "b's open request")
        b.detach()  # the link broke; b's process lives and will reconnect
        await until(lambda: intake.connections == 1, "b away")
        assert intake.open_since() == 4200.0  # its open request is not skipped meanwhile
        b = await worker(path, b_open)
        b_open[0] = None
        beat(b, at=5000.0)
        await until(lambda: intake.open_since() == 5000.0, "b back, nothing open")

        # a worker process killed with a request open: its watermark goes with it
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", KILLED_WORKER,
                                                    str(path))
        try:
            await until(lambda: intake.open_since() == 4100.0, "the other worker's frame")
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
        await until(lambda: intake.connections == 2, "the killed worker's connection closed")
        assert intake.open_since() == 5000.0


@closes
async def test_the_floor_holds_until_every_worker_of_the_node_reported() -> None:
    with _tmp() as tmp:
        intake, path = await node_child(tmp, expect=2)  # a successor child of a 2-worker node
        a = await worker(path, [None])
        beat(a, at=3000.0)
        await until(lambda: a._acked, "a's first frame")
        assert intake.open_since() == 1000.0  # the other worker may have requests open since
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", KILLED_WORKER,
                                                    str(path))
        try:
            await until(lambda: intake.open_since() == 3000.0, "both reported: a's watermark")
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()


# Sends one frame whose watermark is 4100.0, then waits to be killed
KILLED_WORKER = """
import socket, sys, time
from accounting.link import FRAME_HEAD
from core.codec import FrameHead, encode_head
body = encode_head(FrameHead(4100.0, 5000.0))
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(FRAME_HEAD.pack(len(body), 1) + body)
time.sleep(60)
"""


@closes
async def test_an_eager_link_sends_a_turns_records_in_one_frame_before_the_answers() -> None:
    with _tmp() as tmp:
        intake, path = await node_child(tmp)
        gw = await worker(path, [None], eager=True)
        seen: list[tuple[str, int]] = []
        seq = gw._seq
        for rec in records(3):
            gw.record(rec)
        gw.after_sent(lambda: seen.append(("answer", len(gw._pending) + len(gw._out))))
        assert seen == [] and len(gw._pending) == 3  # this turn: nothing sent, answer held
        await asyncio.sleep(0)
        assert seen == [("answer", 0)]  # the records went first, onto the socket
        assert gw._seq == seq + 1  # in one frame
        gw.after_sent(lambda: seen.append(("at once", len(gw._pending))))
        assert seen[-1] == ("at once", 0)  # nothing waiting: no answer is held
        await until(lambda: len(intake.recorder._pending) == 3, "the records in the child")


@closes
async def test_held_answers_go_out_even_when_their_records_cannot_be_shipped() -> None:
    with _tmp() as tmp:
        _intake, path = await node_child(tmp)
        gw = await worker(path, [None], eager=True)

        def broken() -> None:
            raise OSError("no room")

        gw._ship = broken  # type: ignore[method-assign]
        seen: list[str] = []
        gw.record(records(1)[0])
        gw.after_sent(lambda: seen.append("answer"))
        await asyncio.sleep(0)  # the ship fails (the loop logs it); the answer goes all the same
        assert seen == ["answer"]


class _Transport:
    """What an intake connection writes (its acknowledgements)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def get_extra_info(self, _name: str) -> None:
        return None


def _frame(seq: int, recs: list[RequestRecord]) -> bytes:
    body = encode_head(FrameHead(None, 2000.0 + seq)) + encode_lines(recs)
    return FRAME_HEAD.pack(len(body), seq) + body


@closes
async def test_the_frames_of_one_read_are_held_as_one_and_acknowledged_by_the_last() -> None:
    """A worker sends a frame per turn of its loop; the child reads them every READ_EVERY_S,
    and what a read costs it must not grow with how many frames the records came in."""
    intake = RecordIntake(recorder(FlakyLedger(fail=0)), floor=1000.0)
    conn = IntakeConnection(intake, pair=False)
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    recs = records(5)
    conn.data_received(_frame(1, recs[:2]) + _frame(2, recs[2:3]) + _frame(3, recs[3:])[:9])
    assert len(conn.frames) == 1 and conn.frames[0].seq == 2  # the torn third waits
    assert conn.frames[0].sent_wall_s == 2001.0  # the oldest frame's, for the lag
    assert len(intake.recorder._pending) == 3
    conn.data_received(_frame(3, recs[3:])[9:] + _frame(4, []))  # the rest; a heartbeat
    assert [f.seq for f in conn.frames] == [2, 4]
    assert conn.open_since() == 2004.0  # the last frame's watermark
    intake.recorder.ingest()
    await intake.recorder.flush()
    assert transport.written == [ACK.pack(4)]  # one acknowledgement, cumulative
    assert not conn.frames
    ledger = intake.recorder.ledger
    assert isinstance(ledger, FlakyLedger)
    assert {r.request_id for r in ledger.requests} == {r.request_id for r in recs}


@closes
async def test_a_frame_the_socket_takes_in_part_goes_out_whole_and_in_order() -> None:
    ours, theirs = socket.socketpair()
    OPENED.extend((ours.close, theirs.close))
    gw = gateway_end(eager=True)
    gw.attach(ours)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    recs = records(20)
    while not gw._out:  # until a frame went in part (nobody reads the other end)
        for rec in recs:
            gw.record(rec)
        await asyncio.sleep(0)
    for rec in recs[:2]:  # queued behind the rest
        gw.record(rec)
    await asyncio.sleep(0)
    theirs.setblocking(False)
    got = bytearray()
    while gw._out or len(got) < sum(len(h.frame) for h in gw._held):
        with contextlib.suppress(BlockingIOError):
            got += theirs.recv(1 << 20)
        await asyncio.sleep(0)
    seqs = []
    while got:
        size, seq = FRAME_HEAD.unpack_from(got)
        seqs.append(seq)
        del got[:FRAME_HEAD.size + size]
    assert seqs == list(range(1, gw._seq + 1))


@closes
async def test_a_worker_waits_for_its_link_to_drop_without_polling() -> None:
    ours, theirs = socket.socketpair()
    OPENED.append(theirs.close)
    gw = gateway_end(eager=True)
    await asyncio.wait_for(gw.detached(10.0), 1.0)  # none attached: at once
    gw.attach(ours)
    t0 = time.monotonic()
    await gw.detached(0.05)  # attached: it waits the whole timeout
    assert time.monotonic() - t0 >= 0.04
    waiting = asyncio.create_task(gw.detached(10.0))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    gw.detach()
    await asyncio.wait_for(waiting, 1.0)  # woken at once by the drop


def test_a_link_that_is_not_eager_holds_no_answer() -> None:
    link = RecordLink()
    seen: list[str] = []
    link.after_sent(lambda: seen.append("answer"))
    assert seen == ["answer"]


class _tmp:
    """A short directory (a Unix socket path holds at most 107 bytes)."""

    def __enter__(self) -> Path:
        import tempfile

        self.path = Path(tempfile.mkdtemp(prefix="wg-"))
        return self.path

    def __exit__(self, *exc: object) -> None:
        import shutil

        shutil.rmtree(self.path, ignore_errors=True)

