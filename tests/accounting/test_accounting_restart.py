"""No energy lost across gateway restarts: an engine's counter that reset (before the restart
or while the gateway was down) is charged, over the downtime, what it grew by; the whole span
adds up to the counter's growth. Shared with the PostgreSQL tests (`scenario`)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from accounting.ledger.base import EngineState, Ledger
from accounting.ledger.common import SqlLedger
from accounting.ledger.sqlite import SqliteLedger
from accounting.service import AccountingService, EngineInfo
from accounting.work import interval_index
from engines.meters.base import EnergyReading, ResetTracker
from tests.accounting.test_accounting_accuracy import T0_WALL, EngineRun, run_engine
from tests.accounting.test_ledger_sqlite import Clock, drive, make_config

STEP_S = 0.25  # the drive's clock step: every meter read falls on it


def truth_at(run: EngineRun, t: float) -> float:
    """The engine's true cumulative energy at wall time t (the run's readings interpolated)."""
    ts = [r[0] for r in run.readings]
    i = bisect.bisect_left(ts, t)
    if i == 0:
        return run.readings[0][1]
    if i == len(ts):
        return run.readings[-1][1]
    (t0, e0), (t1, e1) = run.readings[i - 1], run.readings[i]
    return e0 + (e1 - e0) * (t - t0) / (t1 - t0)


@dataclass
class CounterMeter:
    """The engine's hardware counter read at the clock's time: its true energy, restarting
    from 0 at each time in `resets_at` (a driver reload, a GPU reset). With `own_tracker` the
    meter keeps it monotonic itself, as the nvml, dcgm, sim and agent meters do; without, it
    hands the raw counter over. Each process gets a new meter, as a restarted gateway does."""

    run: EngineRun
    clock: Clock
    resets_at: Sequence[float]
    own_tracker: bool
    kind: str = "counter"
    estimated: bool = False
    reads: list[float] = field(default_factory=list)
    _tracker: ResetTracker = field(default_factory=lambda: ResetTracker(1))

    def raw_j(self, t: float) -> float:
        last = max((r for r in self.resets_at if r <= t), default=None)
        return truth_at(self.run, t) - (0.0 if last is None else truth_at(self.run, last))

    async def read(self) -> EnergyReading:
        t = self.clock()
        self.reads.append(t)
        raw = (self.raw_j(t),)
        if self.own_tracker:
            return EnergyReading(t, self._tracker.update(raw), resets=self._tracker.resets)
        return EnergyReading(t, raw)

    async def close(self) -> None:
        return None


@dataclass
class Outcome:
    intervals_j: float  # every interval the ledger apportioned for the engine, summed
    shares_idle_j: float  # every share and idle account, summed
    counter_j: float  # the counter's growth from its first read to the last boundary, plus
    # the estimates of what its resets hid (counters.py)
    hidden_j: float  # what the resets hid: from the read before each to the reset itself
    estimated_j: float  # the estimates of it, both processes together
    downtime_j: float  # what the ledger charged from the last boundary before the stop on
    downtime_truth_j: float  # the counter's growth over that same window
    late: list[dict[str, object]]  # requests that finished in the last 3 s before the stop
    services: list[AccountingService]
    unaccounted_j: float  # the check's gauge at the end
    step_j: float  # its tolerance: the largest counter step seen


async def scenario(make_ledger: Callable[[], Awaitable[Ledger]], *, seed: int,
                   resets_at: Sequence[float], own_tracker: bool, stop_at: float,
                   down_s: float, while_down: Callable[[Ledger], Awaitable[None]] | None = None,
                   ) -> Outcome:
    """Run a gateway's accounting until `stop_at`, stop it, leave it down `down_s` while the
    engine keeps drawing power (and `while_down` does what it does to the ledger), start a
    new one on the same ledger, run to the end. `resets_at` are times (from T0_WALL) when the
    engine's counter restarts from 0."""
    run = run_engine(seed, duration_s=30.0)
    clock = Clock(T0_WALL)
    resets = [T0_WALL + r for r in resets_at]
    engines = [EngineInfo("e0", "m", "bf16", 1)]
    first = CounterMeter(run, clock, resets, own_tracker)
    svc = AccountingService(make_config(), engines, ledger=await make_ledger(),
                            meters={"e0": first}, clock=clock)
    await svc.ledger.open()
    await drive(svc, run, clock, T0_WALL + stop_at, step_s=STEP_S)
    await svc.stop()
    stopped = (await _state(make_ledger, while_down)).boundary_s
    clock.t += down_s  # the gateway is down; the engine is not
    second = CounterMeter(run, clock, resets, own_tracker)
    registry = CollectorRegistry()
    svc2 = AccountingService(make_config(), engines, ledger=await make_ledger(),
                             meters={"e0": second}, clock=clock, registry=registry)
    await svc2.ledger.open()
    await drive(svc2, run, clock, run.readings[-1][0], step_s=STEP_S)
    ledger = svc2.ledger
    state = (await ledger.states())["e0"]
    k0 = interval_index(first.reads[0], 1.0)
    intervals = await ledger.intervals("e0", list(range(k0, state.next_interval)))
    assert [i.interval_idx for i in intervals] == list(range(k0, state.next_interval))
    usage = await ledger.usage(0.0, 1e12, None)
    # The energy a reset hides: from the read before it to the reset itself (unknowable).
    reads = sorted({*first.reads, *second.reads})
    hidden = math.fsum(truth_at(run, r) - truth_at(run, reads[bisect.bisect_left(reads, r) - 1])
                       for r in resets)
    k_stop = interval_index(stopped, 1.0)
    late = [await ledger.request(r.request_id) for r in run.records
            if T0_WALL + stop_at - 3.0 <= r.wall(r.finished_s) < T0_WALL + stop_at]
    hidden_down = math.fsum(truth_at(run, r) - truth_at(run, reads[bisect.bisect_left(reads, r) - 1])
                            for r in resets if stopped <= r)
    # The ledger holds an estimate of what each reset hid, made by the process that saw it
    est_first, est_down = (s.engines["e0"].counters.estimated_j for s in (svc, svc2))
    return Outcome(
        intervals_j=math.fsum(i.energy_j for i in intervals),
        shares_idle_j=math.fsum(r[5] for r in usage.energy) + math.fsum(r[4] for r in usage.idle),
        counter_j=(truth_at(run, state.boundary_s) - truth_at(run, first.reads[0]) - hidden
                   + est_first + est_down),
        hidden_j=hidden, estimated_j=est_first + est_down,
        downtime_j=math.fsum(i.energy_j for i in intervals if i.interval_idx >= k_stop),
        downtime_truth_j=(truth_at(run, state.boundary_s) - truth_at(run, stopped) - hidden_down
                          + est_down),
        late=[r for r in late if r is not None], services=[svc, svc2],
        unaccounted_j=_gauge(registry, "wattgate_energy_unaccounted_joules"),
        step_j=_gauge(registry, "wattgate_meter_step_joules"))


