"""The simulator's Shapley truth: the game is the step's own energy, the closed form and the
sampled estimate agree with enumerating every coalition, and riders pay by the Shapley rule."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engines.sim.catalog import deployment
from engines.sim.game import StepGame
from engines.sim.perf import DECODE, PREFILL, SeqWork, kernel_profile, step_cost
from engines.sim.power import step_energy
from engines.sim.scheduler import BatchingCore
from engines.sim.shapley import AFFINE, EXACT, SAMPLED, _enumerate, shapley

PRECISIONS = [("vllm", "bf16"), ("vllm", "fp8"), ("vllm", "int4"), ("trtllm", "fp8")]

seq = st.one_of(
    st.builds(SeqWork, st.integers(1, 4096), st.integers(0, 20000), st.just(PREFILL)),
    st.builds(SeqWork, st.just(1), st.integers(1, 30000), st.just(DECODE)),
)


def game_of(dialect: str, precision: str, tp: int = 1) -> StepGame:
    return StepGame.of(deployment("h100", "llama-3.1-8b", precision, tp), kernel_profile(dialect, precision))


def step_total_j(g: StepGame, dialect: str, precision: str, work: list[SeqWork]) -> float:
    prof = kernel_profile(dialect, precision)
    e = step_energy(g.deployment, prof, step_cost(g.deployment, prof, work))
    return e.static_w * e.duration_s + math.fsum(e.seq_dynamic_j)


def brute_shapley(g: StepGame, which: tuple[str, str], work: list[SeqWork]) -> list[float]:
    """The textbook formula over explicit coalitions, each priced by perf.py and power.py."""
    n = len(work)
    prof_total: dict[tuple[int, ...], float] = {(): 0.0}
    for k in range(1, n + 1):
        for c in combinations(range(n), k):
            prof_total[c] = step_total_j(g, *which, [work[i] for i in c])
    out = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        phi = 0.0
        for k in range(n):
            w = math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
            for c in combinations(others, k):
                phi += w * (prof_total[tuple(sorted((*c, i)))] - prof_total[c])
        out.append(phi)
    return out


def _sums(g: StepGame, work: list[SeqWork]) -> tuple[float, float, float, float]:
    pl = g.players(work)
    return float(len(work)), float(pl.tokens.sum()), float(pl.attn_s.sum()), float(pl.kv_s.sum())


@settings(max_examples=80, deadline=None)
@given(work=st.lists(seq, min_size=1, max_size=12), which=st.sampled_from(PRECISIONS),
       tp=st.sampled_from([1, 2]))
def test_the_game_prices_the_whole_batch_as_the_step_does(
        work: list[SeqWork], which: tuple[str, str], tp: int) -> None:
    g = game_of(*which, tp=tp)
    prof = kernel_profile(*which)
    e = step_energy(g.deployment, prof, step_cost(g.deployment, prof, work))
    assert float(g.energy_j(*_sums(g, work))) == pytest.approx(
        e.static_w * e.duration_s + math.fsum(e.seq_dynamic_j), rel=1e-12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(work=st.lists(seq, min_size=2, max_size=6), which=st.sampled_from(PRECISIONS))
def test_small_batches_match_the_textbook_formula_and_sum_to_the_step(
        work: list[SeqWork], which: tuple[str, str]) -> None:
    g = game_of(*which)
    total = step_total_j(g, *which, work)
    split = shapley(g, g.players(work), total, np.random.default_rng(0))
    assert split.method in (AFFINE, EXACT)
    assert split.shares_j == pytest.approx(brute_shapley(g, which, work), rel=1e-9, abs=1e-12)
    assert math.fsum(split.shares_j) == pytest.approx(total, rel=1e-15)


@settings(max_examples=40, deadline=None)
@given(contexts=st.lists(st.integers(1, 30000), min_size=2, max_size=8),
       which=st.sampled_from(PRECISIONS))
def test_decode_batches_take_the_exact_closed_form(contexts: list[int], which: tuple[str, str]) -> None:
    """Decodes alone are memory-bound in every coalition: a / n + b . x_i, checked against
    enumeration (which the closed form must equal, not approximate)."""
    g = game_of(*which)
    work = [SeqWork(1, c, DECODE) for c in contexts]
    split = shapley(g, g.players(work), step_total_j(g, *which, work), np.random.default_rng(0))
    assert split.method == AFFINE
    assert split.shares_j == pytest.approx(list(_enumerate(g, g.players(work))), rel=1e-9)


def test_sampled_shares_of_a_large_mixed_batch_are_within_their_stated_error() -> None:
    """A prompt chunk with 11 riders (12 sequences: sampled) against all 4,096 coalitions."""
    for which in PRECISIONS:
        g = game_of(*which)
        work = [SeqWork(3808, 8192, PREFILL)] + [SeqWork(8 + i, 0, PREFILL) for i in range(11)]
        total = step_total_j(g, *which, work)
        split = shapley(g, g.players(work), total, np.random.default_rng(3))
        exact = _enumerate(g, g.players(work))
        assert split.method == SAMPLED
        assert math.fsum(split.shares_j) == pytest.approx(total, rel=1e-15)
        for got, want, var in zip(split.shares_j, exact, split.variance_j2, strict=True):
            assert abs(got - want) <= 5.0 * math.sqrt(var) + 1e-9 * total
            assert abs(got - want) <= 0.05 * want


def test_a_rider_pays_its_share_of_the_fixed_part_not_of_the_neighbours_prefill_time() -> None:
    """30 riders sent while a 12,000-token prompt is prefilled: the ones that join its second
    chunk pay an equal share of that step's fixed part and their tokens' part (about a
    quarter of the residency view's equal split of its static power); the neighbour pays
    nearly all of it."""
    d = deployment("h100", "llama-3.1-8b", "bf16")
    core = BatchingCore(d, kernel_profile("vllm", "bf16"))
    core.submit("neighbour", 12000, 1, 0.0)
    for i in range(30):
        core.submit(f"rider{i}", 8, 2, 0.1)
    while (wake := core.next_wakeup_s()) is not None:
        core.advance(wake)
    truth = {t.request_id: t for t in core.take_finished()}
    rider = truth["rider0"]
    assert rider.shapley_energy_j < 0.5 * rider.energy_j
    riders = [truth[f"rider{i}"] for i in range(30)]
    assert max(r.shapley_energy_j for r in riders) == pytest.approx(
        min(r.shapley_energy_j for r in riders), rel=0.05)  # symmetric players, sampled
    nb = truth["neighbour"]
    assert nb.shapley_energy_j > nb.energy_j  # what the riders no longer pay
    total = math.fsum(t.shapley_energy_j for t in truth.values())
    assert total == pytest.approx(math.fsum(t.energy_j for t in truth.values()), rel=1e-12)
