"""The accounting loop reads the meters just after each interval boundary, so the energy at a
boundary is interpolated between readings a few milliseconds apart, not poll_s apart."""

from __future__ import annotations

import pytest

from accounting.service import BOUNDARY_LAG_S, poll_pause


def test_the_loop_wakes_just_after_the_next_boundary_when_it_comes_before_poll_s() -> None:
    """At 10.9 s, a 1-s grid: the boundary at 11.0 comes before 0.25 s: wake 2 ms past it."""
    assert poll_pause(10.9, 1.0, 0.25) == pytest.approx(0.1 + BOUNDARY_LAG_S)
    assert poll_pause(10.2, 1.0, 0.25) == pytest.approx(0.25)
    assert poll_pause(11.0 + BOUNDARY_LAG_S, 1.0, 0.25) == pytest.approx(0.25)


def test_a_step_just_past_a_boundary_but_before_its_lag_waits_for_the_lag() -> None:
    """At 11.0005 s the boundary at 11.0 still wants its reading at 11.002."""
    assert poll_pause(11.0005, 1.0, 0.25) == pytest.approx(BOUNDARY_LAG_S - 0.0005)