def _gauge(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name, {"engine": "e0"})
    assert value is not None, f"{name} not published"
    return value


async def _state(make_ledger: Callable[[], Awaitable[Ledger]],
                 while_down: Callable[[Ledger], Awaitable[None]] | None) -> EngineState:
    ledger = await make_ledger()
    await ledger.open()
    try:
        state = (await ledger.states())["e0"]
        if while_down is not None:
            await while_down(ledger)
        return state
    finally:
        await ledger.close()


def assert_no_energy_lost(out: Outcome) -> None:
    """Every joule the counter grew by is in an interval, and every interval's joules are in
    shares or idle accounts; the requests that finished just before the stop are final and
    were charged."""
    assert out.intervals_j == pytest.approx(out.counter_j, rel=1e-9)
    # a reset's estimate is a floor (0 where the engine was busy after it): never more than
    # it hid
    assert 0.0 <= out.estimated_j <= out.hidden_j + 1e-9
    assert out.downtime_j == pytest.approx(out.downtime_truth_j, rel=1e-9)
    assert out.shares_idle_j == pytest.approx(out.intervals_j, rel=1e-9)
    assert abs(out.unaccounted_j) <= 1e-9 * out.counter_j < out.step_j  # the check is quiet
    assert out.late
    assert all(r["final"] and float(str(r["energy_j"])) > 0.0 for r in out.late)


