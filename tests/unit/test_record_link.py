"""The records' way from a gateway process to its accounting child (link.py), over a real Unix
socket pair on one event loop: every field the ledger uses crosses it, a frame is held on the
gateway until the child acknowledges it written, a failed write is not acknowledged, a dead
child's successor gets everything not acknowledged, and the watermark the child publishes
never runs ahead of the gateway's."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from accounting import link as link_mod
from accounting.config import JournalConfig
from accounting.intake import RecordIntake
from accounting.ledger.base import LedgerError
from accounting.link import RecordLink
from accounting.recorder import LedgerRecorder
from core.records import RequestRecord
from tests.accounting.test_accounting_accuracy import T0_WALL, run_engine
from tests.accounting.test_accounting_recorder import FlakyLedger
from tests.accounting.test_ledger_sqlite import Clock, make_config

pytestmark = pytest.mark.timeout(30)


def records(n: int) -> list[RequestRecord]:
    recs = run_engine(7, duration_s=10.0).records[:n]
    assert len(recs) == n
    return recs


def recorder(ledger: FlakyLedger) -> LedgerRecorder:
    config = dataclasses.replace(make_config(), journal=JournalConfig(enabled=False))
    return LedgerRecorder(config, ledger, "gw-1",  # type: ignore[arg-type]
                          clock=Clock(T0_WALL))


# What a test opened, closed after it whether it passed or not (a transport left open keeps
# the event loop from closing, and a failing test would hang instead of failing)
OPENED: list[Callable[[], None]] = []


def closes(test: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    @functools.wraps(test)
    async def run() -> None:
        try:
            await test()
        finally:
            while OPENED:
                OPENED.pop()()
    return run


def gateway_end(**kw: Any) -> RecordLink:
    gw = RecordLink(**kw)
    OPENED.append(gw.detach)
    return gw


def watched(intake: RecordIntake) -> RecordIntake:
    OPENED.append(intake.close)
    return intake


async def child(ledger: FlakyLedger) -> tuple[RecordIntake, socket.socket]:
    """A child's intake on one end of a new pair; the gateway's end is returned."""
    ours, theirs = socket.socketpair()
    intake = watched(RecordIntake(recorder(ledger)))
    await intake.start(theirs.detach())
    return intake, ours


async def sent_to_child(recs: list[RequestRecord]
                        ) -> tuple[RecordIntake, socket.socket, RecordLink]:
    """A child on a healthy ledger, a gateway attached to it, and `recs` recorded there."""
    intake, ours = await child(FlakyLedger(fail=0))
    gw = gateway_end()
    gw.attach(ours)
    for rec in recs:
        gw.record(rec)
    return intake, ours, gw


async def until(check: object, what: str, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"{what} not seen"
        await asyncio.sleep(0.005)


@closes
async def test_every_field_the_ledger_uses_crosses_and_a_frame_is_held_until_written() -> None:
    recs = records(40)
    ledger = FlakyLedger(fail=1)
    intake, ours = await child(ledger)
    gw = gateway_end()
    gw.attach(ours)
    for rec in recs:
        gw.record(rec)
    assert gw.unwritten == 40
    await until(lambda: len(intake.recorder._pending) == 40, "the records in the child")

    with pytest.raises(LedgerError):  # the ledger is down: nothing is acknowledged
        await intake.recorder.step()
    await asyncio.sleep(0.05)
    assert gw.unwritten == 40 and {r.request_id for r in gw.unwritten_records()} == {
        r.request_id for r in recs}

    await intake.recorder.flush()  # written: acknowledged, no longer held
    await until(lambda: gw.unwritten == 0, "the acknowledgement")
    # the rows are those a recorder in the gateway would have written from the same records
    direct = FlakyLedger(fail=0)
    here = recorder(direct)
    for rec in recs:
        here.record(rec)
    await here.stop()
    assert ledger.requests == direct.requests
    assert sorted(ledger.work) == sorted(direct.work)
    gw.detach()


@closes
async def test_a_dead_childs_successor_gets_every_record_not_acknowledged() -> None:
    recs = records(30)
    first_ledger, second_ledger = FlakyLedger(fail=0), FlakyLedger(fail=0)
    first, ours = await child(first_ledger)
    gw = gateway_end()
    gw.attach(ours)
    for rec in recs[:10]:
        gw.record(rec)
    await until(lambda: len(first.recorder._pending) == 10, "the first ten in the child")
    await first.recorder.stop()  # these ten are written and acknowledged
    await until(lambda: gw.unwritten == 0, "the first acknowledgement")
    for rec in recs[10:]:
        gw.record(rec)
    await until(lambda: len(first.recorder._pending) == 20, "the next twenty in the child")
    first.close()  # the child dies before writing them
    await until(lambda: not gw.attached, "the gateway noticing")
    assert gw.unwritten == 20

    second, ours = await child(second_ledger)
    gw.attach(ours)
    await until(lambda: len(second.recorder._pending) == 20, "the twenty sent again")
    await second.recorder.stop()
    await until(lambda: gw.unwritten == 0, "the second acknowledgement")
    assert [r.request_id for r in second_ledger.requests] == [r.request_id for r in recs[10:]]
    gw.detach()


@closes
async def test_drain_sends_what_is_queued_and_waits_for_it_to_be_written() -> None:
    recs = records(5)
    ledger = FlakyLedger(fail=0)
    intake, ours = await child(ledger)
    gw = gateway_end()
    gw.attach(ours)
    for rec in recs:
        gw.record(rec)

    async def child_writes() -> None:
        await until(lambda: len(intake.recorder._pending) == 5, "the records in the child")
        intake.recorder.ingest()
        await intake.recorder.flush()

    task = asyncio.create_task(child_writes())
    assert await gw.drain(5.0)
    await task
    assert len(ledger.requests) == 5
    # a child that never writes: drain gives up at its deadline and says so
    gw.record(recs[0])
    assert not await gw.drain(0.2)
    gw.detach()


@closes
async def test_the_child_never_publishes_a_watermark_later_than_the_gateway_could() -> None:
    ledger = FlakyLedger(fail=0)
    intake, ours = await child(ledger)
    clock = [T0_WALL + 100.0]
    gw = gateway_end(clock=lambda: clock[0])
    gw.attach(ours)
    open_since: list[float | None] = [T0_WALL + 50.0]
    gw.watch(lambda: open_since[0])
    gw.step()  # a heartbeat: nothing recorded, the watermark only
    await until(lambda: intake._heard, "the heartbeat")
    assert intake.open_since() == T0_WALL + 50.0  # the gateway's oldest open request
    open_since[0] = None
    clock[0] += link_mod.HEARTBEAT_S
    gw.step()
    await until(lambda: intake._conns[0]._sent_wall == clock[0], "the second heartbeat")
    # nothing open at the gateway then, but a request may have arrived since its last frame
    assert intake.open_since() == clock[0]
    gw.detach()


@closes
async def test_a_frame_the_child_cannot_read_closes_the_link_and_loses_nothing_held() -> None:
    recs = records(3)
    intake, ours, gw = await sent_to_child(recs)
    await until(lambda: len(intake.recorder._pending) == 3, "the records in the child")
    ours.send(link_mod.FRAME_HEAD.pack(5, 99) + b"nope!")  # not a frame of ours
    await until(lambda: intake.closed.is_set(), "the child closing its end")
    await until(lambda: not gw.attached, "the gateway noticing")
    assert gw.unwritten == 3  # held for the next child


@closes
async def test_rows_queued_before_the_link_are_not_taken_for_its_records() -> None:
    """A journal replay whose write failed is still queued when the link starts: writing it
    later must not acknowledge the link's first records."""
    recs = records(5)
    ledger = FlakyLedger(fail=0)
    rec = recorder(ledger)
    for r in recs[:3]:  # the replay, turned into rows, not written
        rec.record(r)
    rec.ingest()
    ours, theirs = socket.socketpair()
    intake = watched(RecordIntake(rec))
    await intake.start(theirs.detach())
    gw = gateway_end()
    gw.attach(ours)
    for r in recs[3:]:
        gw.record(r)
    await until(lambda: len(rec._pending) == 2, "the link's records in the child")
    await rec.flush()  # writes the replay's three rows only
    await asyncio.sleep(0.05)
    assert gw.unwritten == 2
    rec.ingest()
    await rec.flush()
    await until(lambda: gw.unwritten == 0, "the acknowledgement")
    gw.detach()


