"""Long prompts queued behind others are read first come, first served, as one stream of
tokens cut into steps of CHUNK_TOKENS (accounting/queued.py): from the records of the prompts
read before it, a queued prompt's chunks are placed in the engine's own steps."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.config import JournalConfig, LedgerConfig
from accounting.journal import recover
from accounting.prefill import CHUNK_TOKENS
from accounting.queued import QueuedPrompts
from accounting.recorder import LedgerRecorder
from accounting.work import Work, WorkRow, spread, work_rows
from core.records import RequestRecord
from tests.accounting.test_accounting_accuracy import T0_WALL
from tests.accounting.test_accounting_recorder import FlakyLedger
from tests.accounting.test_accounting_work import record
from tests.accounting.test_ledger_sqlite import Clock, make_config

Steps = list[list[tuple[int, float, float, float]]]  # per prompt: (step, tokens, start, end)


def fcfs(prompts: list[int], fixed_s: float, per_token_s: float, gap_s: float = 0.001,
         wall0: float = 1000.0) -> tuple[list[RequestRecord], Steps]:
    """An engine reading prompts dispatched `gap_s` apart first come, first served, up to
    CHUNK_TOKENS a step, each step `fixed_s` plus `per_token_s` a token: the records the
    gateway writes (first token at the end of a prompt's last step, `step_from_s` the end of
    the step before it) and each prompt's tokens per step."""
    left = [float(p) for p in prompts]
    read: Steps = [[] for _ in prompts]
    ends: list[float] = []
    t, i, step = 0.0, 0, 0
    while i < len(prompts):
        budget, took = CHUNK_TOKENS, []
        while i < len(prompts) and budget > 0.0:
            n = min(left[i], budget)
            took.append((i, n))
            left[i] -= n
            budget -= n
            if left[i] == 0.0:
                i += 1
        end = t + fixed_s + per_token_s * (CHUNK_TOKENS - budget)
        for j, n in took:
            read[j].append((step, n, t, end))
        ends.append(end)
        t, step = end, step + 1
    recs = []
    for j, p in enumerate(prompts):
        last = read[j][-1]
        ft = last[3]
        recs.append(record(request_id=f"p{j}", arrived_s=j * gap_s, dispatched_s=j * gap_s,
                           first_byte_s=ft, first_token_s=ft, finished_s=ft + 0.05,
                           read_times=(ft, ft + 0.05), read_events=(1, 1), prompt_tokens=p,
                           completion_tokens=2, arrived_wall_s=wall0 + j * gap_s,
                           step_from_s=last[2] if last[0] else None))
    return recs, read


@settings(max_examples=200, deadline=None)
@given(prompts=st.lists(st.integers(8193, 40_000), min_size=2, max_size=6),
       fixed_s=st.floats(0.005, 0.05), per_token_s=st.floats(1e-5, 4e-5))
def test_queued_prompts_are_placed_in_the_engines_steps(prompts: list[int], fixed_s: float,
                                                        per_token_s: float) -> None:
    recs, read = fcfs(prompts, fixed_s, per_token_s)
    rate = CHUNK_TOKENS / (fixed_s + per_token_s * CHUNK_TOKENS)
    places = QueuedPrompts()
    got = [places.place(rec, rate) for rec in recs]  # in order of dispatch
    for j in range(len(prompts)):
        chunks = got[j]
        if j == 0 and chunks is None:  # read in about its own time: placed by its record
            continue
        assert chunks is not None
        want = [(n, 1000.0 + a, 1000.0 + b) for _, n, a, b in read[j]]
        assert [c[0] for c in chunks] == pytest.approx([w[0] for w in want])
        assert [c[1] for c in chunks] == pytest.approx([w[1] for w in want], abs=1e-9)
        assert [c[2] for c in chunks] == pytest.approx([w[2] for w in want], abs=1e-9)
        assert math.fsum(c[0] for c in chunks) == pytest.approx(prompts[j])


def test_an_interval_holds_the_tokens_the_engine_read_in_it() -> None:
    """Three prompts of 11,411, 13,878 and 15,940 tokens 0.05 s apart (the wave of
    bench.accounting_strategies): the second's first 4,973 tokens shared the step that read
    the first's last 3,219, and its last 713 the step of the third's first 7,479; an interval
    begins 0.17 s into its second step. Placed by its own record (its reading ended half way
    through its last step, at one rate) the interval before held 8,095 of its tokens where
    the engine read 10,649 in it; placed in the engine's steps, each interval holds what the
    engine read in it."""
    recs, read = fcfs([11411, 13878, 15940], 0.012, 2.8e-5, gap_s=0.05, wall0=1000.35)
    rate = CHUNK_TOKENS / (0.012 + 2.8e-5 * CHUNK_TOKENS)
    places = QueuedPrompts()
    chunks = [places.place(rec, rate) for rec in recs]
    truth: dict[int, float] = {}
    for _, n, a, b in read[1]:
        spread(n, 1000.35 + a, 1000.35 + b, 1.0, truth)
    new = {r.interval_idx: r.prefill_tokens
           for r in map(WorkRow._make, work_rows(recs[1], 1.0, rate, chunks=chunks[1]))}
    old = {r.interval_idx: r.prefill_tokens
           for r in map(WorkRow._make, work_rows(recs[1], 1.0, rate))}
    assert set(truth) == {1000, 1001}
    assert new[1000] == pytest.approx(truth[1000]) and new[1001] == pytest.approx(truth[1001])
    assert abs(old.get(1000, 0.0) - truth[1000]) > 1000.0


