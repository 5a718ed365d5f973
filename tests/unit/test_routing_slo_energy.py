"""`slo_energy`, its hysteresis and the capacity signal (pure), and the config that names it."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ConfigError
from gateway.config import parse_config
from gateway.requests import asked_tokens, prompt_estimate
from gateway.routing import RoutingContext, policy_for
from gateway.routing.base import Candidate
from gateway.routing.capacity import engines_needed, slo_capacity
from gateway.routing.models import Curves, EndpointModel
from gateway.routing.priors import prior_for
from gateway.routing.slo_energy import next_full, slo_energy


def curves(kind: str, precision: str, cold: bool = False) -> Curves:
    """An endpoint's curves; warm (as if learnt) unless `cold`: the policy packs on learnt
    curves only."""
    return dataclasses.replace(EndpointModel(prior_for(kind, precision)).curves(), cold=cold)


CURVES = {"bf16": curves("vllm", "bf16"), "fp8": curves("trtllm", "fp8")}


def ctx(tpot_slo_s: float = 0.012, full: frozenset[str] = frozenset()) -> RoutingContext:
    return RoutingContext(0, b"", ttft_slo_s=2.0, tpot_slo_s=tpot_slo_s, slo_margin=0.8,
                          prompt_tokens=200, output_tokens=256, curves=CURVES, full=full)


def test_slo_energy_packs_onto_the_efficient_engine_while_it_meets_the_slo() -> None:
    cands = [Candidate("bf16", "bf16", running=0), Candidate("fp8", "fp8", running=10)]
    assert slo_energy(cands, ctx()) == 1
    # an idle efficient engine still beats an idle costly one
    assert slo_energy([Candidate("bf16", "bf16"), Candidate("fp8", "fp8")], ctx()) == 1


def test_slo_energy_spills_when_the_packed_engine_is_full() -> None:
    cands = [Candidate("bf16", "bf16", running=0), Candidate("fp8", "fp8", running=900)]
    c = ctx()
    full = next_full(frozenset(), cands, c, band=0.15)
    assert full == {"fp8"}
    assert slo_energy(cands, dataclasses.replace(c, full=full)) == 0


def test_when_no_endpoint_meets_the_slo_the_best_predicted_latency_wins() -> None:
    cands = [Candidate("bf16", "bf16", running=300), Candidate("fp8", "fp8", running=300)]
    c = ctx(tpot_slo_s=0.001)
    full = next_full(frozenset(), cands, c, 0.15)
    assert full == {"bf16", "fp8"}
    i = slo_energy(cands, dataclasses.replace(c, full=full))
    assert cands[i].name == "fp8"  # TensorRT-LLM FP8 decodes fastest at any batch


def test_hysteresis_holds_a_full_engine_out_until_its_load_falls_well_below_the_edge() -> None:
    """Load wobbling around the edge does not flip the engine in and out."""
    c = ctx()
    edge = slo_capacity(CURVES["fp8"], c)
    assert 10 < edge < 400
    full: frozenset[str] = frozenset()
    states = []
    for load in (edge - 2, edge + 1, edge - 1, edge + 0.5, edge - 2, edge - 1):
        full = next_full(full, [Candidate("fp8", "fp8", running=load)], c, band=0.15)
        states.append("fp8" in full)
    assert states == [False, True, True, True, True, True]
    low = slo_capacity(CURVES["fp8"], dataclasses.replace(c, slo_margin=0.8 * 0.85))
    full = next_full(full, [Candidate("fp8", "fp8", running=low - 1)], c, band=0.15)
    assert "fp8" not in full
    # without a band the same wobble flips it every time
    flips, full = [], frozenset()
    for load in (edge - 2, edge + 1, edge - 1, edge + 0.5):
        full = next_full(full, [Candidate("fp8", "fp8", running=load)], c, band=0.0)
        flips.append("fp8" in full)
    assert flips == [False, True, False, True]


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1000), st.lists(st.floats(0, 300), max_size=8))
def test_engines_needed_is_the_fewest_that_cover_the_load(load: float, caps: list[float]) -> None:
    n = engines_needed(load, caps)
    top = sorted(caps, reverse=True)
    if load <= 0:
        assert n == 0
    elif sum(top) >= load:
        assert sum(top[:n]) >= load and (n == 0 or sum(top[:n - 1]) < load)
    else:
        assert n == len(caps)


def test_request_size_reads_max_tokens_and_estimates_the_prompt() -> None:
    assert prompt_estimate({"prompt": "x" * 400}) == 100.0
    assert asked_tokens({"prompt": "x" * 400, "max_tokens": 7}) == 7
    assert asked_tokens({"messages": []}) is None


def test_config_accepts_slo_energy_and_names_a_bad_quality_field() -> None:
    base = {"auth_required": False, "slo_classes": {"gold": {"ttft_s": 1, "tpot_s": 0.05}},
            "models": [{"name": "m", "endpoints": [
                {"name": "a", "url": "http://127.0.0.1:1", "kind": "vllm", "precision": "fp8"}]}]}
    cfg = parse_config({**base, "routing": {"policy": "slo_energy", "slo_margin": 0.7,
                                            "quality": {"fp8": 0.99}, "min_quality": {"gold": 0.98}}})
    assert cfg.routing.policy == "slo_energy" and cfg.routing.min_quality == (("gold", 0.98),)
    assert policy_for("slo_energy") is slo_energy
    with pytest.raises(ConfigError, match=r"routing.quality.fp4"):
        parse_config({**base, "routing": {"policy": "slo_energy", "quality": {"fp4": 0.9}}})
    with pytest.raises(ConfigError, match=r"routing.slo_margin"):
        parse_config({**base, "routing": {"slo_margin": 1.5}})


def test_while_an_endpoint_is_cold_slo_energy_spreads_load_like_least_load() -> None:
    """On priors alone the policy does not pack: the least loaded endpoint is chosen."""
    cold = {"bf16": curves("vllm", "bf16", cold=True), "fp8": curves("trtllm", "fp8")}
    context = dataclasses.replace(ctx(), curves=cold)
    cands = [Candidate(name="bf16", precision="bf16", inflight=0, running=0.0, waiting=0.0,
                       kv_usage=None),
             Candidate(name="fp8", precision="fp8", inflight=3, running=3.0, waiting=0.0,
                       kv_usage=None)]
    assert slo_energy(cands, context) == 0
    assert slo_energy(cands[::-1], context) == 1
