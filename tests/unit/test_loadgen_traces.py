"""Trace replay: the three public formats parse (from samples our own generator writes), time
scaling keeps the burst structure, de-quantisation spreads bucketed rows, superposition labels
tenants, and a trace workload replays its rows."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from loadgen import traces
from loadgen.arrivals import gap_stats
from loadgen.workload import TenantSpec, Workload, build_plan, from_mapping


@pytest.mark.parametrize("fmt", traces.FORMATS)
def test_sample_traces_parse_back_sorted_from_zero(fmt: str) -> None:
    rows = traces.PARSERS[fmt](traces.sample_text(fmt, 300, seed=2))
    assert len(rows) == 300
    assert rows[0].offset_s == 0.0
    assert [r.offset_s for r in rows] == sorted(r.offset_s for r in rows)
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in rows)


def test_azure_timestamps_with_seven_fraction_digits_parse() -> None:
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:15:46.6805900,100,10\n2023-11-16 18:15:47.1805900,200,20\n")
    rows = traces.parse_azure(text)
    assert rows[1].offset_s == pytest.approx(0.5)
    assert (rows[1].prompt_tokens, rows[1].output_tokens) == (200, 20)


def test_burstgpt_skips_failed_calls_unless_asked() -> None:
    text = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,10,0,10,Conversation log\n7,GPT-4,20,30,50,Conversation log\n")
    assert len(traces.parse_burstgpt(text)) == 1
    assert len(traces.parse_burstgpt(text, include_failures=True)) == 2


def test_time_scaling_keeps_the_gap_cv() -> None:
    rows = traces.parse_azure(traces.sample_text("azure", 2000, seed=1))
    fast = traces.scale_time(rows, 10.0)
    m1, cv1 = gap_stats([r.offset_s for r in rows])
    m10, cv10 = gap_stats([r.offset_s for r in fast])
    assert m10 == pytest.approx(m1 / 10)
    assert cv10 == pytest.approx(cv1)
    assert cv1 > 1.5  # the sample is bursty, like the public code trace


def test_mooncake_buckets_are_detected_and_spread_within_each_bucket() -> None:
    rows = traces.parse_mooncake(traces.sample_text("mooncake", 500, seed=3))
    assert traces.detect_bucket_s(rows) == pytest.approx(3.0)
    spread = traces.dequantize(rows, 3.0, random.Random(1))
    assert len(spread) == len(rows)
    assert [r.offset_s for r in spread] == sorted(r.offset_s for r in spread)
    # Every row stays inside its own bucket and the bursts are broken up.
    before = sorted((r.offset_s, r.prompt_tokens) for r in rows)
    assert sorted((int(r.offset_s // 3.0) * 3.0, r.prompt_tokens) for r in spread) == before
    assert len({r.offset_s for r in spread}) == len(spread)


def test_unbucketed_traces_are_left_alone() -> None:
    rows = traces.parse_burstgpt(traces.sample_text("burstgpt", 200))
    assert traces.detect_bucket_s(rows) == 0.0


def test_superposition_labels_rows_by_tenant_and_merges_in_time() -> None:
    a = traces.parse_burstgpt(traces.sample_text("burstgpt", 50, seed=1))
    b = traces.parse_azure(traces.sample_text("azure", 50, seed=2))
    merged = traces.superpose([("a", a), ("b", b)])
    assert len(merged) == 100
    assert {r.tenant for r in merged} == {"a", "b"}
    assert [r.offset_s for r in merged] == sorted(r.offset_s for r in merged)


def test_trace_workload_replays_rows_as_two_tenants(tmp_path: Path) -> None:
    (tmp_path / "m.jsonl").write_text(traces.sample_text("mooncake", 120, seed=4))
    (tmp_path / "b.csv").write_text(traces.sample_text("burstgpt", 80, seed=5))
    w = Workload(model="m", arrival=None, seed=9, tenants=(
        TenantSpec("moon", api_key="k1"), TenantSpec("burst", api_key="k2")), traces=(
        traces.TraceSpec(tmp_path / "m.jsonl", "mooncake", tenant="moon", speedup=4.0),
        traces.TraceSpec(tmp_path / "b.csv", "burstgpt", tenant="burst", speedup=4.0)))
    plan = build_plan(w)
    assert len(plan) == 200 and plan == build_plan(w)
    assert {r.api_key for r in plan if r.tenant == "moon"} == {"k1"}
    # Requests sharing Mooncake prefix blocks share prompt prefixes.
    moon = [r.prompt for r in plan if r.tenant == "moon"]
    prefixes = [" ".join(p.split()[:50]) for p in moon]
    assert len(set(prefixes)) < len(prefixes)


def test_empirical_lengths_can_come_from_a_trace_file(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text(traces.sample_text("azure", 100, seed=6))
    w = from_mapping({"model": "m", "duration_s": 5, "arrival": {"kind": "poisson",
                                                                 "rate_rps": 20},
                      "tenants": [{"name": "t", "prompt_tokens": {
                          "kind": "empirical", "trace": "a.csv", "format": "azure"}}]},
                     tmp_path)
    rows = traces.load(tmp_path / "a.csv", "azure")
    assert {r.prompt_tokens for r in build_plan(w)} <= {r.prompt_tokens for r in rows}
