"""Burst-aware prediction (pure): prefill pending on an endpoint, and `slo_energy` keeping a
burst's prompts off the engine whose short streams they would slow past the SLO."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.routing import RoutingContext
from gateway.routing.base import Candidate
from gateway.routing.learner import EndpointInfo, RoutingModels
from gateway.routing.models import Curves, EndpointModel
from gateway.routing.pending import PendingPrefill
from gateway.routing.priors import prior_for
from gateway.routing.slo_energy import burst_ratio, slo_energy, slo_ratio


def warm(kind: str, precision: str, pending: float = 0.0) -> Curves:
    c = EndpointModel(prior_for(kind, precision)).curves()
    return dataclasses.replace(c, cold=False, pending_prefill_tokens=pending)


def ctx(curves: dict[str, Curves], output_tokens: float) -> RoutingContext:
    return RoutingContext(0, b"", ttft_slo_s=2.0, tpot_slo_s=0.012, slo_margin=0.8,
                          prompt_tokens=128, output_tokens=output_tokens, curves=curves)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 300), st.floats(0, 1e5), st.floats(0, 1e5), st.floats(1, 2000),
       st.floats(0, 4000))
def test_predicted_latency_never_falls_as_pending_prefill_rises(
        load: float, p1: float, p2: float, out: float, prompt: float) -> None:
    lo, hi = sorted((p1, p2))
    c = warm("vllm", "fp8")
    assert c.tpot_burst(load, lo, out) <= c.tpot_burst(load, hi, out)
    assert c.ttft_burst(load, prompt, lo) <= c.ttft_burst(load, prompt, hi)
    cand = Candidate("e", "fp8", running=load)
    cx = ctx({"e": c}, out)
    r_lo = burst_ratio(cand, dataclasses.replace(c, pending_prefill_tokens=lo), cx)
    r_hi = burst_ratio(cand, dataclasses.replace(c, pending_prefill_tokens=hi), cx)
    assert r_lo <= r_hi
    # a longer stream averages the same lump out over more gaps
    assert c.tpot_burst(load, hi, out + 10.0) <= c.tpot_burst(load, hi, out)


@given(st.floats(0, 300), st.floats(1, 2000))
def test_without_pending_prefill_the_burst_prediction_is_the_load_one(load: float, out: float
                                                                      ) -> None:
    c = warm("trtllm", "bf16")
    cand = Candidate("e", "bf16", running=load)
    cx = ctx({"e": c}, out)
    assert burst_ratio(cand, c, cx) == slo_ratio(cand, c, cx)


def test_a_burst_on_the_cheapest_engine_sends_short_requests_to_the_next() -> None:
    cands = [Candidate("bf16", "bf16", running=8), Candidate("fp8", "fp8", running=40)]
    calm = {"bf16": warm("vllm", "bf16"), "fp8": warm("trtllm", "fp8")}
    assert slo_energy(cands, ctx(calm, 8)) == 1  # packs onto the efficient engine
    # a step-lengthening burst queued on it: 5 000 prompt tokens ~ 0.1 s of prefill
    burst = dict(calm, fp8=warm("trtllm", "fp8", pending=5000.0))
    assert slo_energy(cands, ctx(burst, 8)) == 0  # 8 tokens cannot average 0.1 s out
    assert slo_energy(cands, ctx(burst, 2000)) == 1  # 2000 tokens can


def test_pending_prefill_adds_dispatches_and_drains_as_first_tokens_come() -> None:
    p = PendingPrefill()
    for _ in range(10):
        p.observe_request(100.0, 50.0)
    assert math.isclose(p.prompt_mean, 100.0)
    assert p.observe(0.0, 0, drain_s=0.5) == 0.0
    assert math.isclose(p.observe(0.001, 3, drain_s=0.5), 300.0, rel_tol=0.01)  # 3 dispatched
    assert p.observe(0.002, 2, drain_s=0.5) < 300.0  # one finished: nothing added
    assert p.observe(5.0, 2, drain_s=0.5) < 1.0  # ten TTFTs later: all prefilled
    assert p.observe(4.0, 2, drain_s=0.5) >= 0.0  # a clock step back changes nothing


@given(st.lists(st.tuples(st.floats(0, 0.5), st.integers(0, 50)), max_size=40))
def test_pending_prefill_is_never_negative_and_bounded_by_what_was_dispatched(
        steps: list[tuple[float, int]]) -> None:
    p = PendingPrefill()
    p.observe_request(128.0, 50.0)
    t, inflight, added = 0.0, 0, 0.0
    for dt, n in steps:
        t += dt
        added += max(n - inflight, 0) * 128.0
        inflight = n
        tokens = p.observe(t, n, drain_s=0.2)
        assert 0.0 <= tokens <= added + 1e-6


def test_the_learner_shows_pending_prefill_from_the_in_flight_counts_routing_saw() -> None:
    models = RoutingModels([EndpointInfo("a", "m", "vllm", "fp8"),
                            EndpointInfo("b", "m", "vllm", "bf16")])
    for name in ("a", "b"):
        models.pending[name].observe_request(200.0, 50.0)
    models.observe_loads(0.0, [Candidate("a", "fp8"), Candidate("b", "bf16")])
    assert models.curves()["a"].pending_prefill_tokens == 0.0
    models.observe_loads(0.001, [Candidate("a", "fp8", inflight=4), Candidate("b", "bf16")])
    curves = models.curves()
    assert 700.0 < curves["a"].pending_prefill_tokens <= 800.0
    assert curves["b"].pending_prefill_tokens == 0.0
    # the models' own curves (what the capacity signal sizes pools on) carry none
    assert models.models["a"].curves().pending_prefill_tokens == 0.0


def test_the_step_prefill_rate_follows_the_measured_speed() -> None:
    """An engine measured ten times slower than the prior (a simulator at time_scale 0.1)
    prefills ten times slower too."""
    prior = prior_for("vllm", "bf16")
    m = EndpointModel(prior)
    for _ in range(40):
        m.observe_latency(12.0, 100, None, 10.0 * prior.tpot_s(12.5), decode_load=12.0)
    rate = m.curves().step_prefill_s_per_token
    assert 8.0 * prior.prefill_s_per_token < rate < 12.0 * prior.prefill_s_per_token


def test_a_burst_is_kept_off_an_engine_whose_short_streams_it_would_slow() -> None:
    """A long request averages the lump out itself, but the short streams already decoding
    there cannot: with such streams on the engine, the burst goes on elsewhere."""
    cands = [Candidate("bf16", "bf16", running=8), Candidate("fp8", "fp8", running=40)]
    fp8 = warm("trtllm", "fp8", pending=5000.0)
    calm = {"bf16": warm("vllm", "bf16"), "fp8": fp8}
    assert slo_energy(cands, ctx(calm, 2000)) == 1
    shorts = dict(calm, fp8=dataclasses.replace(fp8, short_output_tokens=8.0))
    assert slo_energy(cands, ctx(shorts, 2000)) == 0


def test_a_short_stream_is_the_low_tail_of_the_outputs_seen() -> None:
    p = PendingPrefill()
    assert p.short_output_tokens == math.inf
    for _ in range(30):
        p.observe_request(100.0, 50.0)
    assert math.isclose(p.short_output_tokens, 50.0, rel_tol=1e-6)
    for n in (10.0, 200.0) * 30:
        p.observe_request(100.0, n)
    assert 1.0 < p.short_output_tokens < 20.0  # the lognormal fit's 10th percentile
