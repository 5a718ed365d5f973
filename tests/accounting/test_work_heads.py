"""A work row is cut where its pace changes: a decoder that ran alone, then beside a burst,
is billed the steps it ran alone, not an even share of the interval's batches."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from accounting import heads
from accounting.apportion import apportion
from accounting.work import WorkRow, work_rows
from tests.accounting.test_accounting_work import record

# A decoder alone: 41 tokens 7 ms apart from 1000.13; a burst joins at 1000.42: 10 tokens in
# two long chunk steps and then 9.2-ms steps beside 30 others, until 1000.87.
ALONE = tuple(0.13 + 0.007 * i for i in range(41))
JOINED = (0.52, 0.72, *(0.72 + 0.0092 * (i + 1) for i in range(8)))


def _decoder() -> WorkRow:
    times = ALONE + JOINED
    rec = record(prompt_tokens=36, completion_tokens=len(times), dispatched_s=0.12,
                 first_token_s=times[0], read_times=times, read_events=(1,) * len(times),
                 finished_s=times[-1])
    (row,) = map(WorkRow._make, work_rows(rec, 1.0, 24_000.0))
    return row


def test_a_decoder_joined_by_a_burst_is_cut_where_its_pace_changed() -> None:
    """The head ends at its last token alone (1000.41) and holds the 40 tokens it decoded
    alone (41 events less the first token, which came with its prompt)."""
    row = _decoder()
    assert row.decode_tokens == pytest.approx(50.0)
    assert row.start_s + row.head_s == pytest.approx(ALONE[-1])
    assert row.head_decode == pytest.approx(40.0)


def test_an_even_stream_s_head_is_its_whole_span_and_a_non_streamed_request_has_none() -> None:
    """Tokens every 10 ms over the interval: no change of pace, a head of the whole span with
    all its decode (weighed as none, its tokens' times seen); the same request without token
    events has no head (its decode is spread by assumption)."""
    times = tuple(0.1 + 0.01 * i for i in range(80))
    rec = record(prompt_tokens=36, completion_tokens=80, dispatched_s=0.09,
                 first_token_s=times[0], read_times=times, read_events=(1,) * 80,
                 finished_s=times[-1])
    (row,) = map(WorkRow._make, work_rows(rec, 1.0, 24_000.0))
    assert row.head_s == row.residency_s and row.head_decode == row.decode_tokens > 0.0
    blind = dataclasses.replace(rec, stream=False, first_token_s=None, read_times=(),
                                read_events=())
    (row,) = map(WorkRow._make, work_rows(blind, 1.0, 24_000.0))
    assert row.decode_tokens > 0.0 and row.head_s < heads.SPLIT_S and row.head_decode == 0.0


def test_the_head_bills_the_decoder_its_solo_steps() -> None:
    """Steps' energy only (token work negligible): the decoder ran 40 steps alone and 10
    beside 30 burst requests (10 / 31 of a step each, the burst the rest). Weighed evenly
    over its 0.74 s it was counted about 23 steps; with the head, 40 + 10 / 31."""
    row = _decoder()
    burst = [WorkRow(f"b{i}", 0, 500.0, 9.0, 0.45, 0.42, 0.0) for i in range(30)]
    a = apportion(100.0, 1.0, 0.0, [row, *burst], 1e-12, 1e-12, delta=1.0, instant=True)
    got = dict(zip(a.columns.request_ids, a.columns.dynamic_j, strict=True))
    decoder_steps = 40.0 + 10.0 / 31.0
    burst_steps = 30 * (1.0 + 9.0) / 31.0  # each: its chunk and 9 tokens in batches of 31
    assert got[row.request_id] / a.dynamic_j == pytest.approx(
        decoder_steps / (decoder_steps + burst_steps), rel=0.02)
    # evenly: the mean of 1/batch over its span (alone until 1000.42, then 1 of 31) x 50
    lo = row.start_s
    even_steps = ((0.42 - lo) + (lo + row.residency_s - 0.42) / 31.0) * 50.0 / row.residency_s
    even = apportion(100.0, 1.0, 0.0, [row._replace(head_s=0.0, head_decode=0.0), *burst],
                     1e-12, 1e-12, delta=1.0, instant=True)
    assert even.columns.dynamic_j[0] / even.dynamic_j == pytest.approx(
        even_steps / (even_steps + burst_steps), rel=0.02)
    assert even_steps < 0.6 * decoder_steps


def test_the_compiled_cut_is_the_pythons() -> None:
    """The C module's cusum_split performs heads.cusum_split's operations: same results."""
    compiled = pytest.importorskip("accounting._streamed").cusum_split
    rnd = random.Random(5)
    for _ in range(300):
        n = rnd.randint(0, 60)
        times = tuple(sorted(rnd.uniform(0.0, 2.0) for _ in range(n)))
        ev = [rnd.randint(1, 3) for _ in range(n)]
        cum = [sum(ev[:i + 1]) for i in range(n)] if rnd.random() < 0.5 else None
        off = rnd.choice([0.0, 1000.0])
        s = off + rnd.uniform(-0.2, 1.0)
        e = s + rnd.uniform(0.0, 1.5)
        want = heads.cusum_split(times, cum, off, s, e)
        got = compiled(times, cum, off, s, e)
        assert got == want or (got is not None and want is not None
                               and got[:2] == want[:2] and math.isclose(got[2], want[2]))
