"""The prefill rate each engine is learnt at, from the gateway's own records."""

from __future__ import annotations

import dataclasses
import random

import pytest

from accounting.prefill import (
    DEFAULT_TOKENS_PER_S,
    MIN_SAMPLES,
    QUANTILE,
    WINDOW,
    PrefillRates,
)
from core.records import RequestRecord
from core.timing import latency


def rec(prompt: int, ttft_from_dispatch_s: float, **kw: object) -> RequestRecord:
    base = RequestRecord(
        request_id="r", tenant="t", model="m", engine="e", precision="bf16", slo_class="d",
        status="ok", http_status=200, stream=True, arrived_wall_s=0.0, arrived_s=0.0,
        dispatched_s=1.0, first_byte_s=1.0, first_token_s=1.0 + ttft_from_dispatch_s,
        finished_s=5.0, read_times=(1.0 + ttft_from_dispatch_s,), read_events=(1,),
        prompt_tokens=prompt, completion_tokens=1, attempts=1,
        latency=latency(0.0, (), 0, 5.0), slo_met=True)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_default_until_enough_samples_then_a_high_quantile_of_them() -> None:
    rates = PrefillRates()
    for _ in range(MIN_SAMPLES - 1):
        rates.observe(rec(10_000, 1.0))
    assert rates.rate("e") == DEFAULT_TOKENS_PER_S
    # queueing makes most samples slow; the fastest tenth is the engine's own rate
    for i in range(60):
        rates.observe(rec(10_000, 0.5 if i % 6 == 0 else 2.0 + i / 10))
    assert rates.rate("e") == pytest.approx(20_000.0)
    assert rates.rate("other") == DEFAULT_TOKENS_PER_S


def test_only_engine_counted_long_prompts_with_a_first_token_teach() -> None:
    rates = PrefillRates(default_tokens_per_s=1.0)
    for _ in range(3 * MIN_SAMPLES):
        rates.observe(rec(50, 0.01))  # short prompt: fixed step costs dominate
        rates.observe(rec(10_000, 0.1, prompt_source="gateway"))  # no engine usage
        rates.observe(rec(10_000, 0.1, first_token_s=None))  # no first token
    assert rates.rate("e") == 1.0 and rates.learnt() == {}


def test_rate_follows_the_engine_when_it_changes() -> None:
    rates = PrefillRates()
    for _ in range(64):
        rates.observe(rec(8_000, 1.0))
    assert rates.rate("e") == 8_000.0
    for _ in range(64):
        rates.observe(rec(8_000, 0.1))
    assert rates.rate("e") == pytest.approx(80_000.0)


def test_each_prompt_length_has_its_own_rate_and_unlearnt_ones_take_the_nearest() -> None:
    """Long prompts prefill slower (attention): 30k tokens are not placed at the pace of 3k."""
    rates = PrefillRates()
    for _ in range(MIN_SAMPLES):
        rates.observe(rec(3_000, 3_000 / 36_000))
        rates.observe(rec(30_000, 30_000 / 24_000))
    assert rates.rate("e", 3_000) == pytest.approx(36_000)
    assert rates.rate("e", 30_000) == pytest.approx(24_000)
    assert rates.rate("e", 2_500) == pytest.approx(36_000)  # same power-of-two class
    assert rates.rate("e", 6_000) == pytest.approx(36_000)  # nearest learnt class
    assert rates.rate("e", 60_000) == pytest.approx(24_000)


def test_decode_pace_is_the_median_of_recent_tpots() -> None:
    rates = PrefillRates(default_tpot_s=0.5)
    assert rates.tpot("e") == 0.5
    for tpot in (0.01, 0.02, 0.03):
        rates.observe(rec(10, 0.1, latency=latency(0.0, ((1.0, 1), (1.0 + 9 * tpot, 1)), 10,
                                                   None)))
    assert rates.tpot("e") == pytest.approx(0.02)


def test_the_rate_is_the_quantile_of_the_window_of_recent_samples_as_they_come_and_go() -> None:
    """Over many samples, some equal, the window sliding: each rate learnt is the quantile
    of the last WINDOW samples of its length class, sorted."""
    rnd = random.Random(5)
    rates = PrefillRates()
    seen: dict[int, list[float]] = {}
    for i in range(400):
        prompt = rnd.choice((200, 300, 5_000))
        span_s = rnd.choice((0.25, 0.5, 1.0, 0.125 + i / 1000))
        rates.observe(rec(prompt, span_s))
        window = seen.setdefault(prompt.bit_length(), [])
        window.append(prompt / ((1.0 + span_s) - 1.0))  # the span as the record gives it
        del window[:-WINDOW]
        if len(window) >= MIN_SAMPLES:
            ordered = sorted(window)
            assert rates.rate("e", prompt) == ordered[min(len(ordered) - 1,
                                                          int(QUANTILE * len(ordered)))]


def test_a_prompt_without_a_first_token_is_read_no_slower_than_shorter_one_chunk_prompts() -> None:
    """A class learnt slower than a shorter one (a queued burst's samples) does not spread a
    non-streamed prompt's reading over the queueing; a streamed prompt keeps its class's
    rate (its first token places it), and prompts longer than a chunk keep theirs."""
    rates = PrefillRates()
    for _ in range(MIN_SAMPLES):
        rates.observe(rec(200, 200 / 25_000))  # read alone
        rates.observe(rec(700, 700 / 3_200))  # queued behind a burst's other prompts
        rates.observe(rec(3_000, 3_000 / 36_000))
        rates.observe(rec(30_000, 30_000 / 24_000))
    assert rates.rate("e", 700) == pytest.approx(3_200)
    assert rates.rate("e", 700, stepped=False) == pytest.approx(25_000)
    assert rates.rate("e", 400, stepped=False) == pytest.approx(25_000)  # nearest: 700's
    assert rates.rate("e", 3_000, stepped=False) == pytest.approx(36_000)
    assert rates.rate("e", 30_000, stepped=False) == pytest.approx(24_000)  # many chunks
    assert rates.rate("e", 200, stepped=False) == pytest.approx(25_000)
