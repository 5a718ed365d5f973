"""A tenant's token rates, learnt from its own bills per precision and prompt band."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.pricing import Pricing, Series
from gateway.tenancy.budget import estimate
from gateway.tenancy.rates import (
    MAX_MARGIN,
    PRIOR_J_PER_OUTPUT_TOKEN,
    PRIOR_J_PER_PROMPT_TOKEN,
    Bill,
    RatesMemo,
    TenantRates,
    band_of,
    fit_j,
    prior_j,
)

PRICING = Pricing()
PRIOR_PROMPT_SHARE = prior_j("bf16")[0] / prior_j("bf16")[1]  # a / b where bills cannot tell


def bill(prompt: int, completion: int, a: float = 0.02, b: float = 0.3, noise: float = 1.0,
         precision: str = "bf16") -> Bill:
    return Bill(precision, prompt, completion, (a * prompt + b * completion) * noise, 0.0, 0.0)


def test_two_shapes_tell_a_prompt_token_from_an_output_token() -> None:
    bills = [bill(100, 200), bill(300, 10), bill(200, 100), bill(400, 50)]
    a, b = fit_j(bills, PRIOR_PROMPT_SHARE) or (0.0, 0.0)
    assert a == pytest.approx(0.02) and b == pytest.approx(0.3)


def test_one_shape_scales_the_prior_proportion_to_the_bills() -> None:
    bills = [bill(100, 200)] * 4
    a, b = fit_j(bills, PRIOR_PROMPT_SHARE) or (0.0, 0.0)
    assert a == pytest.approx(b * PRIOR_PROMPT_SHARE)
    assert a * 100 + b * 200 == pytest.approx(bills[0].energy_j)  # that shape is billed right


def test_the_worst_under_estimate_among_the_bills_scales_the_fit_up() -> None:
    bills = [bill(100, 200, noise=0.9), bill(300, 10), bill(200, 100, noise=1.3), bill(400, 50)]
    a, b = fit_j(bills, PRIOR_PROMPT_SHARE) or (0.0, 0.0)
    assert all(a * x.prompt_tokens + b * x.completion_tokens >= x.energy_j * (1 - 1e-9)
               for x in bills)
    # one wild bill scales it by MAX_MARGIN at most: that bill stays under-estimated
    wild = [bill(100, 200), bill(300, 10), bill(200, 100, noise=9.0), bill(400, 50)]
    a2, b2 = fit_j(wild, PRIOR_PROMPT_SHARE) or (0.0, 0.0)
    assert a2 * 200 + b2 * 100 < wild[2].energy_j
    assert a2 * 200 + b2 * 100 >= MAX_MARGIN * (0.02 * 200 + 0.3 * 100)


def test_too_few_bills_or_a_band_never_sent_gets_the_conservative_prior() -> None:
    assert fit_j([bill(100, 200)] * 2, PRIOR_PROMPT_SHARE) is None
    rates = TenantRates.from_bills([bill(50, 200, a=0.0005, b=0.09)] * 10)
    short = rates.rates("bf16", 50, PRICING, 0.0)
    assert estimate(50, 200, short).j == pytest.approx(0.0005 * 50 + 0.09 * 200)
    long = rates.rates("bf16", 12000, PRICING, 0.0)  # another band: the prior
    assert band_of(12000) != band_of(50)
    assert long.output.j == PRIOR_J_PER_OUTPUT_TOKEN["bf16"]
    assert long.output.j >= 2.0  # a lone BF16 stream's token on the simulated H100
    assert long.prompt.j == pytest.approx(PRIOR_J_PER_PROMPT_TOKEN["bf16"])
    assert rates.rates("int4", 50, PRICING, 0.0).output.j == PRIOR_J_PER_OUTPUT_TOKEN["int4"]


def test_a_fit_that_would_go_negative_keeps_the_closer_single_rate() -> None:
    # energy all from the output tokens, with noise that pulls the prompt's rate below 0
    bills = [bill(100, 200, a=0.0, noise=1.05), bill(400, 20, a=0.0, noise=0.9),
             bill(300, 100, a=0.0), bill(200, 50, a=0.0, noise=1.02)]
    a, b = fit_j(bills, PRIOR_PROMPT_SHARE) or (-1.0, -1.0)
    assert a == 0.0 and 0.27 < b < 0.3 * MAX_MARGIN


def test_tokens_past_what_the_bills_held_are_reserved_at_the_prior() -> None:
    # long prompts with 1-30 output tokens: the fit puts their cost on the prompt
    bills = [bill(10000 + 500 * i, 1 + 3 * i, a=0.024, b=0.0) for i in range(10)]
    rates = TenantRates.from_bills(bills)
    learnt = rates.rates("bf16", 12000, PRICING, 0.0)
    assert learnt.output.j == pytest.approx(0.0, abs=1e-6)
    assert learnt.output_upto == 28 and learnt.prompt_upto == 14500
    # a shape it sent: the learnt rates (at least its bill)
    assert estimate(12000, 10, learnt).j == pytest.approx(learnt.prompt.j * 12000, rel=1e-3)
    assert estimate(12000, 10, learnt).j >= 0.024 * 12000 * (1 - 1e-9)
    # the same prompt with max_tokens 2,000: the output past 28 tokens at the prior's rate
    prior_out = PRIOR_J_PER_OUTPUT_TOKEN["bf16"]
    assert estimate(12000, 2000, learnt).j >= (2000 - 28) * prior_out
    # a longer prompt of the band: the tokens past 14,500 at the prior's prompt rate
    assert estimate(16000, 1, learnt).j == pytest.approx(
        learnt.prompt.j * 14500 + 1500 * PRIOR_J_PER_PROMPT_TOKEN["bf16"], rel=1e-6)
    described = rates.describe()[0]
    assert described["learnt_up_to"] == {"prompt_tokens": 14500, "output_tokens": 28}


def test_learnt_rates_are_joined_to_the_prior_once_per_pricing() -> None:
    """Every admission and settlement asks for a tenant's rates: the learnt rates with the
    prior beyond are built once per prior and reused, and built again once the prior is
    re-priced (another price applies), never served with a stale prior beyond them."""
    bills = [bill(100, 200), bill(300, 10), bill(200, 100), bill(400, 50)]
    rates = TenantRates.from_bills(bills)
    first = rates.rates("bf16", 250, PRICING, 0.0)
    assert rates.rates("bf16", 250, PRICING, 0.0) is first
    assert first.beyond is not None and first.prompt == rates.learnt[("bf16", band_of(250))].prompt
    dearer = Pricing(pue=2.0)
    again = rates.rates("bf16", 250, dearer, 0.0)
    assert again is not first
    assert again.beyond is not None and again.beyond.prompt.usd == pytest.approx(
        2 * first.beyond.prompt.usd)
    assert again.prompt == first.prompt  # the learnt part is the bills', whatever the prior


def test_estimate_is_the_sum_of_its_parts_to_the_last_bit() -> None:
    """The estimate, written out for speed, gives the very floats Cost.times and Cost.plus
    give (an admission's verdict near a budget's edge must not move)."""
    bills = [bill(10000 + 500 * i, 1 + 3 * i, a=0.024, b=0.0) for i in range(10)]
    learnt = TenantRates.from_bills(bills).rates("bf16", 12000, PRICING, 1.7e9)
    for prompt, output in ((12000, 10), (16000, 2000), (1, 1), (0, 0), (14500, 28)):
        assert learnt.beyond is not None
        head = learnt.prompt.times(min(prompt, learnt.prompt_upto)).plus(
            learnt.output.times(min(output, learnt.output_upto)))
        tail = learnt.beyond.prompt.times(max(0.0, prompt - learnt.prompt_upto)).plus(
            learnt.beyond.output.times(max(0.0, output - learnt.output_upto)))
        assert estimate(prompt, output, learnt) == head.plus(tail)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), max_size=6, unique=True), st.floats(-2e3, 2e3),
       st.floats(-2e3, 2e3))
def test_a_series_span_is_where_it_gives_the_same_value(times: list[float], t: float,
                                                        u: float) -> None:
    series = Series(tuple(sorted(times)), tuple(range(max(1, len(times)))))
    start, until = series.span(t)
    assert start <= t < until
    assert (series.at(u) == series.at(t)) == (start <= u < until)


def test_the_memo_gives_the_rates_worked_out_each_time_across_price_steps_and_refreshes(
        ) -> None:
    """A price step and a refresh's new learnt rates each change what it gives, at once."""
    pricing = Pricing(intensity_g_per_kwh=Series((100.0, 200.0), (300.0, 600.0)),
                      price_usd_per_kwh=Series((150.0,), (0.1,)))
    memo = RatesMemo(pricing)
    learnt = {"t": TenantRates.from_bills([bill(100, 200), bill(300, 10), bill(200, 100)])}
    for now in (50.0, 99.9, 100.0, 149.0, 150.0, 199.0, 200.0, 250.0, 120.0):
        for precision, prompt in (("bf16", 100), ("bf16", 5000), ("fp8", 100)):
            for who in ("t", "other"):
                want = (learnt.get(who) or TenantRates()).rates(precision, prompt, pricing, now)
                assert memo.rates(learnt, who, precision, prompt, now) == want
        if now == 149.0:  # a refresh; the price steps at 200 with the same learnt rates
            learnt = {"t": TenantRates.from_bills([bill(100, 200, a=0.05)] * 3)}
