"""The pieces that carry counters across restarts: a reset tracker resumed from stored raw
counters and offsets, readings that keep their raw counters, the counters' growth, the
ledger's round trip of the stored state, and a ledger from before schema v6."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from accounting.counters import (
    CounterState,
    EngineCounters,
    begin_check,
    gap_estimate_j,
    growth_j,
    unaccounted_j,
)
from accounting.ledger.base import EngineState, Ledger
from accounting.ledger.common import SqlLedger
from accounting.ledger.sqlite import SqliteLedger
from engines.meters.base import EnergyReading, ResetTracker
from tests.accounting.test_accounting_restart import assert_no_energy_lost, scenario, sqlite_ledgers


def test_a_resumed_tracker_continues_the_series_and_takes_a_lower_counter_as_a_reset() -> None:
    tracker = ResetTracker.resumed([100.0, 40.0], [500.0, 0.0], resets=1)
    assert tracker.update([130.0, 45.0]) == (630.0, 45.0)
    assert tracker.update([20.0, 50.0]) == (650.0, 50.0)  # GPU 0 restarted: 130 kept
    assert tracker.resets == 2
    assert tracker.offset_j == (630.0, 0.0) and tracker.last_raw_j == (20.0, 50.0)
    with pytest.raises(ValueError):
        ResetTracker.resumed([1.0], [0.0, 0.0], resets=0)


def test_a_reading_keeps_the_raw_counters_its_tracker_was_given() -> None:
    tracker = ResetTracker(1)
    tracker.update([300.0])
    reading = EnergyReading(1.0, tracker.update([10.0]))
    assert reading.energy_j == (310.0,) and reading.raw_j == (10.0,)
    assert EnergyReading(1.0, (5.0,)).raw_j is None  # a meter without raw counters
    assert EnergyReading(1.0, (5.0,), raw_j=(2.0,)).raw_j == (2.0,)


def test_growth_counts_each_gpu_apart_and_a_restarted_one_from_zero() -> None:
    # GPU 0 restarted (it counted 5 J since); GPU 1 grew by 10. Summed per engine, the drop
    # of 85 J would hide both.
    assert growth_j((100.0, 100.0), (5.0, 110.0)) == 15.0
    assert growth_j((1.0,), (1.0,)) == 0.0


def test_counters_resume_from_the_stored_state_without_a_step() -> None:
    before = EngineCounters()
    for t, raw in [(1.0, 100.0), (2.0, 10.0), (3.0, 30.0)]:  # a reset at 2 s
        before.update(t, (raw,))
    begin_check(before, None, 0.0)
    before.update(4.0, (50.0,))
    stored = before.state()
    assert stored == CounterState(4.0, (50.0,), (100.0,), 1, 20.0)
    after = EngineCounters(stored)
    assert after.update(9.0, (80.0,)) == 180.0  # the same series: 100 + 80
    assert after.resumed and after.metered_j == 50.0 and after.resets == 1
    assert after.update(9.0, (99.0,)) is None  # a repeated timestamp is not a reading
    again = EngineCounters(after.state())
    assert again.update(12.0, (7.0,)) == 187.0  # restarted while down: 80 kept, 7 counted
    assert again.metered_j == 57.0 and again.resets == 2


def test_counters_stored_for_other_gpus_start_afresh(caplog: pytest.LogCaptureFixture) -> None:
    stored = CounterState(4.0, (50.0,), (100.0,), 1, 20.0)
    counters = EngineCounters(stored)
    with caplog.at_level(logging.WARNING, "wattgate.accounting"):
        assert counters.update(5.0, (10.0, 20.0)) == 30.0
    assert not counters.resumed and counters.metered_j is None
    assert "growth over the gateway's downtime is unknown" in caplog.text
    assert begin_check(counters, 700.0, 12.0) == 700.0 and counters.metered_j == 712.0
    assert unaccounted_j(712.0, 700.0, 12.0) == 0.0


async def test_the_ledger_returns_the_stored_counters_bit_for_bit(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    await ledger.open()
    counter = CounterState(1.7e9 + 0.1, (0.1 + 0.2, 1e-300, 123456789.123456789),
                           (1 / 3, 0.0, 2.0**60 + 1.0), 3, 7.0 / 9.0)
    state = EngineState("e0", 5, 5.0, 123.456, 2, counter, 99.0 / 7.0)
    await ledger.commit("e0", [], [], [], state)
    assert (await ledger.states())["e0"] == state
    bare = EngineState("e1", 5, 5.0, 1.0)
    await ledger.commit("e1", [], [], [], bare)
    assert (await ledger.states())["e1"] == bare
    await ledger.close()


async def _forget_the_counters(ledger: Ledger) -> None:
    """The engine's row as a gateway before schema v6 left it."""
    assert isinstance(ledger, SqlLedger)
    await ledger._transaction([(
        "UPDATE engine_state SET counter_seen_s = NULL, counter_raw_j = NULL, "
        "counter_offset_j = NULL, counter_resets = NULL, metered_j = NULL, "
        "apportioned_j = NULL", [()])])


@pytest.mark.timeout(90)
async def test_a_ledger_without_stored_counters_restarts_as_before_and_begins_the_check(
        tmp_path: Path) -> None:
    """Upgraded from schema v5: the counters never reset, so the raw series still lies above
    the boundary and the downtime is charged; the check begins at the restart, quiet."""
    out = await scenario(sqlite_ledgers(tmp_path), seed=45, resets_at=[], own_tracker=True,
                         stop_at=12.0, down_s=4.0, while_down=_forget_the_counters)
    assert_no_energy_lost(out)
    await out.services[1].stop()


def test_a_reset_while_unread_is_bridged_at_idle_power_and_counted_as_estimated() -> None:
    stored = CounterState(10.0, (500.0, 500.0), (0.0, 0.0), 0, 1000.0)
    counters = EngineCounters(stored)
    # 30 s later GPU 0 has restarted (200 J since), GPU 1 grew by 1200; idle 40 W per engine:
    # GPU 0's share is 20 W x 30 s = 600 J, of which 200 were counted after the restart
    total = counters.update(40.0, (200.0, 1700.0), floor_w=40.0)
    assert counters.estimated_j == 400.0 and counters.gaps == 1
    assert total == 500.0 + 400.0 + 200.0 + 1700.0
    assert counters.metered_j == 1000.0 + 200.0 + 1200.0 + 400.0
    state = counters.state()
    assert state is not None and state.offset_j == (900.0, 0.0)  # stored with the series
    assert counters.update(41.0, (220.0, 1750.0), floor_w=40.0) == total + 70.0  # no reset
    assert counters.gaps == 1
    # a restarted counter above the floor: nothing invented; no power known: unknown, 0 J
    assert gap_estimate_j(40.0, 10.0, 1.0, 500.0) == 0.0
    assert gap_estimate_j(None, 10.0, 1.0, 0.0) == 0.0
    unknown = EngineCounters(stored)
    unknown.update(40.0, (200.0, 1700.0))
    assert unknown.gaps == 1 and unknown.estimated_j == 0.0
