"""Property tests of the service's apportioning mode (`apportion_by`: instant sharing of static
power and decode steps, a per-precision step cost): conservation, non-negativity, order
independence, no dynamic share without token work."""

from __future__ import annotations

import math
from functools import partial
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.apportion import apportion, apportion_by, instant_weights, step_joules
from accounting.coefficients import DEFAULTS, Coefficients
from accounting.work import WorkRow
from tests.accounting.test_apportion_properties import DT
from tests.accounting.test_apportion_properties import work_sets as base_work_sets

work_sets = partial(base_work_sets, with_kv=True)


energies = st.sampled_from([0.0]) | st.floats(0.0, 5000.0) | st.floats(1e-6, 1e-3)
idle_powers = st.floats(0.0, 1500.0)
coefficients = st.sampled_from(sorted(DEFAULTS.values(), key=repr)) | st.builds(
    Coefficients, st.floats(0.0, 0.1), st.floats(0.0, 0.1), st.floats(0.0, 1e-4),
    st.floats(0.0, 3.0), st.none() | st.floats(0.0, 3.0), st.floats(0.0, 100.0),
    st.floats(0.0, 0.02))  # step_s: the Shapley split of the static power


@settings(max_examples=100, deadline=None)
@given(work_sets(), energies, idle_powers, coefficients)
def test_instant_shares_plus_idle_equal_measured_energy_and_are_non_negative(
        rows: list[WorkRow], energy: float, idle_w: float, c: Coefficients) -> None:
    a = apportion_by(energy, DT, idle_w, rows, c)
    total = math.fsum(s.energy_j for s in a.shares) + a.idle_j
    assert total == pytest.approx(energy, rel=1e-9, abs=1e-12)
    assert a.idle_j >= -1e-12 * max(1.0, energy)
    for s in a.shares:
        assert s.energy_j >= 0.0 and s.static_j >= 0.0 and s.dynamic_j >= 0.0
        assert s.busy_s >= 0.0


@settings(max_examples=100, deadline=None)
@given(work_sets(), energies, idle_powers, coefficients, st.randoms())
def test_instant_shares_do_not_depend_on_request_order(
        rows: list[WorkRow], energy: float, idle_w: float, c: Coefficients,
        rnd: object) -> None:
    shuffled = list(rows)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    a = apportion_by(energy, DT, idle_w, rows, c)
    b = apportion_by(energy, DT, idle_w, shuffled, c)
    assert {s.request_id: s for s in a.shares} == {s.request_id: s for s in b.shares}
    assert a.idle_j == b.idle_j


@settings(max_examples=100, deadline=None)
@given(work_sets(), energies, idle_powers, coefficients)
def test_instant_request_without_token_work_gets_no_dynamic_share(
        rows: list[WorkRow], energy: float, idle_w: float, c: Coefficients) -> None:
    a = apportion_by(energy, DT, idle_w, rows, c)
    by_id = {s.request_id: s for s in a.shares}
    for r in rows:
        if c.alpha * r.prefill_tokens + c.beta * r.decode_tokens + c.gamma * r.kv_tokens == 0.0:
            assert by_id.get(r.request_id) is None or by_id[r.request_id].dynamic_j == 0.0
        if r.residency_s == 0.0 and r.request_id in by_id:
            assert by_id[r.request_id].static_j == 0.0


@settings(max_examples=100, deadline=None)
@given(work_sets().filter(lambda rows: any(r.residency_s > 0.0 for r in rows)))
def test_instant_weights_sum_to_the_busy_time(rows: list[WorkRow]) -> None:
    w = instant_weights([r.start_s for r in rows], [r.residency_s for r in rows], DT)
    spans = sorted((r.start_s, r.start_s + r.residency_s) for r in rows if r.residency_s > 0)
    union, hi = 0.0, -1.0
    for lo, end in spans:
        union += max(0.0, end - max(lo, hi))
        hi = max(hi, end)
    assert math.fsum(w) == pytest.approx(union, rel=1e-9, abs=1e-12)
    assert all(x >= 0.0 for x in w)


def _weights_by_brute_force(spans: list[tuple[float, float]], dt: float) -> list[float]:
    """The integral of 1/n(t) over each span, n counted afresh on every piece between two
    consecutive ends of any span (O(n^2): an oracle for small sets)."""
    ends = sorted({0.0, dt, *(lo for lo, _ in spans), *(lo + r for lo, r in spans)})
    out = [0.0] * len(spans)
    for a, b in pairwise(ends):
        inside = [i for i, (lo, r) in enumerate(spans)
                  if r > 0.0 and (r >= dt * (1 - 1e-12) or (lo <= a and b <= lo + r))]
        for i in inside:
            out[i] += (b - a) / len(inside)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.25, 0.5]) | st.floats(0.0, 0.99),
                          st.sampled_from([0.0, DT, 0.25]) | st.floats(0.0, 1.0)),
                max_size=12))
def test_instant_weights_match_a_brute_force_sweep(pairs: list[tuple[float, float]]) -> None:
    spans = [(lo, min(r, DT - lo)) for lo, r in pairs]  # a span ends inside its interval
    w = instant_weights([lo for lo, _ in spans], [r for _, r in spans], DT)
    assert len(w) == len(spans)
    for got, want in zip(w, _weights_by_brute_force(spans, DT), strict=True):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_instant_weights_of_a_known_batch() -> None:
    """a all second; b [0, 0.5); c [0.25, 0.75): n = 2, 3, 2, 1 on the quarters."""
    w = instant_weights([0.0, 0.0, 0.25], [1.0, 0.5, 0.5], DT)
    third = 0.25 / 3
    assert list(w) == pytest.approx([0.125 + third + 0.125 + 0.25, 0.125 + third,
                                      third + 0.125])


