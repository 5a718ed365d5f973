"""Property tests of the apportioner: conservation, non-negativity, order independence."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.apportion import apportion, busy_seconds
from accounting.work import WorkRow

DT = 1.0


@st.composite
def work_sets(draw: st.DrawFn, with_kv: bool = False) -> list[WorkRow]:
    """Random work rows of one interval (with KV read work too when `with_kv`)."""
    n = draw(st.integers(0, 24))
    rows = []
    for i in range(n):
        res = draw(st.sampled_from([0.0, DT]) | st.floats(0.0, DT))
        start = draw(st.floats(0.0, DT - res)) if res < DT else 0.0
        prefill = draw(st.sampled_from([0.0]) | st.floats(0.0, 8192.0))
        decode = draw(st.sampled_from([0.0]) | st.floats(0.0, 256.0))
        kv = draw(st.sampled_from([0.0]) | st.floats(0.0, 1e6)) if with_kv else 0.0
        # the prefill's seconds from the span's start (0: not known, or none)
        pf = draw(st.sampled_from([0.0, res]) | st.floats(0.0, res)) if prefill else 0.0
        rows.append(WorkRow(f"r{i}", 7, prefill, decode, res, start, kv, pf))
    return rows


energies = st.sampled_from([0.0]) | st.floats(0.0, 5000.0) | st.floats(1e-6, 1e-3)
idle_powers = st.floats(0.0, 1500.0)
coeffs = st.floats(0.0, 2.0)


@settings(max_examples=100, deadline=None)
@given(work_sets(), energies, idle_powers, coeffs, st.floats(0.01, 2.0))
def test_shares_plus_idle_equal_measured_energy_and_are_non_negative(
        rows: list[WorkRow], energy: float, idle_w: float, alpha: float, beta: float) -> None:
    a = apportion(energy, DT, idle_w, rows, alpha, beta)
    total = math.fsum(s.energy_j for s in a.shares) + a.idle_j
    assert total == pytest.approx(energy, rel=1e-9, abs=1e-12)
    assert a.idle_j >= 0.0
    for s in a.shares:
        assert s.energy_j >= 0.0 and s.static_j >= 0.0 and s.dynamic_j >= 0.0
        assert s.busy_s >= 0.0


@settings(max_examples=100, deadline=None)
@given(work_sets(), energies, idle_powers, coeffs, st.floats(0.01, 2.0), st.randoms())
def test_shares_do_not_depend_on_request_order(rows: list[WorkRow], energy: float, idle_w: float,
                                               alpha: float, beta: float, rnd: object) -> None:
    shuffled = list(rows)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    a = apportion(energy, DT, idle_w, rows, alpha, beta)
    b = apportion(energy, DT, idle_w, shuffled, alpha, beta)
    assert {s.request_id: s for s in a.shares} == {s.request_id: s for s in b.shares}
    assert a.idle_j == b.idle_j


@settings(max_examples=100, deadline=None)
@given(work_sets(), energies, idle_powers, coeffs, st.floats(0.01, 2.0))
def test_request_without_token_work_gets_no_dynamic_share(
        rows: list[WorkRow], energy: float, idle_w: float, alpha: float, beta: float) -> None:
    a = apportion(energy, DT, idle_w, rows, alpha, beta)
    by_id = {s.request_id: s for s in a.shares}
    for r in rows:
        if alpha * r.prefill_tokens + beta * r.decode_tokens == 0.0:
            assert by_id.get(r.request_id) is None or by_id[r.request_id].dynamic_j == 0.0
        if r.residency_s == 0.0 and r.request_id in by_id:
            assert by_id[r.request_id].static_j == 0.0


@given(energies, idle_powers)
def test_interval_without_requests_goes_to_idle_account(energy: float, idle_w: float) -> None:
    a = apportion(energy, DT, idle_w, [], 0.1, 1.0)
    assert a.shares == ()
    assert a.idle_j == energy


def test_static_follows_residency_and_dynamic_follows_token_work() -> None:
    """100 J over 1 s at 40 W idle: 40 J static by residency, 60 J dynamic by work."""
    rows = [WorkRow("a", 0, 0.0, 30.0, 1.0, 0.0), WorkRow("b", 0, 100.0, 0.0, 0.5, 0.0)]
    a = apportion(100.0, 1.0, 40.0, rows, 0.1, 1.0)
    s = {x.request_id: x for x in a.shares}
    assert s["a"].static_j == pytest.approx(40.0 * 2 / 3)
    assert s["b"].static_j == pytest.approx(40.0 / 3)
    assert s["a"].dynamic_j == pytest.approx(60.0 * 30 / 40)
    assert s["b"].dynamic_j == pytest.approx(60.0 * 10 / 40)
    assert a.idle_j == 0.0


def test_static_of_empty_part_of_interval_is_idle() -> None:
    """One request resident 0.25 s: three quarters of the static energy is idle."""
    a = apportion(100.0, 1.0, 80.0, [WorkRow("a", 0, 0.0, 5.0, 0.25, 0.5)], 0.1, 1.0)
    assert a.idle_j == pytest.approx(60.0)
    assert a.shares[0].energy_j == pytest.approx(40.0)


def test_static_bounded_by_measured_energy() -> None:
    """A lagging counter shows less than idle power: all of it is static, none dynamic."""
    a = apportion(10.0, 1.0, 80.0, [WorkRow("a", 0, 0.0, 5.0, 1.0, 0.0)], 0.1, 1.0)
    assert a.static_j == 10.0 and a.dynamic_j == 0.0
    assert a.shares[0].energy_j == pytest.approx(10.0)


def test_busy_time_is_union_of_overlapping_spans() -> None:
    rows = [WorkRow("a", 0, 0, 0, 0.5, 0.0), WorkRow("b", 0, 0, 0, 0.5, 0.25),
            WorkRow("c", 0, 0, 0, 0.1, 0.9)]
    assert busy_seconds(rows, 1.0) == pytest.approx(0.85)


def test_negative_energy_is_rejected() -> None:
    with pytest.raises(ValueError, match="energy"):
        apportion(-1.0, 1.0, 0.0, [], 1.0, 1.0)
