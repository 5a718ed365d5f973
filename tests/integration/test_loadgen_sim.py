"""The load generator against the simulated engine (`wattgate sim`, a real vLLM-dialect HTTP
server in its own process) with fixed timing: measured TTFT/TPOT agree with the engine's
configured truth, and its stall fault is exposed from intended arrival but hidden from send."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gateway.config import SloClass
from loadgen import lengths, run_summary
from loadgen.arrivals import Constant
from loadgen.client import ClientOptions, Target, run_plan
from loadgen.workload import TenantSpec, Workload, build_plan
from tests.support.procs import free_port, running, wattgate_cmd

TTFT_MS, ITL_MS = 80.0, 15.0


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    port = free_port()
    cmd = wattgate_cmd("sim", "--gpu", "h100", "--model", "llama-3.1-8b", "--precision", "fp8",
                       "--port", str(port), "--fixed-ttft-ms", str(TTFT_MS),
                       "--fixed-itl-ms", str(ITL_MS))
    with running(cmd, f"http://127.0.0.1:{port}/health", timeout_s=60):
        yield f"http://127.0.0.1:{port}"


def wl(tenants: tuple[TenantSpec, ...], duration_s: float = 1.0) -> Workload:
    return Workload(model="llama-3.1-8b", tenants=tenants, arrival=None, duration_s=duration_s,
                    slo_classes=(SloClass("i", ttft_s=0.5, tpot_s=0.05),))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_ttft_and_tpot_match_the_simulators_fixed_timing(sim_url: str, api: str) -> None:
    t = TenantSpec("t", arrival=Constant(10.0), prompt_tokens=lengths.fixed(40),
                   output_tokens=lengths.fixed(12), slo_class="i")
    w = Workload(**{**{f: getattr(wl((t,)), f) for f in Workload.__dataclass_fields__},
                    "api": api})
    plan = build_plan(w)
    results = await run_plan(plan, Target(sim_url, "llama-3.1-8b", api),
                             t0=time.monotonic() + 0.05)
    s, _ = run_summary.summarize(results, w.slo, requested_rate_rps=10.0, lag_threshold_s=0.1)
    assert s.ok == len(plan) == 10
    assert {r.completion_tokens for r in results} == {12}
    assert {r.prompt_tokens for r in results} == {40}  # word count (+4 per chat message)
    assert s.from_send.ttft_s.p50 == pytest.approx(TTFT_MS / 1e3, abs=0.010)
    assert s.from_send.tpot_s.p50 == pytest.approx(ITL_MS / 1e3, abs=0.002)


@pytest.mark.timeout(60)
async def test_sim_stall_is_seen_from_intended_arrival_not_from_send(sim_url: str) -> None:
    """One request stalls 800 ms at the engine; with one request in flight, the 20 req/s
    requests due behind it wait in the client. From send they look normal."""
    stalled = TenantSpec("stalled", arrival=Constant(1.0), prompt_tokens=lengths.fixed(8),
                         output_tokens=lengths.fixed(2), slo_class="i",
                         headers=(("x-sim-fault", "stall-ms:800"),))
    normal = TenantSpec("normal", arrival=Constant(8.0), prompt_tokens=lengths.fixed(8),
                        output_tokens=lengths.fixed(2), slo_class="i")
    w = wl((stalled, normal))
    plan = build_plan(w)
    results = await run_plan(plan, Target(sim_url, "llama-3.1-8b"), t0=time.monotonic() + 0.05,
                             opts=ClientOptions(max_concurrency=1))
    s, ms = run_summary.summarize(results, w.slo, requested_rate_rps=9.0)
    assert s.ok == len(plan)
    behind = [m for m in ms if m.result.tenant == "normal" and m.result.intended_s < 0.8]
    assert behind
    for m in behind:
        assert m.from_send.ttft_s is not None and m.from_send.ttft_s < 0.2
        assert m.from_intended.ttft_s is not None and m.from_intended.ttft_s > 0.3
    assert not s.graded


@pytest.fixture(scope="module")
def roofline_sim_url() -> Iterator[str]:
    port = free_port()
    cmd = wattgate_cmd("sim", "--gpu", "h100", "--model", "llama-3.1-8b", "--precision", "bf16",
                       "--port", str(port))
    with running(cmd, f"http://127.0.0.1:{port}/health", timeout_s=60):
        yield f"http://127.0.0.1:{port}"


@pytest.mark.timeout(60)
async def test_measured_latencies_match_the_simulators_own_per_request_truth(
        roofline_sim_url: str) -> None:
    """With the roofline timing model (batching, no fixed delays), each request's TTFT and TPOT
    as the client measured them match the engine's own record of that request (looked up by
    the x-request-id the client sent): TTFT within 5 ms, TPOT within 5%, medians."""
    import statistics

    import aiohttp

    t = TenantSpec("t", arrival=Constant(8.0), prompt_tokens=lengths.fixed(512),
                   output_tokens=lengths.fixed(24), slo_class="i")
    w = wl((t,), duration_s=2.0)
    plan = build_plan(w)
    target = Target(roofline_sim_url, "llama-3.1-8b", request_id_prefix="truth-")
    results = await run_plan(plan, target, t0=time.monotonic() + 0.05)
    assert all(r.ok for r in results)
    ttft_err, tpot_rel = [], []
    async with aiohttp.ClientSession() as session:
        for r in results:
            url = f"{roofline_sim_url}/sim/requests/{r.client_request_id}"
            async with session.get(url) as resp:
                truth = await resp.json()
            m = run_summary.request_metrics(r, w.slo("i"))
            assert m.from_send.ttft_s is not None and m.from_send.tpot_s is not None
            ttft_err.append(m.from_send.ttft_s - truth["ttft_s"])
            tpot_rel.append(m.from_send.tpot_s / truth["tpot_s"] - 1)
    assert abs(statistics.median(ttft_err)) < 0.005
    assert abs(statistics.median(tpot_rel)) < 0.05
