"""Energy counter and ground truth: conservation (requests + idle == counter, in the residency
and the Shapley view) and monotonicity."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engines.sim.catalog import deployment
from engines.sim.energy import EnergyLedger
from engines.sim.fixed import FixedTimingCore
from engines.sim.perf import DECODE, PREFILL, SeqWork, kernel_profile, step_cost
from engines.sim.power import idle_power_w, step_energy
from engines.sim.scheduler import BatchingCore
from tests.unit.test_sim_scheduler import small_kv_deployment


def test_ledger_charges_static_to_residents_and_dynamic_by_phase() -> None:
    ledger = EnergyLedger(gpus=2, start_j=1000.0)
    ledger.accrue(2.0, 100.0, ["a", "b"], [("a", PREFILL, 30.0), ("b", DECODE, 10.0)])
    ledger.accrue_idle(1.0, 100.0)
    a, b = ledger.account("a"), ledger.account("b")
    assert (a.static_j, a.prefill_j, a.decode_j) == (100.0, 30.0, 0.0)
    assert (b.static_j, b.prefill_j, b.decode_j) == (100.0, 0.0, 10.0)
    assert ledger.idle_j == 100.0
    assert ledger.counter_j == 1000.0 + 340.0
    assert ledger.gpu_energy_j() == [670.0, 670.0]


def test_interval_with_no_resident_goes_to_idle() -> None:
    ledger = EnergyLedger(gpus=1)
    ledger.accrue(1.5, 80.0, [], [])
    assert ledger.idle_j == 120.0 and ledger.charged_j == 0.0


def test_step_dynamic_split_sums_to_dynamic_power_and_favours_long_context() -> None:
    d = deployment("h100", "llama-3.1-8b", "bf16")
    prof = kernel_profile("vllm", "bf16")
    cost = step_cost(d, prof, [SeqWork(1, 100, DECODE), SeqWork(1, 20000, DECODE)])
    e = step_energy(d, prof, cost)
    assert math.isclose(sum(e.seq_dynamic_j), e.dynamic_w * e.duration_s, rel_tol=1e-12)
    assert e.seq_dynamic_j[1] > 1.5 * e.seq_dynamic_j[0]


def test_power_stays_between_idle_and_tdp_and_prefill_draws_more_than_decode() -> None:
    for gpu in ("h100", "h200", "a100", "l40s", "b200"):
        d = deployment(gpu, "llama-3.1-8b", "bf16")
        prof = kernel_profile("vllm", "bf16")
        decode = step_energy(d, prof, step_cost(d, prof, [SeqWork(1, 500, DECODE)]))
        prefill = step_energy(d, prof, step_cost(d, prof, [SeqWork(8192, 0, PREFILL)]))
        assert idle_power_w(d) < decode.power_w < prefill.power_w <= d.gpu.tdp_w + 1e-9
        assert prefill.power_w > 0.8 * d.gpu.tdp_w  # compute-bound prefill runs near TDP


def test_h100_batch1_decode_power_is_in_the_measured_memory_bound_range() -> None:
    d = deployment("h100", "llama-3.1-8b", "bf16")
    prof = kernel_profile("vllm", "bf16")
    e = step_energy(d, prof, step_cost(d, prof, [SeqWork(1, 500, DECODE)]))
    assert 137.0 <= e.power_w <= 320.0


workload = st.lists(
    st.tuples(
        st.floats(0.0, 0.05),  # gap before arrival (s)
        st.integers(1, 300),  # prompt tokens
        st.integers(1, 40),  # max tokens
        st.one_of(st.none(), st.floats(0.0, 0.2)),  # cancel this long after arrival
    ),
    min_size=1, max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=workload, kind=st.sampled_from(["batching", "small-kv", "fixed"]),
       probes=st.lists(st.floats(0.0, 0.02), min_size=1, max_size=5))
def test_ground_truth_plus_idle_equals_counter_growth_and_counter_is_monotonic(
        jobs: list[tuple[float, int, int, float | None]], kind: str, probes: list[float]) -> None:
    prof = kernel_profile("vllm", "bf16")
    core: BatchingCore | FixedTimingCore
    if kind == "fixed":
        core = FixedTimingCore(deployment("h100", "llama-3.1-8b", "bf16"), prof,
                               ttft_s=0.01, itl_s=0.004)
    elif kind == "small-kv":
        core = BatchingCore(small_kv_deployment(blocks=48), prof, max_batch=8, token_budget=256)
    else:
        core = BatchingCore(deployment("h100", "llama-3.1-8b", "bf16"), prof, max_batch=8)
    start_j = core.ledger.counter_j
    last_counter = start_j
    now = 0.0
    cancels: list[tuple[float, str]] = []

    def check_monotonic(t: float) -> None:
        nonlocal last_counter
        for dt in probes:
            value = core.counter_j(t + dt)
            assert value >= last_counter - 1e-9 * max(1.0, last_counter)
        core.advance(t)
        value = core.counter_j(t)
        assert value >= last_counter - 1e-9 * max(1.0, last_counter)
        last_counter = value

    for i, (gap, prompt, max_tokens, cancel_after) in enumerate(jobs):
        now += gap
        due = sorted(c for c in cancels if c[0] <= now)
        for t, rid in due:
            check_monotonic(t)
            core.cancel(rid, t)
            cancels.remove((t, rid))
        check_monotonic(now)
        core.submit(f"r{i}", prompt, max_tokens, now)
        if cancel_after is not None:
            cancels.append((now + cancel_after, f"r{i}"))
    for t, rid in sorted(cancels):
        check_monotonic(max(t, core.now_s))
        core.cancel(rid, max(t, core.now_s))
    while (wake := core.next_wakeup_s()) is not None:
        check_monotonic(wake)
    end = core.now_s + 0.5
    check_monotonic(end)
    truths = core.take_finished()
    assert len(truths) == len(jobs)
    charged = math.fsum(t.energy_j for t in truths)
    growth = core.ledger.counter_j - start_j
    assert charged + core.ledger.idle_j == pytest.approx(growth, rel=1e-9)
    assert core.ledger.charged_j == pytest.approx(charged, rel=1e-9)
    shapley = math.fsum(t.shapley_energy_j for t in truths)  # the other view conserves too
    assert shapley + core.ledger.idle_j == pytest.approx(growth, rel=1e-9)
    assert core.ledger.shapley_charged_j == pytest.approx(shapley, rel=1e-9)
    for truth in truths:
        parts = truth.static_energy_j + truth.prefill_energy_j + truth.decode_energy_j
        assert truth.energy_j == pytest.approx(parts, rel=1e-12)
        assert min(truth.static_energy_j, truth.prefill_energy_j, truth.decode_energy_j) >= 0.0
        assert truth.energy_j > 0.0 or truth.status == "aborted"
