"""Workloads and plans: same seed -> identical schedule and prompts; tenant mixes, lengths,
ShareGPT files and YAML workloads behave as specified."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import orjson
import pytest

from loadgen import arrivals, lengths
from loadgen.workload import (
    TenantSpec,
    Workload,
    build_plan,
    from_mapping,
    load_sharegpt,
    load_workload,
    requested_rate_rps,
)


def mix(seed: int = 1) -> Workload:
    return Workload(
        model="m", seed=seed, duration_s=20.0, arrival=arrivals.Gamma(20.0, 0.5),
        tenants=(
            TenantSpec("a", api_key="ka", share=3.0,
                       prompt_tokens=lengths.LengthDist("lognormal", median=100, sigma=0.5)),
            TenantSpec("b", api_key="kb", share=1.0, output_tokens=lengths.fixed(7)),
            TenantSpec("c", arrival=arrivals.OnOff(30.0, 0.5, 1.0), slo_class="batch"),
        ))


def test_same_seed_gives_identical_schedule_prompts_and_lengths() -> None:
    assert build_plan(mix(1)) == build_plan(mix(1))


def test_different_seed_changes_schedule_and_prompts() -> None:
    a, b = build_plan(mix(1)), build_plan(mix(2))
    assert [r.intended_s for r in a] != [r.intended_s for r in b]
    assert {r.prompt for r in a}.isdisjoint({r.prompt for r in b})


def test_plan_is_sorted_indexed_and_bounded() -> None:
    plan = build_plan(mix())
    assert [r.index for r in plan] == list(range(len(plan)))
    assert [r.intended_s for r in plan] == sorted(r.intended_s for r in plan)
    assert all(0 <= r.intended_s < 20.0 for r in plan)
    capped = build_plan(dataclasses.replace(mix(), max_requests=10))
    assert len(capped) == 10


def test_tenant_shares_split_the_shared_arrivals() -> None:
    """a:b = 3:1 of the shared gamma stream (within 5 points); c brings its own on/off stream."""
    w = dataclasses.replace(mix(), duration_s=200.0)
    plan = build_plan(w)
    a = sum(1 for r in plan if r.tenant == "a")
    b = sum(1 for r in plan if r.tenant == "b")
    assert a / (a + b) == pytest.approx(0.75, abs=0.05)
    assert {r.api_key for r in plan if r.tenant == "a"} == {"ka"}
    assert {r.slo_class for r in plan if r.tenant == "c"} == {"batch"}
    assert {r.max_tokens for r in plan if r.tenant == "b"} == {7}


def test_chat_prompts_are_synthesised_to_the_target_token_length() -> None:
    """Chat: words + 4 tokens of message overhead = target; completions: words = target."""
    for api, overhead in (("chat", 4), ("completions", 0)):
        w = Workload(model="m", api=api, duration_s=5.0, arrival=arrivals.Poisson(10),
                     tenants=(TenantSpec("t", prompt_tokens=lengths.LengthDist(
                         "uniform", low=10, high=300)),))
        for r in build_plan(w):
            assert len(r.prompt.split()) + overhead == r.prompt_tokens


@pytest.mark.parametrize(("dist", "lo", "hi"), [
    (lengths.LengthDist("lognormal", median=200, sigma=0.5), 185, 215),
    (lengths.LengthDist("uniform", low=10, high=30), 18, 22),
    # P(1) = 1/zeta(1.5) ~ 0.38 and P(<=2) ~ 0.52: the median is 2.
    (lengths.LengthDist("zipf", s=1.5, max=1000), 2, 2),
])
def test_length_distribution_medians(dist: lengths.LengthDist, lo: int, hi: int) -> None:
    rng = random.Random(3)
    xs = sorted(dist.sample(rng) for _ in range(4001))
    assert lo <= xs[2000] <= hi
    assert all(dist.min <= x <= dist.max for x in xs)


def test_zipf_lengths_are_heavy_tailed_and_empirical_draws_from_its_values() -> None:
    rng = random.Random(4)
    z = [lengths.LengthDist("zipf", s=1.2, max=5000).sample(rng) for _ in range(5000)]
    assert max(z) > 100 * sorted(z)[2500]
    e = lengths.empirical([5, 50, 500])
    assert {e.sample(rng) for _ in range(200)} == {5, 50, 500}


def test_sharegpt_file_gives_prompts_and_reply_lengths(tmp_path: Path) -> None:
    data = [{"conversations": [{"from": "human", "value": "tell me a joke"},
                               {"from": "gpt", "value": "one two three four five"}]},
            {"conversations": [{"from": "human", "value": "only one turn"}]}]
    path = tmp_path / "sg.json"
    path.write_bytes(orjson.dumps(data))
    assert load_sharegpt(path) == (("tell me a joke", 5),)
    w = Workload(model="m", duration_s=2.0, arrival=arrivals.Constant(5),
                 tenants=(TenantSpec("t", conversations=load_sharegpt(path)),))
    plan = build_plan(w)
    assert {(r.prompt, r.max_tokens) for r in plan} == {("tell me a joke", 5)}


def test_yaml_workload_with_tenants_and_slo_classes(tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text("""
model: llama
seed: 5
duration_s: 10
arrival: {kind: poisson, rate_rps: 8}
slo_classes:
  fast: {ttft_s: 0.3, tpot_s: 0.04}
tenants:
  - {name: acme, api_key: k1, share: 1, prompt_tokens: {kind: uniform, low: 5, high: 9},
     output_tokens: 12, slo_class: fast, headers: {x-sim-fault: "stall-ms:5"}}
  - {name: bursty, arrival: {kind: onoff, on_rate_rps: 20, mean_on_s: 1, mean_off_s: 2}}
""")
    w = load_workload(tmp_path / "w.yaml")
    assert w.slo("fast").ttft_s == 0.3
    assert w.tenants[1].slo_class == "fast"  # the first class is the default
    plan = build_plan(w)
    assert plan == build_plan(load_workload(tmp_path / "w.yaml"))
    assert {r.headers for r in plan if r.tenant == "acme"} == {(("x-sim-fault", "stall-ms:5"),)}
    assert requested_rate_rps(w, plan) == pytest.approx(8 + 20 / 3)


def test_bad_api_and_bad_arrival_kind_are_rejected_with_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="allowed"):
        from_mapping({"model": "m", "api": "embeddings"})
    with pytest.raises(ValueError, match="allowed"):
        from_mapping({"model": "m", "arrival": {"kind": "nope"}})


def test_energy_wait_option_reaches_the_run_options() -> None:
    """`--energy-wait` is how long the run polls the gateway for final records (10 s by default:
    an interval settles 2 s after it ends, and a request is final once the interval after its
    finish is apportioned)."""
    from loadgen.cli import run, run_options

    ctx = run.make_context("run", ["--target", "http://127.0.0.1:1"])
    assert run_options(ctx.params).energy_wait_s == 10.0
    ctx = run.make_context("run", ["--target", "http://127.0.0.1:1", "--energy-wait", "2.5"])
    assert run_options(ctx.params).energy_wait_s == 2.5
