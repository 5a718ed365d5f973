"""The meter poller: each engine's meter read into its energy track, on counters continued from
the ledger (so a restarted apportioner counts on the same series), and stored back at a clean
stop. It runs where the apportioner runs, never on a proxy process whose apportioner is out of
process: the readings are only of use to whoever apportions them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accounting.coefficients import Coefficients, default_for
from accounting.config import AccountingConfig, LedgerConfig
from accounting.counters import DEFAULT_IDLE_W_PER_GPU, EngineCounters
from accounting.energy import EnergyTrack
from accounting.ledger.base import EngineState, Ledger, LedgerError
from accounting.ledger.budget_store import BudgetStore
from accounting.metrics import ApportionerMetrics
from accounting.plan import EngineInfo, FitSample
from engines.meters.base import Meter, MeterError
from engines.meters.model import ModelMeter
from engines.meters.registry import make_meter

if TYPE_CHECKING:
    from accounting.ledger.postgres import PostgresLedger
    from accounting.ledger.sqlite import SqliteLedger

log = logging.getLogger("wattgate.accounting")

__all__ = ["EngineInfo", "MeterPoller", "MeteredEngine", "make_ledger", "metered_engines"]


def make_budget_store(cfg: LedgerConfig) -> BudgetStore:
    """A connection of its own to the configured ledger, for tenant controls (admissions do
    not queue behind the recorder's writes)."""
    store: BudgetStore = make_ledger_store(cfg)
    return store


def make_ledger(cfg: LedgerConfig) -> Ledger:
    ledger: Ledger = make_ledger_store(cfg)
    return ledger


def make_ledger_store(cfg: LedgerConfig) -> SqliteLedger | PostgresLedger:
    """The configured store, which serves both the `Ledger` and the `BudgetStore` protocols."""
    if cfg.kind == "postgres":
        from accounting.ledger.postgres import PostgresLedger

        return PostgresLedger(cfg.dsn)
    from accounting.ledger.sqlite import SqliteLedger

    return SqliteLedger(cfg.path)


@dataclass
class MeteredEngine:
    """One engine as the apportioner sees it: its meter and readings, and where its
    apportioning stands."""

    info: EngineInfo
    meter: Meter
    idle_power_w: float | None  # None until configured or published by the meter
    coeffs: Coefficients
    estimated: bool
    track: EnergyTrack = field(default_factory=EnergyTrack)
    counters: EngineCounters = field(default_factory=EngineCounters)
    state: EngineState | None = None
    carry_j: float = 0.0
    samples: deque[FitSample] = field(default_factory=lambda: deque(maxlen=300))
    since_fit: int = 0

    @property
    def modelled(self) -> bool:
        """No hardware counter: the energy is estimated from the work."""
        return isinstance(self.meter, ModelMeter)


def metered_engines(config: AccountingConfig, engines: Sequence[EngineInfo],
                    meters: dict[str, Meter] | None = None) -> dict[str, MeteredEngine]:
    out: dict[str, MeteredEngine] = {}
    for info in engines:
        cfg = config.meter_for(info.name)
        meter = (meters or {}).get(info.name) or make_meter(cfg.meter)
        idle = cfg.idle_power_w
        if isinstance(meter, ModelMeter):
            idle = meter.model.idle_power_w
        out[info.name] = MeteredEngine(
            info=info, meter=meter, idle_power_w=idle,
            coeffs=cfg.coefficients or default_for(info.precision, info.kind),
            estimated=meter.estimated, samples=deque(maxlen=config.fit.window))
    return out


class MeterPoller:
    """Reads every metered engine's counter into its track (one `poll()` per step)."""

    def __init__(self, engines: dict[str, MeteredEngine], ledger: Ledger,
                 metrics: ApportionerMetrics | None = None):
        self.engines = engines
        self.ledger = ledger
        self.metrics = metrics
        self._resumed = False

    async def poll(self) -> None:
        if not self._resumed:
            await self._resume_counters()
        engines = [e for e in self.engines.values() if not e.modelled]
        results = await asyncio.gather(*(e.meter.read() for e in engines),
                                       return_exceptions=True)
        for eng, res in zip(engines, results, strict=True):
            if isinstance(res, MeterError):
                log.warning("meter of %s: %s", eng.info.name, res)
                if self.metrics:
                    self.metrics.meter_errors.labels(eng.info.name).inc()
                continue
            if isinstance(res, BaseException):
                raise res
            if eng.idle_power_w is None and res.idle_power_w is not None:
                eng.idle_power_w = res.idle_power_w
            # The raw counters, not the meter's own monotonic series: the offsets the meter
            # adds live in its process only; ours are kept in the ledger (counters.py).
            estimated_j = eng.counters.estimated_j
            total_j = eng.counters.update(res.timestamp_s, res.raw_j or res.energy_j,
                                          floor_w=self._floor_w(eng))
            if total_j is None:
                continue  # stale or repeated reading
            eng.track.add(res.timestamp_s, total_j, estimated=res.estimated)
            if self.metrics:
                name = eng.info.name
                self.metrics.meter_resets.labels(name).set(eng.counters.resets + eng.track.resets)
                self.metrics.estimated.labels(name).inc(eng.counters.estimated_j - estimated_j)

    @staticmethod
    def _floor_w(eng: MeteredEngine) -> float:
        """The power a reset's gap is estimated at: the engine's idle power (configured, its
        meter's, or fitted), else the default per GPU."""
        if eng.idle_power_w is not None:
            return eng.idle_power_w
        return DEFAULT_IDLE_W_PER_GPU * eng.info.gpus

    async def _resume_counters(self) -> None:
        """Before the first reading: continue each engine's counters where the ledger's
        apportioner left them, so this process counts on the same series (no re-base, the
        downtime charged what the counters grew by)."""
        states = await self.ledger.states()
        for name, eng in self.engines.items():
            st = states.get(name)
            eng.counters = EngineCounters(None if st is None else st.counter)
        self._resumed = True

    async def store_counters(self) -> None:
        """At a clean stop of the apportioner: its counters as last read, so a reset during
        the downtime hides only what was spent between this read and the reset."""
        for name, eng in self.engines.items():
            counter = eng.counters.state()
            if eng.state is None or counter is None:
                continue
            try:
                await self.ledger.store_counter(name, counter)
            except LedgerError as exc:
                log.warning("stopping without storing the counters of %s: %s", name, exc)
                return

    async def close(self) -> None:
        for eng in self.engines.values():
            try:
                await eng.meter.close()
            except MeterError as exc:
                log.warning("closing the meter of %s: %s", eng.info.name, exc)
