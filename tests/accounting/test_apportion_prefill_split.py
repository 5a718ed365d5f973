"""A request's first token comes out of its prompt's last step, and a long prompt's prefill is
weighed over its own time: neither bills the first token as a decode step, nor makes the
decode beside a batch look as if it ran alone."""

from __future__ import annotations

import dataclasses
import math

import pytest

from accounting.apportion import apportion
from accounting.heads import SPLIT_S
from accounting.prefill import CHUNK_TOKENS
from accounting.work import WorkRow, work_rows
from tests.accounting.test_accounting_work import record


def _rows(**kw: object) -> dict[int, WorkRow]:
    return {r.interval_idx: r for r in map(WorkRow._make, work_rows(record(**kw), 1.0, 4000.0))}


def test_the_first_token_is_not_a_decode_token() -> None:
    """8 tokens out, over 4 token events: the first came with the prompt's last step, so 7
    are decoded, the first event's interval one fewer."""
    rows = _rows()
    assert math.fsum(r.decode_tokens for r in rows.values()) == pytest.approx(7.0)
    assert [rows[k].decode_tokens for k in sorted(rows)] == pytest.approx([1.0, 4.0, 2.0])
    one = _rows(completion_tokens=1, read_times=(1.5,), read_events=(1,), finished_s=1.5)
    assert [r.decode_tokens for r in one.values()] == [0.0]
    assert one[1001].prefill_tokens == 1000


def test_a_request_with_one_token_out_pays_no_decode() -> None:
    """Two requests with the same prompt and span, one answered with 1 token, one with 3: the
    first pays its prompt only, the second its prompt and 2 decoded tokens."""
    base = record(first_token_s=0.5, finished_s=0.9, read_times=(0.5, 0.7, 0.9),
                  read_events=(1, 1, 1), prompt_tokens=100, completion_tokens=3)
    one = dataclasses.replace(base, request_id="one", completion_tokens=1, read_times=(0.5,),
                              read_events=(1,))
    rows = [*work_rows(base, 1.0, 4000.0), *work_rows(one, 1.0, 4000.0)]
    a = apportion(100.0, 1.0, 0.0, rows, 0.1, 1.0)
    dyn = dict(zip(a.columns.request_ids, a.columns.dynamic_j, strict=True))
    assert dyn["r"] / dyn["one"] == pytest.approx((0.1 * 100 + 2.0) / (0.1 * 100))


def _long_prompt_interval(prefill_s: float) -> list[WorkRow]:
    """A 12,000-token prompt read alone over 0.0-0.4 s, then 50 tokens decoded beside four
    decoders of 50 tokens each that came at 0.4 s."""
    return [WorkRow("long", 0, 12_000.0, 50.0, 1.0, 0.0, 0.0, prefill_s),
            *(WorkRow(f"d{i}", 0, 0.0, 50.0, 0.6, 0.4) for i in range(4))]


def _step_shares(rows: list[WorkRow]) -> dict[str, float]:
    # token work negligible beside the steps (1 J each): the dynamic energy goes by steps
    a = apportion(100.0, 1.0, 0.0, rows, 1e-12, 1e-12, delta=1.0, instant=True)
    assert math.fsum(a.columns.energy_j) + a.idle_j == pytest.approx(100.0, rel=1e-12)
    return {r: e / a.dynamic_j for r, e in zip(a.columns.request_ids, a.columns.dynamic_j,
                                               strict=True)}


def test_a_long_prompts_prefill_does_not_dilute_the_intervals_decode_steps() -> None:
    """Each decoder ran 50 steps in a batch of 5: 10 steps' worth; the long request ran its
    chunks alone (12,000 / 8,192 steps) and its decode in the same batches (10). Weighing its
    50 decode steps over its whole span, prefill included (mean 1/n of 0.52, not 0.2), made
    the interval 66.8 steps instead of 51.5 and billed every decoder 0.15 of it, not 0.19."""
    chunks = 12_000.0 / CHUNK_TOKENS
    total = chunks + 10.0 + 4 * 10.0
    shares = _step_shares(_long_prompt_interval(0.4))
    assert shares["long"] == pytest.approx((chunks + 10.0) / total, rel=1e-6)
    for i in range(4):
        assert shares[f"d{i}"] == pytest.approx(10.0 / total, rel=1e-6)


def test_a_row_without_prefill_seconds_weighs_its_steps_over_its_whole_span() -> None:
    """Rows written before the prefill's seconds were kept read as 0: as they were billed."""
    old_long = (0.4 + 0.6 / 5) * (50.0 + 12_000.0 / CHUNK_TOKENS)
    shares = _step_shares(_long_prompt_interval(0.0))
    assert shares["d0"] == pytest.approx(10.0 / (old_long + 40.0), rel=1e-6)


def test_work_rows_carry_the_prefills_seconds_in_each_interval() -> None:
    """1,000 prompt tokens at 4,000 tok/s: 1001.25..1001.5, the first 0.25 s of the row's
    0.75 s, its head with no decode in it; a prefill across an interval's end is split at
    it."""
    rows = _rows()
    assert rows[1001].head_s == pytest.approx(0.25) and rows[1001].head_decode == 0.0
    # even-paced decode after it: each row's whole span is its head, with all its decode
    assert [(rows[k].head_s, rows[k].head_decode) for k in (1002, 1003)] == [
        (rows[k].residency_s, rows[k].decode_tokens) for k in (1002, 1003)]
    split = _rows(first_token_s=1.1, read_times=(1.1, 2.2, 3.5))
    assert split[1000].head_s == pytest.approx(0.15)  # 1000.85..1001.0
    assert split[1001].head_s == pytest.approx(0.1)  # 1001.0..1001.1
    assert split[1001].start_s == 0.0


def test_a_prefill_of_a_few_milliseconds_is_weighed_over_the_whole_span() -> None:
    """A head shorter than SPLIT_S measures the gateway's timing jitter, not the batch the
    prompt was read in: the row is weighed as one without a head."""
    rows = [WorkRow("short", 0, 8.0, 1.0, 0.5, 0.0, 0.0, 0.002),
            *(WorkRow(f"d{i}", 0, 0.0, 50.0, 0.6, 0.4) for i in range(4))]
    assert SPLIT_S > 0.002
    same = [rows[0]._replace(head_s=0.0), *rows[1:]]
    assert _step_shares(rows) == _step_shares(same)