def test_the_first_prompt_of_a_queue_holds_its_tail_in_its_last_step() -> None:
    """13,608 tokens then 10,148 (the second round's wave): the first read 8,192 in a step of
    its own and its last 5,416 in the step that also read the second's first 2,776; its
    first token came after its reading time plus a quarter of a chunk's, so its own record
    ended its reading half way through that last step. Its chunks are the engine's steps: a
    whole chunk from its dispatch, its tail over the step it shared."""
    recs, read = fcfs([13608, 10148], 0.012, 2.8e-5)
    rate = CHUNK_TOKENS / (0.012 + 2.8e-5 * CHUNK_TOKENS)
    chunks = QueuedPrompts().place(recs[0], rate)
    assert chunks is not None
    want = [(n, 1000.0 + a, 1000.0 + b) for _, n, a, b in read[0]]
    assert [c[0] for c in chunks] == [w[0] for w in want] == [8192.0, 5416.0]
    assert [c[1] for c in chunks] == pytest.approx([w[1] for w in want], abs=1e-9)
    assert [c[2] for c in chunks] == pytest.approx([w[2] for w in want], abs=1e-9)


def test_a_prompt_read_from_its_dispatch_keeps_its_own_placement() -> None:
    """A long prompt whose first token came after about its own reading time (no prompt
    before it, or one it did not wait for) is placed by its own record, as before."""
    rec = record(prompt_tokens=12000, dispatched_s=0.5, first_token_s=0.9, first_byte_s=0.9,
                 step_from_s=0.75, read_times=(0.9, 1.0), read_events=(1, 1))
    assert QueuedPrompts().place(rec, 30_000.0) is None


async def test_the_recorder_holds_a_queued_prompt_until_those_before_it_are_recorded() -> None:
    """The third prompt of a queue finishes first (one token out): its record waits until the
    gateways' watermark passes its dispatch, so the records of the two read before it are in;
    it is then placed as if the records had come in order of dispatch, and its frame is not
    acknowledged before it is written (`records_written` counts in recording order). Each
    waits for the requests open since before its dispatch, the first one too (its last step
    was the second's first)."""
    recs, _ = fcfs([11411, 13878, 15940], 0.012, 4.85e-5, gap_s=0.05)
    rate = 20_000.0  # the recorder's rate before it has learnt one (DEFAULT_TOKENS_PER_S)
    places = QueuedPrompts()
    want = {rec.request_id: work_rows(rec, 1.0, rate, chunks=places.place(rec, rate))
            for rec in recs}
    assert want["p2"] != work_rows(recs[2], 1.0, rate)
    config = dataclasses.replace(make_config(), journal=JournalConfig(enabled=False))
    ledger = FlakyLedger(fail=0)
    recorder = LedgerRecorder(config, ledger, "r1", clock=Clock(T0_WALL))  # type: ignore[arg-type]
    open_since: list[float | None] = [recs[1].arrived_wall_s]  # the second still open
    recorder.watch(lambda: open_since[0])
    recorder.record(recs[2])
    await recorder.step()
    await recorder.flush()
    assert ledger.requests == [] and recorder.records_written == 0 and recorder.queued == 1
    recorder.record(recs[0])  # dispatched before anything still open: placed now
    await recorder.step()
    await recorder.flush()
    assert [r.request_id for r in ledger.requests] == ["p0"]
    assert recorder.records_written == 0 and recorder.queued == 2  # p2 came first
    recorder.record(recs[1])
    open_since[0] = None
    await recorder.step()
    await recorder.flush()
    assert recorder.records_written == 3 and recorder.queued == 0
    got: dict[str, list[Work]] = {}
    for _, row in ledger.work:
        got.setdefault(row[0], []).append(row)
    assert got == want


async def test_a_held_record_stays_in_the_journal_until_it_is_written(tmp_path: Path) -> None:
    """The records written after a held one release their journal segments, not the held
    one's: a crash while it waits replays it at the next start."""
    recs, _ = fcfs([11411, 13878, 15940], 0.012, 4.85e-5, gap_s=0.05)
    config = dataclasses.replace(
        make_config(), ledger=LedgerConfig(path=str(tmp_path / "l.db")),
        journal=JournalConfig(enabled=True, fsync_s=0.001))
    recorder = LedgerRecorder(config, FlakyLedger(fail=0), "r1",  # type: ignore[arg-type]
                              clock=Clock(T0_WALL))
    journal = recorder.journal
    assert journal is not None
    journal.owner = "gone"
    await asyncio.to_thread(journal.open)
    recorder.watch(lambda: recs[1].arrived_wall_s)  # the second never finishes: a crash
    recorder.record(recs[2])
    await recorder.step()
    await recorder.flush()
    recorder.record(recs[0])
    await recorder.step()
    await recorder.flush()
    await asyncio.to_thread(journal.close)
    found = recover(Path(config.journal.directory(config.ledger)))
    assert "p2" in [r.request_id for r in found.records]


async def test_without_a_hold_each_record_is_placed_by_itself() -> None:
    """`hold_s: 0`: nothing waits, and a queued prompt is placed by its own record (placed
    with the records come so far, in no order of reading, the chain was worse than that)."""
    recs, _ = fcfs([11411, 13878, 15940], 0.012, 4.85e-5, gap_s=0.05)
    config = dataclasses.replace(make_config(), hold_s=0.0,
                                 journal=JournalConfig(enabled=False))
    ledger = FlakyLedger(fail=0)
    recorder = LedgerRecorder(config, ledger, "r1", clock=Clock(T0_WALL))  # type: ignore[arg-type]
    recorder.watch(lambda: recs[1].arrived_wall_s)
    for rec in (recs[2], recs[0], recs[1]):
        recorder.record(rec)
        await recorder.step()
    await recorder.flush()
    got: dict[str, list[Work]] = {}
    for _, row in ledger.work:
        got.setdefault(row[0], []).append(row)
    assert got == {rec.request_id: work_rows(rec, 1.0, 20_000.0) for rec in recs}