def sqlite_ledgers(tmp_path: Path) -> Callable[[], Awaitable[Ledger]]:
    async def make() -> Ledger:
        return SqliteLedger(tmp_path / "l.db")

    return make


@pytest.mark.timeout(90)
@pytest.mark.parametrize("own_tracker", [True, False], ids=["meter-tracks-resets", "raw-counter"])
async def test_restart_after_a_counter_reset_charges_the_downtime(tmp_path: Path,
                                                                  own_tracker: bool) -> None:
    """The reported case: the counter reset once (8 s in), then the gateway restarted (down
    from 16 s to 22 s). The downtime window is charged the counter's growth."""
    out = await scenario(sqlite_ledgers(tmp_path), seed=41, resets_at=[8.0],
                         own_tracker=own_tracker, stop_at=16.0, down_s=6.0)
    assert_no_energy_lost(out)
    await out.services[1].stop()


@pytest.mark.timeout(90)
async def test_restart_without_a_reset_charges_the_downtime(tmp_path: Path) -> None:
    out = await scenario(sqlite_ledgers(tmp_path), seed=42, resets_at=[], own_tracker=True,
                         stop_at=14.0, down_s=5.0)
    assert_no_energy_lost(out)
    await out.services[1].stop()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("own_tracker", [True, False], ids=["meter-tracks-resets", "raw-counter"])
async def test_reset_while_the_gateway_is_down_charges_the_counter_after_it(
        tmp_path: Path, own_tracker: bool) -> None:
    """The counter restarts from 0 while no gateway reads it: the energy counted after the
    reset is charged; only what it spent between the last read and the reset is unknown."""
    out = await scenario(sqlite_ledgers(tmp_path), seed=43, resets_at=[17.5],
                         own_tracker=own_tracker, stop_at=15.0, down_s=6.0)
    assert_no_energy_lost(out)
    await out.services[1].stop()


async def _lose_the_offsets(ledger: Ledger) -> None:
    """What a gateway that forgot the counters' offsets did (the reported bug): it read the
    raw counters from scratch, found them below the boundary, and re-based the series."""
    assert isinstance(ledger, SqlLedger)
    await ledger._transaction([("UPDATE engine_state SET counter_offset_j = ?", [("[0.0]",)])])


async def lost_window_scenario(make_ledger: Callable[[], Awaitable[Ledger]]) -> Outcome:
    return await scenario(make_ledger, seed=44, resets_at=[6.0], own_tracker=True,
                          stop_at=14.0, down_s=6.0, while_down=_lose_the_offsets)


def assert_the_check_fires(out: Outcome) -> None:
    """The window the re-base lost (the downtime: the ledger charged it less than the counter
    grew) is what the check reports, far beyond a counter step."""
    lost_j = out.downtime_truth_j - out.downtime_j
    assert lost_j > 5 * 90.0  # at least the 6 s down at idle power, less the 1 s settled
    assert out.unaccounted_j == pytest.approx(lost_j, rel=1e-9)
    assert out.unaccounted_j > 10 * out.step_j


@pytest.mark.timeout(90)
async def test_the_check_reports_a_deliberately_lost_window(tmp_path: Path) -> None:
    out = await lost_window_scenario(sqlite_ledgers(tmp_path))
    assert_the_check_fires(out)
    await out.services[1].stop()
