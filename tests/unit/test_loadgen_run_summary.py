"""Run summaries, paired deltas, sweeps and the Pareto front (pure, on hand-built timelines)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import SloClass
from loadgen import run_summary
from loadgen.experiments import (
    SweepPoint,
    accuracy_condition,
    numeric_format,
    paired_delta,
    pareto_front,
    sweep_result,
)
from loadgen.results import RequestResult

SLOS = {"fast": SloClass("fast", ttft_s=0.1, tpot_s=0.02), "slow": SloClass("slow", ttft_s=1.0)}


def result(i: int, intended: float, sent: float, ttft: float, itl: float, n: int = 5,
           tenant: str = "a", slo: str = "fast", status: str = "ok") -> RequestResult:
    first = sent + ttft
    reads = tuple((first + k * itl, 1) for k in range(n))
    return RequestResult(i, tenant, slo, intended, sent, first if status == "ok" else None,
                         reads[-1][0], reads if status == "ok" else (), 10,
                         n if status == "ok" else 0, status, 200 if status == "ok" else 500,
                         f"r{i}")


def summarize(rs: list[RequestResult], **kw: object) -> run_summary.Summary:
    s, _ = run_summary.summarize(rs, SLOS.__getitem__, requested_rate_rps=10.0, **kw)  # type: ignore[arg-type]
    return s


def test_percentile_interpolates_like_numpy() -> None:
    assert run_summary.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert run_summary.percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert math.isnan(run_summary.percentile([], 50))


def test_latency_from_send_and_from_intended_differ_by_the_lag() -> None:
    rs = [result(i, i * 0.1, i * 0.1 + 0.002, 0.05, 0.01) for i in range(10)]
    s = summarize(rs)
    assert s.from_send.ttft_s.p50 == pytest.approx(0.05)
    assert s.from_intended.ttft_s.p50 == pytest.approx(0.052)
    assert s.from_send.tpot_s.p50 == pytest.approx(0.01)
    assert s.lag_s.p99 == pytest.approx(0.002)
    assert s.achieved_rate_rps == pytest.approx(10.0)


def test_goodput_and_attainment_per_class_and_tenant_count_errors_as_misses() -> None:
    rs = [result(0, 0.0, 0.0, 0.05, 0.01, tenant="a"),          # fast: met
          result(1, 0.1, 0.1, 0.50, 0.01, tenant="a"),          # fast: TTFT missed
          result(2, 0.2, 0.2, 0.05, 0.05, tenant="b"),          # fast: TPOT missed
          result(3, 0.3, 0.3, 0.50, 0.05, tenant="b", slo="slow"),  # slow: met
          result(4, 0.4, 0.4, 0.05, 0.01, tenant="b", slo="slow", status="http_500")]
    s = summarize(rs)
    assert s.graded
    assert s.attainment == pytest.approx(2 / 5)
    by_class = {g.name: g for g in s.per_class}
    assert by_class["fast"].attainment == pytest.approx(1 / 3)
    assert by_class["slow"].attainment == pytest.approx(1 / 2)
    assert by_class["fast"].goodput_rps == pytest.approx(1 / s.duration_s)
    by_tenant = {g.name: g for g in s.per_tenant}
    assert (by_tenant["a"].sent, by_tenant["b"].sent, by_tenant["b"].ok) == (2, 3, 2)
    assert s.errors == {"http_500": 1}


def test_run_refuses_to_grade_when_schedule_lag_p99_exceeds_the_threshold() -> None:
    rs = [result(i, i * 0.1, i * 0.1 + 0.05, 0.01, 0.001) for i in range(10)]
    late = summarize(rs, lag_threshold_s=0.01)
    assert not late.graded and "schedule lag p99 50.00 ms" in late.grading_note
    assert late.goodput_rps is None and late.per_class[0].attainment is None
    ok = summarize(rs, lag_threshold_s=0.1)
    assert ok.graded and ok.attainment == 1.0


def test_closed_loop_runs_are_graded_from_send() -> None:
    rs = [result(i, i * 0.1, i * 0.1 + 0.05, 0.01, 0.001) for i in range(10)]
    s = summarize(rs, lag_threshold_s=0.01, closed_loop=True)
    assert s.graded and "closed loop" in s.grading_note


def test_paired_delta_compares_the_same_requests_across_arms() -> None:
    base = [result(i, i, i, 0.10, 0.02) for i in range(5)]
    arm = [result(i, i, i, 0.07, 0.01) for i in range(5)]
    arm[4] = result(4, 4, 4, 0.0, 0.0, status="http_500")  # unpaired: dropped
    _, mb = run_summary.summarize(base, SLOS.__getitem__, requested_rate_rps=1)
    _, ma = run_summary.summarize(arm, SLOS.__getitem__, requested_rate_rps=1)
    d = paired_delta("bf16", mb, "fp8", ma, None, None)
    assert d.pairs == 4
    assert d.ttft_median_delta_s == pytest.approx(-0.03)
    assert d.tpot_median_delta_s == pytest.approx(-0.01)
    assert d.ttft_faster_share == 1.0
    assert d.j_per_token_delta_pct is None


def test_every_arm_states_its_format_and_accuracy_condition() -> None:
    assert "W4A16" in numeric_format("int4")
    assert "SmoothQuant" in numeric_format("int8")
    assert accuracy_condition("fp8", {}) == "accuracy not measured"
    assert "0.71" in accuracy_condition("fp8", {"fp8": 0.71})


def pt(arm: str, rate: float, good: float, att: float, j: float | None, graded: bool = True
       ) -> SweepPoint:
    return SweepPoint(arm, rate, rate, graded, good, att, j, 0.1, 0.01)


def test_sweep_finds_max_goodput_at_target_attainment_and_min_energy_meeting_it() -> None:
    pts = [pt("bf16", 1, 1.0, 1.0, 0.5), pt("bf16", 2, 1.9, 0.95, 0.4),
           pt("bf16", 4, 2.5, 0.6, 0.3), pt("fp8", 2, 2.0, 1.0, 0.35),
           pt("fp8", 4, 3.8, 0.95, 0.25, graded=False)]
    sw = sweep_result(pts, 0.9)
    assert sw.best_goodput["bf16"].rate_rps == 2
    assert sw.best_goodput["fp8"].rate_rps == 2  # the ungraded point never counts
    assert sw.min_energy is not None and sw.min_energy.j_per_output_token == 0.35


def test_pareto_front_keeps_only_undominated_points() -> None:
    pts = [("bf16", 10.0, 0.5), ("fp8", 12.0, 0.4), ("int8", 11.0, 0.45), ("int4", 14.0, 0.6)]
    assert [p[0] for p in pareto_front(pts)] == ["fp8", "int4"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 0.05), st.floats(0.001, 1),
                          st.floats(0, 0.1), st.integers(1, 50), st.booleans()),
                min_size=1, max_size=40))
def test_summary_invariants_hold_for_any_timelines(
        rows: list[tuple[float, float, float, float, int, bool]]) -> None:
    """From-intended latency = from-send + lag for every request; attainment lies in [0, 1];
    goodput x duration = the number of requests that met their SLO."""
    rs = [result(i, t, t + lag, ttft, itl, n, status="ok" if ok else "http_500")
          for i, (t, lag, ttft, itl, n, ok) in enumerate(rows)]
    s, ms = run_summary.summarize(rs, SLOS.__getitem__, requested_rate_rps=1.0, lag_threshold_s=1.0)
    for m in ms:
        if m.result.ok:
            assert m.from_intended.ttft_s is not None and m.from_send.ttft_s is not None
            assert m.from_intended.ttft_s == pytest.approx(m.from_send.ttft_s + m.result.lag_s)
            assert m.from_intended.tpot_s == m.from_send.tpot_s
    assert s.attainment is not None and 0.0 <= s.attainment <= 1.0
    assert s.goodput_rps is not None
    assert s.goodput_rps * s.duration_s == pytest.approx(sum(m.slo_met for m in ms))
    assert s.requests == sum(g.sent for g in s.per_tenant) == sum(g.sent for g in s.per_class)
