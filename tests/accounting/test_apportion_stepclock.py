"""A decoder of even pace beside a prompt's reading ran one step in all that reading: its
steps follow the engine's step clock (accounting/stepclock.py), not even time."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.apportion import Apportionment, apportion
from accounting.stepclock import clocked_weights
from accounting.work import WorkRow
from tests.accounting.test_apportion_properties import energies, idle_powers, work_sets

STEP_S = 0.005  # a decode step: 200 a second


def _apportion(rows: list[WorkRow], energy_j: float = 100.0,
               idle_w: float = 20.0) -> Apportionment:
    return apportion(energy_j, 1.0, idle_w, rows, 0.01, 0.02, 3e-5, 1.0, instant=True,
                     step_s=STEP_S)


def _bills(a: Apportionment) -> dict[str, tuple[float, float]]:
    return {s.request_id: (s.static_j, s.dynamic_j) for s in a.shares}


# A 3,000-token prompt read over 0.1-0.2 s (one chunk: 10 steps a second), then 5 tokens.
LONG = WorkRow("long", 0, 3000.0, 5.0, 0.2, 0.1, 0.0, 0.1)


def test_a_decoder_beside_a_prompt_reading_is_billed_as_its_steps_came() -> None:
    """20 tokens over 0.0-0.3 s, no token events: the step clock puts 0.1 * 200 / (0.2 * 200
    + 0.1 * 10) of them in its 0.1 s alone, the same as a head that holds them says."""
    solo = WorkRow("solo", 0, 0.0, 20.0, 0.3, 0.0)
    alone = 20.0 * (0.1 / STEP_S) / (0.2 / STEP_S + 0.1 * 10.0)  # 9.76 tokens
    with_head = WorkRow("solo", 0, 0.0, 20.0, 0.3, 0.0, 0.0, 0.1, alone)
    got, want = _bills(_apportion([solo, LONG])), _bills(_apportion([with_head, LONG]))
    for rid in ("solo", "long"):
        assert got[rid] == pytest.approx(want[rid], rel=1e-9)
    # spread evenly its tokens would be 2/3 alone: it ran more of its steps alone than that
    even = WorkRow("solo", 0, 0.0, 20.0, 0.3, 0.0, 0.0, 0.1, 20.0 / 3.0)
    assert got["solo"][1] > _bills(_apportion([even, LONG]))["solo"][1] * 1.05


def test_only_decoders_without_a_head_that_meet_a_prompt_reading_are_reweighed() -> None:
    """No prefill head: nothing changes; a decoder that ended before the reading, or with a
    head of its own (its events placed its tokens: a cut, or one pace over its whole span),
    keeps the plain integral of 1/batch."""
    rows = [WorkRow("before", 0, 0.0, 10.0, 0.09, 0.0), LONG,
            WorkRow("headed", 0, 0.0, 20.0, 0.3, 0.0, 0.0, 0.1, 5.0),
            WorkRow("beside", 0, 0.0, 20.0, 0.3, 0.0),
            WorkRow("seen", 0, 0.0, 20.0, 0.3, 0.0, 0.0, 0.3, 20.0)]  # events of one pace
    rows = [rows[0], rows[1], rows[2], rows[4], rows[3]]
    cols = list(zip(*rows, strict=True))
    plain = 0.09 / 4 + 0.01 / 3 + 0.2 / 4  # the integral of 1/batch over 0.0-0.3 s
    weights = [0.09 / 4, 0.2 / 4, plain, plain, plain]
    got = clocked_weights(weights, [1.0] * 5, cols[5], cols[4], cols[2], cols[3], cols[7],
                          cols[8], 1.0, STEP_S)
    assert got is not None
    assert got[:4] == weights[:4]
    # 1/batch over 0-0.09, 0.09-0.1, 0.1-0.2 (the reading) and 0.2-0.3 s: 4, 3, 4, 4 rows
    clock = (0.09 * 200 / 4 + 0.01 * 200 / 3 + 0.1 * 10 / 4 + 0.1 * 200 / 4, 41.0)
    assert got[4] == pytest.approx(0.3 * clock[0] / clock[1]) and got[4] > plain
    assert clocked_weights(weights, [1.0] * 5, cols[5], cols[4], [0.0] * 5, cols[3], cols[7],
                           cols[8], 1.0, STEP_S) is None  # no prompt: no reading


@settings(max_examples=100, deadline=None)
@given(work_sets(), energies, idle_powers, st.randoms())
def test_with_the_step_clock_shares_add_up_and_do_not_depend_on_request_order(
        rows: list[WorkRow], energy: float, idle_w: float, rnd: object) -> None:
    shuffled = list(rows)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    a, b = _apportion(rows, energy, idle_w), _apportion(shuffled, energy, idle_w)
    assert {s.request_id: s for s in a.shares} == {s.request_id: s for s in b.shares}
    total = math.fsum(a.columns.energy_j) + a.idle_j
    assert total == pytest.approx(energy, rel=1e-9, abs=1e-12)
    assert all(s.energy_j >= 0.0 for s in a.shares)
