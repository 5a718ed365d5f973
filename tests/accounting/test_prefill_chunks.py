"""A prompt longer than one chunk is read chunk by chunk, one step each, each step as long
as its work (accounting/prefill.py, `chunk_spans`): its tokens are placed so."""

from __future__ import annotations

import math

import pytest

from accounting.prefill import ATTENTION_PER_CONTEXT, CHUNK_TOKENS, chunk_spans
from accounting.work import WorkRow, work_rows
from tests.accounting.test_accounting_work import record


def test_a_prompt_of_one_chunk_is_one_span() -> None:
    assert chunk_spans(8192.0, 1.0, 1.2) == [(8192.0, 1.0, 1.2)]
    assert chunk_spans(500.0, 1.0, 1.0) == [(500.0, 1.0, 1.0)]


def test_the_last_chunk_holds_the_rest_over_its_own_work() -> None:
    """12,000 tokens over 0.4 s: 8,192 then 3,808, each as long as its GEMMs plus its
    attention over the context before it (the simulated H100 read them in 0.242 and 0.148 s,
    the second beside 30 prompts of 8 tokens)."""
    spans = chunk_spans(12000.0, 10.0, 10.4)
    assert [s[0] for s in spans] == [CHUNK_TOKENS, 12000.0 - CHUNK_TOKENS]
    w1 = 8192 * (1 + ATTENTION_PER_CONTEXT * 4096)
    w2 = 3808 * (1 + ATTENTION_PER_CONTEXT * (8192 + 1904))
    assert spans[0][1] == 10.0 and spans[1][2] == 10.4 and spans[0][2] == spans[1][1]
    assert spans[1][2] - spans[1][1] == pytest.approx(0.4 * w2 / (w1 + w2))
    assert 0.14 < spans[1][2] - spans[1][1] < 0.15


def test_an_interval_that_begins_between_two_chunks_holds_the_last_one() -> None:
    """The prompt's second step, 3,808 tokens, lies wholly in the interval after the first
    step: that interval holds those tokens, not 12,000 x its share of the reading time (4,390:
    600 of the first step's tokens, billed to its requests' interval)."""
    rate = 12000 / 0.4
    second = chunk_spans(12000.0, 0.0, 0.4)[1]
    t_first = 1.0 + (second[2] - second[1])  # the interval 1001 begins as the last step does
    rec = record(arrived_wall_s=1000.0, arrived_s=0.0, dispatched_s=t_first - 0.5,
                 first_byte_s=t_first, first_token_s=t_first, finished_s=t_first + 0.2,
                 read_times=(t_first, t_first + 0.2), read_events=(1, 1), prompt_tokens=12000,
                 completion_tokens=2)
    rows = {r.interval_idx: r for r in map(WorkRow._make, work_rows(rec, 1.0, rate))}
    assert rows[1001].prefill_tokens == pytest.approx(12000 - CHUNK_TOKENS)
    assert rows[1000].prefill_tokens == pytest.approx(CHUNK_TOKENS)
    assert math.fsum(r.prefill_tokens for r in rows.values()) == pytest.approx(12000)
