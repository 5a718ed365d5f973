"""Arrival processes: seeded reproducibility and gap statistics that match each process's
parameters. Seeds are fixed, so each statistical check is deterministic; tolerances are several
standard errors wide so a correct generator passes for any seed."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen import arrivals
from loadgen.arrivals import Constant, Diurnal, Gamma, OnOff, Poisson, Ramp, gap_stats

N = 20_000


def offsets(proc: arrivals.ArrivalProcess, seed: int = 7, n: int = N) -> tuple[float, ...]:
    return proc.offsets_s(random.Random(seed), math.inf, n)


@pytest.mark.parametrize("proc", [
    Constant(40.0), Poisson(40.0), Gamma(40.0, 0.25), Gamma(40.0, 4.0),
    # Short periods: many on/off cycles in N gaps, so the sample mean settles.
    OnOff(on_rate_rps=100.0, mean_on_s=0.1, mean_off_s=0.15),
    OnOff(on_rate_rps=80.0, mean_on_s=0.05, mean_off_s=0.05, off_rate_rps=10.0),
])
def test_gap_mean_and_cv_match_parameters(proc: arrivals.ArrivalProcess) -> None:
    """Empirical mean gap = 1/mean rate (within 4%) and gap CV = the process's CV (within 8%)."""
    mean, cv = gap_stats(offsets(proc))
    assert mean == pytest.approx(1.0 / proc.mean_rate_rps, rel=0.04)
    expected_cv = proc.expected_gap_cv()  # type: ignore[attr-defined]
    assert cv == pytest.approx(expected_cv, rel=0.08, abs=1e-9)


def test_gamma_burstiness_follows_vllm_definition() -> None:
    """Gamma burstiness k gives CV = 1/sqrt(k): k=0.25 -> 2, k=1 -> 1 (Poisson), k=4 -> 0.5."""
    for k, cv_expected in ((0.25, 2.0), (1.0, 1.0), (4.0, 0.5)):
        _, cv = gap_stats(offsets(Gamma(10.0, k), seed=3))
        assert cv == pytest.approx(cv_expected, rel=0.08)


def test_onoff_is_burstier_than_poisson_at_the_same_mean_rate() -> None:
    """An on/off MMPP with silent OFF periods has gap CV well above 1."""
    proc = OnOff(on_rate_rps=50.0, mean_on_s=1.0, mean_off_s=4.0)
    assert proc.expected_gap_cv() > 2.0
    _, cv = gap_stats(offsets(proc))
    assert cv > 2.0


def test_same_seed_same_schedule_and_different_seed_differs() -> None:
    for proc in (Poisson(10), Gamma(10, 0.5), OnOff(20, 1, 1), Diurnal(Poisson(10), 60.0),
                 Ramp(1, 20, 30)):
        a = proc.offsets_s(random.Random(42), 30.0, 1000)
        b = proc.offsets_s(random.Random(42), 30.0, 1000)
        c = proc.offsets_s(random.Random(43), 30.0, 1000)
        assert a == b
        assert a != c


def test_schedules_are_bounded_sorted_and_inside_the_duration() -> None:
    for proc in (Poisson(100), Gamma(100, 0.1), OnOff(200, 0.5, 0.5), Ramp(10, 100, 5),
                 Diurnal(Gamma(50, 0.5), 2.0, 0.9)):
        t = proc.offsets_s(random.Random(1), 5.0, 300)
        assert len(t) <= 300
        assert list(t) == sorted(t)
        assert all(0 <= x < 5.0 for x in t)


def test_diurnal_envelope_keeps_the_mean_rate_and_follows_the_sine() -> None:
    """Over whole periods the mean rate is the base rate; the peak half-period carries
    (1 + 2A/pi) / (1 - 2A/pi) times the trough half's arrivals."""
    period, amp, rate = 100.0, 0.6, 50.0
    proc = Diurnal(Poisson(rate), period, amp)
    t = proc.offsets_s(random.Random(5), 10 * period, 10**7)
    assert len(t) / (10 * period) == pytest.approx(rate, rel=0.02)
    peak = sum(1 for x in t if (x % period) < period / 2)
    trough = len(t) - peak
    expected = (1 + 2 * amp / math.pi) / (1 - 2 * amp / math.pi)
    assert peak / trough == pytest.approx(expected, rel=0.05)


def test_diurnal_time_change_preserves_the_base_burstiness_locally() -> None:
    """A slow envelope over a gamma process keeps its short-range gap CV near 1/sqrt(k)."""
    proc = Diurnal(Gamma(200.0, 0.25), period_s=10_000.0, amplitude=0.3)
    t = proc.offsets_s(random.Random(9), 100.0, N)
    _, cv = gap_stats(t)
    assert cv == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize("steps", [0, 4])
def test_ramp_counts_follow_the_integrated_rate(steps: int) -> None:
    proc = Ramp(start_rps=10.0, end_rps=200.0, duration_s=60.0, steps=steps)
    t = proc.offsets_s(random.Random(11), 60.0, 10**7)
    first = sum(1 for x in t if x < 30.0)
    assert first == pytest.approx(proc.cumulative(30.0), rel=0.06)
    assert len(t) - first == pytest.approx(proc.cumulative(60.0) - proc.cumulative(30.0),
                                           rel=0.04)
    assert len(t) > 2.5 * first  # the rate really rises


def test_step_ramp_rates_are_the_listed_steps() -> None:
    proc = Ramp(start_rps=10.0, end_rps=40.0, duration_s=40.0, steps=4)
    assert [proc.rate_at(t) for t in (1, 11, 21, 31)] == [10.0, 20.0, 30.0, 40.0]


def test_from_spec_builds_each_kind_and_rejects_unknown() -> None:
    assert arrivals.from_spec({"kind": "gamma", "rate_rps": 5, "burstiness": 0.5}) == Gamma(5, 0.5)
    d = arrivals.from_spec({"kind": "diurnal", "period_s": 60,
                            "base": {"kind": "poisson", "rate_rps": 3}})
    assert isinstance(d, Diurnal) and d.base == Poisson(3)
    with pytest.raises(ValueError, match="allowed"):
        arrivals.from_spec({"kind": "weibull", "rate_rps": 1})


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), rate=st.floats(0.5, 500), k=st.floats(0.05, 10))
def test_gamma_schedules_are_reproducible_for_any_seed(seed: int, rate: float, k: float) -> None:
    a = Gamma(rate, k).offsets_s(random.Random(seed), 10.0, 200)
    assert a == Gamma(rate, k).offsets_s(random.Random(seed), 10.0, 200)
    assert list(a) == sorted(a)
