"""The learnt endpoint models (gateway/routing/models.py, windows.py): pure, property-tested."""

from __future__ import annotations

import dataclasses
import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from core.records import RequestRecord
from core.timing import Latency
from gateway.routing.models import CENTRES, EndpointModel, EnergyWindow, ModelSettings
from gateway.routing.priors import prior_for
from gateway.routing.windows import EnergyWindows

samples = st.lists(st.tuples(st.floats(0, 400), st.integers(0, 4000),
                             st.floats(0.001, 5.0), st.floats(0.001, 0.5)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(samples)
def test_predicted_latency_never_falls_as_load_rises(obs: list[tuple[float, int, float, float]]
                                                     ) -> None:
    m = EndpointModel(prior_for("vllm", "bf16"))
    for load, prompt, ttft, tpot in obs:
        m.observe_latency(load, prompt, ttft, tpot)
    c = m.curves()
    loads = [x * 1.7 for x in range(300)]
    tpots = [c.tpot(x) for x in loads]
    ttfts = [c.ttft(x, 100) for x in loads]
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(tpots))
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(ttfts))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 1e4), st.floats(0.01, 5.0), st.floats(0, 1e5),
                          st.floats(0, 1e5), st.floats(0, 300)), max_size=40),
       st.floats(0, 500), st.floats(0, 4000), st.floats(0, 4000))
def test_marginal_joules_are_finite_and_never_negative(
        windows: list[tuple[float, float, float, float, float]], load: float, prompt: float,
        out: float) -> None:
    m = EndpointModel(prior_for("trtllm", "fp8"))
    for e, dt, p, o, w_load in windows:
        m.observe_energy(EnergyWindow(e, dt, p, o, w_load))
    j = m.curves().marginal_j(load, prompt, out)
    assert math.isfinite(j) and j >= 0.0


def test_tpot_is_learnt_at_the_load_it_was_seen_and_the_cold_flag_clears() -> None:
    m = EndpointModel(prior_for("vllm", "bf16"), ModelSettings(min_samples=20, min_windows=1))
    assert m.curves().cold
    for _ in range(200):
        m.observe_latency(12.0, 0, 0.05, 0.030)  # 4x the prior's TPOT at this load
    m.observe_energy(EnergyWindow(100.0, 1.0, 0, 0, 0.0))
    c = m.curves()
    assert not c.cold
    assert abs(c.tpot(12.5) - 0.030) < 0.002
    # unseen loads keep the prior's shape at the measured level: well above the prior too
    assert c.tpot(100.0) > 2.5 * prior_for("vllm", "bf16").tpot_s(100.0)


def test_joules_per_token_are_learnt_from_apportioned_windows() -> None:
    m = EndpointModel(prior_for("vllm", "bf16"))
    for i in range(300):
        p, o = 500.0 + 400 * (i % 7), 300.0 + 350 * (i % 5)
        m.observe_energy(EnergyWindow(0.01 * p + 0.2 * o, 1.0, p, o, 20.0))
    c = m.curves()
    assert abs(c.j_per_output_token(24.5) - 0.2) < 0.01
    assert abs(c.j_per_prompt_token(24.5) - 0.01) < 0.005
    # a prompt/output mix that never changes cannot tell them apart: the prior's split is
    # kept, but the window's energy is still what the two predict together
    m2 = EndpointModel(prior_for("vllm", "bf16"))
    for _ in range(300):
        m2.observe_energy(EnergyWindow(0.01 * 2000 + 0.2 * 1500, 1.0, 2000, 1500, 20.0))
    c2 = m2.curves()
    predicted = 2000 * c2.j_per_prompt_token(24.5) + 1500 * c2.j_per_output_token(24.5)
    assert abs(predicted - 320.0) / 320.0 < 0.1


def test_packing_is_cheaper_than_waking_an_idle_engine() -> None:
    """The prior alone says one more stream on a batch-16 engine costs far less than one on
    an idle engine (J/token falls ~18x from batch 1 to 64)."""
    c = EndpointModel(prior_for("vllm", "bf16")).curves()
    assert c.marginal_j(16.0, 100, 256) < c.marginal_j(0.0, 100, 256) / 4