@closes
async def test_a_record_that_cannot_be_encoded_is_dropped_alone() -> None:
    recs = records(3)
    recs[1] = dataclasses.replace(recs[1], completion_tokens=1 << 70)
    intake, _ours, gw = await sent_to_child(recs)
    await until(lambda: len(intake.recorder._pending) == 2, "the two others in the child")
    assert [r.request_id for r in intake.recorder._pending] == [recs[0].request_id,
                                                               recs[2].request_id]
    gw.detach()


@closes
async def test_a_new_child_holds_the_gateways_floor_until_its_first_frame() -> None:
    recs = records(2)
    gw = gateway_end(clock=lambda: T0_WALL + 1000.0)
    assert gw.floor() == T0_WALL + 1000.0  # nothing open or held: now
    for rec in recs:
        gw.record(rec)
    assert gw.floor() == min(r.arrived_wall_s for r in recs)
    intake = RecordIntake(recorder(FlakyLedger(fail=0)), floor=gw.floor())
    assert intake.open_since() == gw.floor()  # not "nothing open"


@closes
async def test_drain_waits_through_a_child_restart() -> None:
    recs = records(2)
    first, _ours, gw = await sent_to_child(recs)
    await until(lambda: len(first.recorder._pending) == 2, "the records in the child")
    first.close()  # dies before writing them
    await until(lambda: not gw.attached, "the gateway noticing")
    ledger = FlakyLedger(fail=0)

    async def restarted() -> None:
        await asyncio.sleep(0.3)
        second, ours = await child(ledger)
        gw.attach(ours)
        await until(lambda: len(second.recorder._pending) == 2, "the records sent again")
        await second.recorder.stop()

    task = asyncio.create_task(restarted())
    assert await gw.drain(5.0)
    await task
    assert len(ledger.requests) == 2
    gw.detach()


def test_an_engines_token_counts_are_bounded_numbers() -> None:
    from gateway.pipeline.flight import MAX_TOKEN_COUNT, token_count

    assert token_count(12) == 12 and token_count("7") == 7 and token_count(None) == 0
    assert token_count("many") == 0 and token_count(float("inf")) == 0
    assert token_count(float("nan")) == 0 and token_count(-5) == 0
    assert token_count(1 << 70) == MAX_TOKEN_COUNT and token_count(1e300) == MAX_TOKEN_COUNT
