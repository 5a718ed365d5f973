"""The load client against an engine with known, fixed delays (the self-test engine, a real HTTP
server on a free 127.0.0.1 port): measured TTFT/TPOT agree with the truth, and a stall that
latency from send hides is exposed by latency from intended arrival."""

from __future__ import annotations

import time

import pytest

from gateway.config import SloClass
from loadgen import lengths, run_summary
from loadgen.arrivals import Closed, Constant
from loadgen.client import ClientOptions, Target, run_plan
from loadgen.selftest_engine import EngineTiming, SelftestEngine
from loadgen.workload import TenantSpec, Workload, build_plan
from tests.support.procs import free_port

SLO = SloClass("interactive", ttft_s=0.2, tpot_s=0.05)


def workload(arrival: object, tenants: tuple[TenantSpec, ...] | None = None, n_out: int = 16,
             duration_s: float = 1.0) -> Workload:
    tenants = tenants or (TenantSpec("t", output_tokens=lengths.fixed(n_out),
                                     prompt_tokens=lengths.fixed(20), slo_class="interactive"),)
    return Workload(model="m", tenants=tenants, arrival=arrival, duration_s=duration_s,  # type: ignore[arg-type]
                    slo_classes=(SLO,))


@pytest.mark.timeout(30)
async def test_measured_ttft_and_tpot_agree_with_the_engine_truth() -> None:
    """Engine: TTFT 60 ms, 10 ms between tokens, 16 tokens -> TTFT ~60 ms, TPOT ~10 ms,
    E2E ~210 ms (within a few ms of timer slack)."""
    engine = SelftestEngine(EngineTiming(ttft_s=0.060, itl_s=0.010))
    port = await engine.start()
    try:
        w = workload(Constant(20.0))
        plan = build_plan(w)
        results = await run_plan(plan, Target(f"http://127.0.0.1:{port}", "m"),
                                 t0=time.monotonic() + 0.05,
                                 opts=ClientOptions())
    finally:
        await engine.close()
    # This test is about timing truth, not schedule keeping: a busy machine may lag, and may
    # delay the engine's writes (never advance them), so the bounds only open upwards.
    summary, _ = run_summary.summarize(results, w.slo, requested_rate_rps=20.0, lag_threshold_s=10.0)
    assert summary.ok == len(plan) == 20
    assert all(r.completion_tokens == 16 and r.usage_reported for r in results)
    s = summary.from_send
    assert 0.060 <= s.ttft_s.p50 <= 0.060 + 0.25
    assert 0.0085 <= s.tpot_s.p50 <= 0.010 + 0.02
    assert 0.200 <= s.e2e_s.p50 <= 0.210 + 0.5
    assert summary.graded and summary.attainment == 1.0
    # Prompt tokens come from the server's usage: 20-token target = 16 words + 4 for the message.
    assert {r.prompt_tokens for r in results} == {20}


@pytest.mark.timeout(30)
async def test_latency_from_intended_exposes_a_stall_that_latency_from_send_hides() -> None:
    """With at most one request in flight, a 600 ms engine stall holds back the requests due
    behind it. From send they look fast; from intended arrival they are slow, the schedule lag
    shows it, and the run refuses to grade SLOs."""
    engine = SelftestEngine(EngineTiming(ttft_s=0.004, itl_s=0.0))
    port = await engine.start()
    stalled = TenantSpec("stalled", arrival=Constant(1.0), prompt_tokens=lengths.fixed(8),
                         output_tokens=lengths.fixed(4), slo_class="interactive",
                         headers=(("x-sim-fault", "stall-ms:600"),))
    normal = TenantSpec("normal", arrival=Constant(50.0), prompt_tokens=lengths.fixed(8),
                        output_tokens=lengths.fixed(4), slo_class="interactive")
    w = workload(None, (stalled, normal))
    plan = build_plan(w)
    assert plan[0].tenant == "stalled"  # due at t=0, ahead of the others
    try:
        results = await run_plan(plan, Target(f"http://127.0.0.1:{port}", "m"),
                                 t0=time.monotonic() + 0.05,
                                 opts=ClientOptions(max_concurrency=1))
    finally:
        await engine.close()
    summary, _ = run_summary.summarize(results, w.slo, requested_rate_rps=51.0)
    assert summary.ok == len(plan)
    assert summary.from_send.ttft_s.p50 < 0.03
    assert summary.from_intended.ttft_s.p50 > 0.15
    assert summary.lag_s.p99 > 0.4
    assert not summary.graded and "schedule lag" in summary.grading_note
    assert summary.goodput_rps is None


@pytest.mark.timeout(30)
async def test_closed_loop_keeps_the_set_concurrency_and_sends_every_request() -> None:
    engine = SelftestEngine(EngineTiming(ttft_s=0.02, itl_s=0.0))
    port = await engine.start()
    w = workload(Closed(concurrency=4, count=24))
    plan = build_plan(w)
    try:
        t0 = time.monotonic()
        results = await run_plan(plan, Target(f"http://127.0.0.1:{port}", "m"), t0=t0,
                                 concurrency=4)
        elapsed = time.monotonic() - t0
    finally:
        await engine.close()
    assert [r.index for r in results] == list(range(24))
    assert all(r.ok for r in results)
    # 24 requests, 4 at a time, ~20 ms each: about 6 rounds, far less than 24 in sequence.
    assert 0.11 <= elapsed < 0.4
    assert max(abs(r.lag_s) for r in results) < 0.01


@pytest.mark.timeout(30)
async def test_http_errors_are_recorded_with_their_status_and_graded_by_their_class() -> None:
    """An engine's 404 (the request itself is wrong) is a refusal: not a miss, so with
    nothing served or failed there is no attainment to report (not 0 %)."""
    engine = SelftestEngine()
    port = await engine.start()
    w = workload(Constant(50.0), duration_s=0.2)
    plan = build_plan(w)
    try:
        # /v2/... is not served: every request gets a 404.
        results = await run_plan(plan, Target(f"http://127.0.0.1:{port}/v2", "m"),
                                 t0=time.monotonic(), opts=ClientOptions())
    finally:
        await engine.close()
    assert {r.status for r in results} == {"http_404"}
    summary, _ = run_summary.summarize(results, w.slo, requested_rate_rps=50.0)
    assert summary.errors == {"http_404": len(plan)}
    assert {r.code for r in results} == {"upstream_http_404"}
    assert (summary.refused, summary.failed, summary.attainment) == (len(plan), 0, None)


@pytest.mark.timeout(30)
async def test_unreachable_target_gives_connect_errors_not_an_exception() -> None:
    w = workload(Constant(20.0), duration_s=0.2)
    plan = build_plan(w)
    results = await run_plan(plan, Target(f"http://127.0.0.1:{free_port()}", "m"),
                             t0=time.monotonic(), opts=ClientOptions())
    assert {r.status for r in results} == {"connect_error"}