def _record(dispatched: float, first: float, end: float, prompt: int, out: int) -> RequestRecord:
    lat = Latency(first - dispatched, None, end - dispatched, (), ())
    return RequestRecord("r", "t", "m", "e", "bf16", "default", "ok", 200, True, 1000.0, 0.0,
                         dispatched, dispatched, first, end, (first, end), (1, out - 1), prompt,
                         out, 1, lat, True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 20), st.floats(0, 2), st.floats(0, 5),
                          st.integers(1, 999), st.integers(2, 999)), min_size=1, max_size=20))
def test_windows_pair_all_energy_and_all_work_of_closed_intervals(
        reqs: list[tuple[float, float, float, int, int]]) -> None:
    w = EnergyWindows(1.0)
    w.add_boundary(1000.0, 5.0)  # wall 1000 = monotonic 0
    for start, ttft, dur, p, o in reqs:
        w.add_record(_record(start, start + ttft, start + ttft + dur, p, o))
    win = w.add_boundary(1030.0, 905.0)
    assert win is not None
    assert win.energy_j == 900.0 and win.dt_s == 30.0
    assert math.isclose(win.prompt_tokens, sum(r[3] for r in reqs))
    assert math.isclose(win.output_tokens, sum(r[4] for r in reqs))
    assert math.isclose(win.load * 30.0, sum(r[1] + r[2] for r in reqs), rel_tol=1e-9,
                        abs_tol=1e-9)
    assert w.add_boundary(1031.0, 1.0) is None  # the meter went back: no window


def test_load_bins_cover_the_centres() -> None:
    from gateway.routing.models import bin_of
    assert [bin_of(c) for c in CENTRES] == list(range(len(CENTRES)))


def test_tpot_is_binned_at_the_load_the_request_decoded_at_not_the_one_it_joined() -> None:
    """An engine filling up: a request dispatched at load 0 decodes at ~200. Its TTFT belongs
    to load 0, its TPOT to ~200 (binned at 0 it made an idle engine look slow)."""
    from gateway.routing.base import Candidate
    from gateway.routing.learner import EndpointInfo, RoutingModels
    from gateway.routing.models import bin_of

    models = RoutingModels([EndpointInfo("e", "m", "vllm", "bf16")])
    models.observe_loads(10.0, [Candidate("e", "bf16", running=0)])
    for i in range(1, 101):  # 200 resident (itself included) from its first token on
        models.observe_loads(10.0 + 0.01 * i, [Candidate("e", "bf16", running=201)])
    rec = _record(10.0, 10.005, 12.0, 100, 200)
    models(dataclasses.replace(rec, latency=Latency(0.005, 0.01, 2.0, (), ())))
    m = models.models["e"]
    assert m.latency[0].ttft.w == 1.0 and m.latency[0].tpot.w == 0.0
    assert m.latency[bin_of(200.0)].tpot.w == 1.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 300.0)), min_size=1,
                max_size=30), st.floats(0.0, 100.0), st.floats(0.0, 100.0))
def test_mean_load_over_a_span_is_the_step_functions_time_average(
        steps: list[tuple[float, float]], a: float, b: float) -> None:
    from gateway.routing.learner import _LoadTrace

    trace = _LoadTrace()
    t, points = 0.0, []
    for dt, load in steps:
        t += dt
        trace.add(t, load)
        points.append((t, load))
    t0, t1 = min(a, b), max(a, b)
    mean = trace.mean(t0, t1)
    if t1 < points[0][0]:
        assert mean is None
        return
    lo = max(t0, points[0][0])
    if t1 - lo <= 1e-9:
        assert mean == trace.at(t1)
        return
    # numeric time average of the step function over [lo, t1]
    n = 4000
    grid = [lo + (t1 - lo) * (k + 0.5) / n for k in range(n)]
    ref = sum(trace.at(x) or 0.0 for x in grid) / n
    assert mean is not None and abs(mean - ref) <= 300.0 * 2 * len(points) / n + 1e-6
