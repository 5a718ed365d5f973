"""A span of a few steps weighs its steps by the batch it mostly ran in, not by the relay's
jitter at its edges (accounting/shortspan.py)."""

from __future__ import annotations

import math

import pytest

from accounting.apportion import Apportionment, apportion
from accounting.shortspan import short_span_weights
from accounting.work import WorkRow

STEP_S = 0.005


def _apportion(rows: list[WorkRow], energy_j: float = 300.0) -> Apportionment:
    return apportion(energy_j, 1.0, 75.0, rows, 0.0135, 0.0275, 3e-5, 1.444, instant=True,
                     step_s=STEP_S)


def _riders(stagger_s: float) -> list[WorkRow]:
    """30 requests of 8 prompt tokens and 2 out whose prompts the engine read in one step and
    decoded in the next, all together: their spans are 15 ms, relayed `stagger_s` apart each
    (the first token and the last of each are one read, `head_s` their whole span)."""
    return [WorkRow(f"r{i:02d}", 0, 8.0, 1.0, 0.015, 0.4 + stagger_s * i, 72.0, 0.015, 1.0)
            for i in range(30)]


# Their neighbour: a prompt read over 0.0-0.4 s (its head), then 49 tokens beside them.
NEIGHBOUR = WorkRow("nb", 0, 12000.0, 49.0, 0.8, 0.0, 2.2e6, 0.4, 0.0)


def test_requests_in_the_same_steps_pay_the_same_whatever_the_relay_order() -> None:
    """Symmetry: the 30 were in the same two steps beside the same neighbour, so their
    Shapley shares are equal. Relayed 0.2 ms apart, the first began where few others had and
    the last ended where few remained: weighed by the mean of 1/batch over those edges the
    first and the last were billed 28 % over the middle ones."""
    bills = {s.request_id: s.energy_j for s in _apportion([NEIGHBOUR, *_riders(0.0002)]).shares}
    riders = [bills[f"r{i:02d}"] for i in range(30)]
    assert max(riders) == pytest.approx(min(riders), rel=1e-12)
    # and about what they pay had they reached the gateway at one instant (the stagger still
    # moves the neighbour's tail, which their spans cover for less of its time)
    same = {s.request_id: s.energy_j for s in _apportion([NEIGHBOUR, *_riders(0.0)]).shares}
    assert riders[0] == pytest.approx(same["r00"], rel=0.005)
    assert bills["nb"] == pytest.approx(same["nb"], rel=0.001)


def test_the_batch_is_the_one_at_the_middle() -> None:
    """Two 20-ms spans that overlap for 2 ms ran mostly alone (batch 1 each); a span inside a
    busy stretch takes that stretch's batch."""
    start, res = [0.1, 0.118, 0.5, 0.5, 0.5, 0.505], [0.02, 0.02, 0.2, 0.2, 0.2, 0.01]
    got = short_span_weights([0.0] * 6, [True] * 6, start, res, 1.0)
    assert got is not None
    assert got[0] == pytest.approx(0.02) and got[1] == pytest.approx(0.02)
    assert got[5] == pytest.approx(0.01 / 4)
    assert got[2:5] == [0.0, 0.0, 0.0]  # long spans keep their weights
    # rows without token work are in no step: not counted, and not weighed
    assert short_span_weights([1.0, 2.0], [False, True], [0.1, 0.1], [0.02, 0.02], 1.0) \
        == [1.0, 0.02]


def test_no_short_span_leaves_the_weights() -> None:
    assert short_span_weights([0.3], [True], [0.0], [0.3], 1.0) is None


def test_conservation_holds() -> None:
    a = _apportion([NEIGHBOUR, *_riders(0.0002)])
    assert math.fsum(a.columns.energy_j) + a.idle_j == pytest.approx(300.0, abs=1e-9)
