"""TTFT/TPOT/ITL/E2E definitions (vllm bench serve) and SLO grading."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.timing import itl_gaps, latency, latency_of, slo_met, split_reads
from gateway.config import SloClass


def test_stream_latency_uses_token_events_and_usage_count() -> None:
    # first token at 0.2 s; 3 events at 0.2, 0.3 (2 events in one read), 0.5; 9 tokens
    lat = latency(0.0, [(0.2, 1), (0.3, 2), (0.5, 1)], completion_tokens=9, end_s=0.6)
    assert lat.ttft_s == pytest.approx(0.2)
    assert lat.tpot_s == pytest.approx(0.3 / 8)  # from usage tokens, not from 4 events
    assert lat.e2e_s == pytest.approx(0.5)
    assert lat.itl_s == pytest.approx((0.1, 0.0, 0.2))
    assert lat.itl_norm_s == pytest.approx(tuple(g / (8 / 3) for g in (0.1, 0.0, 0.2)))


def test_non_stream_latency() -> None:
    lat = latency(1.0, [], completion_tokens=5, end_s=1.5)
    assert lat.e2e_s == pytest.approx(0.5) and lat.ttft_s == pytest.approx(0.5)
    assert lat.tpot_s is None


def test_slo_grading() -> None:
    slo = SloClass("i", ttft_s=0.5, tpot_s=0.05)
    good = latency(0.0, [(0.4, 1), (0.44, 1)], 2, None)
    slow = latency(0.0, [(0.6, 1), (0.64, 1)], 2, None)
    assert slo_met(slo, good, ok=True)
    assert not slo_met(slo, slow, ok=True)
    assert not slo_met(slo, good, ok=False)


@given(st.lists(st.tuples(st.floats(0, 1e3, allow_nan=False), st.integers(1, 5)), max_size=20))
def test_itl_gaps_equal_the_per_event_definition(reads: list[tuple[float, int]]) -> None:
    reads = sorted(reads)
    events = [t for t, n in reads for _ in range(n)]  # one timestamp per token-bearing event
    per_event = [b - a for a, b in itertools.pairwise(events)]
    assert itl_gaps(*split_reads(reads)) == pytest.approx(per_event)


def test_one_event_per_read_takes_the_gap_pass_and_keeps_per_token_gaps() -> None:
    times, events = (0.2, 0.25, 0.4, 0.41), (1, 1, 1, 1)
    lat = latency_of(0.0, times, events, completion_tokens=4, end_s=0.5)
    assert lat.itl_s == pytest.approx((0.05, 0.15, 0.01))
    assert lat.itl_norm_s is lat.itl_s  # one token per event: the same gaps, not a copy
    # Two tokens per event: every gap halved.
    lat2 = latency_of(0.0, times, events, completion_tokens=7, end_s=0.5)
    assert lat2.itl_norm_s == pytest.approx((0.025, 0.075, 0.005))
    assert itl_gaps(times, (1, 2, 1, 1)) == pytest.approx([0.05, 0.0, 0.15, 0.01])