def test_static_is_shared_equally_among_requests_resident_at_each_instant() -> None:
    """a resident all second, b the first half: a pays 1/2 of the first half and all of the
    second (0.75 of the static), b 0.25; by residency seconds it would be 2/3 and 1/3."""
    rows = [WorkRow("a", 0, 0.0, 30.0, 1.0, 0.0), WorkRow("b", 0, 100.0, 0.0, 0.5, 0.0)]
    inst = {s.request_id: s for s in apportion_by(100.0, DT, 40.0, rows, Coefficients(0.1, 1.0)).shares}
    old = {s.request_id: s for s in apportion(100.0, DT, 40.0, rows, 0.1, 1.0).shares}
    assert inst["a"].static_j == pytest.approx(30.0) and inst["b"].static_j == pytest.approx(10.0)
    assert old["a"].static_j == pytest.approx(40.0 * 2 / 3)
    assert inst["a"].busy_s == pytest.approx(0.75) and inst["b"].busy_s == pytest.approx(0.25)


def test_decode_steps_go_to_the_sequences_resident_while_they_run() -> None:
    """Two requests each decode 10 tokens; b stays alone for the second half. A sequence's
    share of the steps is its tokens times the mean of 1/batch over its span: a's 10 tokens
    all came with b beside it (10 x 1/2 = 5), b's 10 half beside a, half alone
    (10 x (1/2 x 1/2 + 1/2 x 1) = 7.5): b has 60 % of the steps' weight streaming."""
    rows = [WorkRow("a", 0, 0.0, 10.0, 0.5, 0.0), WorkRow("b", 0, 0.0, 10.0, 1.0, 0.0)]
    c = Coefficients(0.0, 1e-12, 0.0, 1.0)
    s = {x.request_id: x for x in apportion_by(100.0, DT, 0.0, rows, c).shares}
    assert s["b"].dynamic_j == pytest.approx(60.0) and s["a"].dynamic_j == pytest.approx(40.0)


def test_a_prompt_chunk_shares_its_steps_weight_reads_with_the_decoders() -> None:
    """A 16,384-token prompt (two chunks of the token budget) prefilled beside a decoder of 2
    tokens over the same span: 4 sequence-steps of weight streaming, half of them the
    prompt's (the decoder used to get all of them)."""
    rows = [WorkRow("p", 0, 16_384.0, 0.0, 1.0, 0.0), WorkRow("d", 0, 0.0, 2.0, 1.0, 0.0)]
    c = Coefficients(1e-12, 1e-12, 0.0, 1.0)  # only the steps' term weighs
    s = {x.request_id: x for x in apportion_by(100.0, DT, 0.0, rows, c).shares}
    assert s["p"].dynamic_j == pytest.approx(50.0) and s["d"].dynamic_j == pytest.approx(50.0)


def test_step_cost_falls_from_one_token_per_step_to_many() -> None:
    fp8 = DEFAULTS["fp8"]
    assert fp8.delta_1 is not None
    assert step_joules(fp8.delta, fp8.delta_1, fp8.delta_half_tokens, 1.0) == fp8.delta_1
    mid = step_joules(fp8.delta, fp8.delta_1, fp8.delta_half_tokens, 1.0 + fp8.delta_half_tokens)
    assert mid == pytest.approx((fp8.delta + fp8.delta_1) / 2)
    assert step_joules(fp8.delta, fp8.delta_1, fp8.delta_half_tokens, 1e9) == pytest.approx(
        fp8.delta, rel=1e-6)
    assert step_joules(1.4, None, 0.0, 64.0) == 1.4


def test_subnormal_instant_weight_gives_no_nan_and_no_dynamic_share_without_work() -> None:
    """A decoding request resident for a subnormal span must not turn the steps' energy into
    NaN for the others (found by the no-dynamic-share property)."""
    rows = [WorkRow("idle", 7, 0.0, 0.0, 1.0, 0.0), WorkRow("dec", 7, 0.0, 1.0, 2.2250738585e-313)]
    a = apportion_by(100.0, DT, 10.0, rows, DEFAULTS["int8"])
    s = {x.request_id: x for x in a.shares}
    assert all(math.isfinite(x.energy_j) for x in a.shares)
    assert s["idle"].dynamic_j == 0.0 and s["dec"].dynamic_j == pytest.approx(90.0)
    assert math.fsum(x.energy_j for x in a.shares) + a.idle_j == pytest.approx(100.0)


def test_a_row_with_neither_residency_nor_work_gets_no_share_and_columns_stay_aligned() -> None:
    rows = [WorkRow("a", 0, 0.0, 10.0, 1.0, 0.0, 500.0), WorkRow("ghost", 0, 0.0, 0.0, 0.0, 0.0),
            WorkRow("b", 0, 200.0, 0.0, 0.5, 0.25)]
    a = apportion_by(300.0, DT, 100.0, rows, DEFAULTS["bf16"])
    ids, energy, static, dynamic, busy = a.columns
    assert tuple(ids) == ("a", "b")
    assert len(energy) == len(static) == len(dynamic) == len(busy) == 2
    assert [s.request_id for s in a.shares] == ["a", "b"]
    for s, e, st_j, dy, b in zip(a.shares, energy, static, dynamic, busy, strict=True):
        assert (s.energy_j, s.static_j, s.dynamic_j, s.busy_s) == (e, st_j, dy, b)
        assert e == st_j + dy
    assert math.fsum(energy) + a.idle_j == pytest.approx(300.0, rel=1e-12)
