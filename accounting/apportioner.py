"""The apportioner's shell: leader election, which intervals are ready, the ledger snapshot
of their work, the pure plan (plan.py), one commit per engine, then the online fit and the
Prometheus counters. Exactly one process apportions at a time (the ledger's lock: a file lock
for SQLite, an advisory lock for PostgreSQL); it runs in its own process by default
(process.py), never stalling a proxy's requests.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from accounting.coefficients import fit_intervals, fitted
from accounting.config import AccountingConfig
from accounting.counters import DEFAULT_IDLE_W_PER_GPU, begin_check, unaccounted_j
from accounting.energy import Boundary
from accounting.ledger.base import EngineState, Ledger
from accounting.ledger.retention import Pruner
from accounting.metering import MeteredEngine
from accounting.metrics import ApportionerMetrics
from accounting.plan import (
    Plan,
    PlanInput,
    ReadyInterval,
    StoredShare,
    TenantSum,
    plan_steps,
)
from accounting.work import interval_index

MAX_INTERVALS_PER_STEP = 600  # bounds one catch-up step after a long stop
REPLICA_STALE_S = 10.0  # a replica not heard from this long (killed) holds nothing back
# (or four flush windows, when flush_s is long: replicas publish at most once per flush)


@dataclass(slots=True)
class CounterDebt:
    """What a Prometheus label owes its counters: a revision lowered its value, and counters
    only go up, so the difference is netted against its next increments (each <= 0)."""

    energy_j: float = 0.0
    carbon_g: float = 0.0
    cost_usd: float = 0.0
    idle_j: float = 0.0
    failed_j: float = 0.0


class Apportioner:
    def __init__(self, config: AccountingConfig, engines: dict[str, MeteredEngine],
                 ledger: Ledger, metrics: ApportionerMetrics | None = None, *,
                 started_s: float):
        self.config = config
        self.engines = engines
        self.ledger = ledger
        self.metrics = metrics
        self.is_leader = False
        self._started_s = started_s  # a model meter's engine starts at this interval
        self._owed: dict[str, CounterDebt] = {}
        days = config.ledger.retention_days
        self.pruner = (Pruner(ledger, days * 86400.0, config.interval_s)
                       if days is not None else None)
        if metrics is not None:
            metrics.watch_lag(self.lag_s)

    def lag_s(self, now: float | None = None) -> dict[str, float]:
        """Per engine, seconds since the end of its last apportioned interval (wall clock, as
        the intervals are); empty unless this process apportions, as the other replicas'
        boundaries do not move."""
        if not self.is_leader:
            return {}
        now = time.time() if now is None else now
        return {name: max(0.0, now - eng.state.boundary_s)
                for name, eng in self.engines.items() if eng.state is not None}

    async def step(self, now: float) -> int:
        """Apportion what is ready if this process holds (or takes) the lock."""
        if not await self.take_leadership():
            return 0
        done = await self.apportion_ready(now)
        if self.pruner is not None:
            await self.pruner.step(now)  # the one apportioner prunes, between its commits
        return done

    async def take_leadership(self) -> bool:
        held = await self.ledger.acquire_apportioner()
        if held and not self.is_leader:
            # Newly in charge: continue exactly where the previous apportioner stopped.
            states = await self.ledger.states()
            for name, eng in self.engines.items():
                st = states.get(name)
                eng.state = None
                eng.carry_j = 0.0
                if st is not None:
                    eng.track.anchor(Boundary(st.boundary_s, st.boundary_j))
                    own = eng.track.energy_at(st.boundary_s)
                    eng.state = self._checked(eng, replace(
                        st, boundary_j=st.boundary_j if own is None else own))
        self.is_leader = held
        if self.metrics:
            self.metrics.leader.set(1.0 if held else 0.0)
        return held

    def _init_state(self, eng: MeteredEngine) -> EngineState | None:
        dt = self.config.interval_s
        if eng.modelled:
            k0 = interval_index(self._started_s, dt)
            return EngineState(eng.info.name, k0, k0 * dt, 0.0)
        first = eng.track.first
        if first is None:
            return None
        # The engine's first interval is the one its first reading falls in, measured from that
        # reading on (the counter is taken as flat before it): requests served before the
        # next whole interval still get the energy measured while they ran.
        k0 = interval_index(first.time_s, dt)
        e0 = eng.track.energy_at(k0 * dt)
        return None if e0 is None else self._checked(
            eng, EngineState(eng.info.name, k0, k0 * dt, e0))

    def _checked(self, eng: MeteredEngine, st: EngineState) -> EngineState:
        """`st` with the check's apportioned sum, begun here where no stored count goes on."""
        if eng.modelled:
            return st  # no counter to check against
        latest = eng.track.latest
        pending_j = 0.0 if latest is None else latest.energy_j - st.boundary_j
        return replace(st, apportioned_j=begin_check(eng.counters, st.apportioned_j, pending_j))

    def limit(self, now: float, open_since: float | None) -> float:
        """The latest interval end that may be apportioned: settled, and before `open_since`
        (the earliest arrival of a request still open on any replica) unless held `hold_s`."""
        limit = now - self.config.settle_s
        if open_since is not None:
            limit = min(limit, max(open_since, now - self.config.hold_s))
        return limit

    def _ready(self, eng: MeteredEngine, st: EngineState, now: float, limit: float
               ) -> list[ReadyInterval]:
        """Intervals that end by `limit`, with the cumulative energy at their end."""
        dt = self.config.interval_s
        out: list[ReadyInterval] = []
        k = st.next_interval
        while (k + 1) * dt <= limit and len(out) < MAX_INTERVALS_PER_STEP:
            t_end = (k + 1) * dt
            if eng.modelled:
                out.append(ReadyInterval(k, None))
            else:
                e_end = eng.track.energy_at(t_end)
                if e_end is None:
                    if now - t_end <= self.config.max_lag_s:
                        break  # wait for the meter to catch up
                    # The meter is silent: close the interval with what it has shown; the rest
                    # stays in the counter and lands in a later interval.
                    e_end = eng.track.energy_at(t_end, hold=True)
                    e_end = st.boundary_j if e_end is None else e_end
                out.append(ReadyInterval(k, e_end))
            k += 1
        return out

    async def apportion_ready(self, now: float) -> int:
        """Apportion every settled interval and every interval revised by late work."""
        stale_s = max(REPLICA_STALE_S, 4.0 * self.config.flush_s)
        open_since = (await self.ledger.open_since(now - stale_s)
                      if self.config.hold_s > 0.0 else None)
        limit = self.limit(now, open_since)
        if self.metrics:
            self.metrics.held.set(now - self.config.settle_s - limit)
        done = 0
        for eng in self.engines.values():
            if eng.state is None:
                eng.state = self._init_state(eng)
            if eng.state is not None:
                done += await self._apportion_engine(eng, eng.state, now, limit)
        return done

    async def _apportion_engine(self, eng: MeteredEngine, st: EngineState, now: float,
                                limit: float) -> int:
        ready = self._ready(eng, st, now, limit)
        name = eng.info.name
        dirty = await self.ledger.dirty(name, st.next_interval)
        if not ready and not dirty:
            self._publish_residual(eng, st)
            return 0
        # The rows of the ready intervals and of the revised ones, with the versions of their
        # intervals as read: an interval written to after this read stays dirty.
        ranges = ([(ready[0].idx, ready[-1].idx)] if ready else []) + (
            [(dirty[0], dirty[-1])] if dirty else [])
        snap = await self.ledger.snapshot(name, ranges)
        stored = {i.interval_idx: i for i in await self.ledger.intervals(name, dirty)}
        stored_shares = ([StoredShare._make(r) for r in await self.ledger.tenant_shares(
            name, dirty[0], dirty[-1])] if dirty and self.metrics else [])
        plan = Plan()
        for _ in plan_steps(self._plan_input(eng, st, ready, dirty, snap, stored,
                                             stored_shares), plan):
            await asyncio.sleep(0)  # one interval at a time: requests keep flowing meanwhile
        assert plan.state is not None
        await self.ledger.commit(name, plan.intervals, plan.shares, plan.done, plan.state)
        eng.state = plan.state
        eng.carry_j = plan.carry_j
        eng.track.prune(plan.state.boundary_s)
        self._after_commit(eng, plan)
        return len(plan.intervals)

    def _plan_input(self, eng: MeteredEngine, st: EngineState, ready: list[ReadyInterval],
                    dirty: list[int], snap: Any, stored: dict[int, Any],
                    stored_shares: list[StoredShare]) -> PlanInput:
        info = eng.info
        idle_w = (eng.idle_power_w if eng.idle_power_w is not None
                  else DEFAULT_IDLE_W_PER_GPU * info.gpus)
        meter: Any = eng.meter
        estimate: Callable[[float, float, float], float] | None = (
            meter.interval_energy_j if eng.modelled else None)
        return PlanInput(
            info=info, interval_s=self.config.interval_s, idle_power_w=idle_w,
            coeffs=eng.coeffs, estimated=eng.estimated or eng.track.estimated,
            pricing=self.config.pricing, state=st, carry_j=eng.carry_j, ready=ready,
            dirty=dirty, snapshot=snap, stored=stored, stored_shares=stored_shares,
            resets=eng.track.resets, counter=eng.counters.state(), estimate=estimate,
            fit=self.config.fit.enabled, failed_energy=self.config.failed_energy)

    def _after_commit(self, eng: MeteredEngine, plan: Plan) -> None:
        if self.config.fit.enabled:
            eng.samples.extend(plan.samples)
            eng.since_fit += plan.n_ready
            if eng.since_fit >= self.config.fit.every:
                eng.since_fit = 0
                fit = fit_intervals(list(eng.samples))
                if fit is not None:
                    eng.coeffs = fitted(fit)
                    if fit.idle_power_w > 0:
                        eng.idle_power_w = fit.idle_power_w
        m = self.metrics
        if m is None:
            return
        name = eng.info.name
        if plan.revised:
            m.revisions.labels(name).inc(plan.revised)
        for tenant, delta in plan.tenants.items():
            self._count_tenant(tenant, delta)
        owed = self._owed.setdefault(name, CounterDebt())
        owed.idle_j = _net(m.engine_idle.labels(name), plan.idle_delta_j + owed.idle_j)
        owed.failed_j = _net(m.engine_failed.labels(name), plan.failed_delta_j + owed.failed_j)
        m.engine_energy.labels(name).inc(math.fsum(i.energy_j for i in plan.new_intervals))
        assert plan.state is not None
        self._publish_residual(eng, plan.state)

    def _count_tenant(self, tenant: str, delta: TenantSum) -> None:
        m = self.metrics
        assert m is not None
        owed = self._owed.setdefault(tenant, CounterDebt())
        owed.energy_j = _net(m.tenant_energy.labels(tenant), delta.energy_j + owed.energy_j)
        owed.carbon_g = _net(m.tenant_carbon.labels(tenant), delta.carbon_g + owed.carbon_g)
        owed.cost_usd = _net(m.tenant_cost.labels(tenant), delta.cost_usd + owed.cost_usd)

    def counter_debt(self) -> dict[str, CounterDebt]:
        """Per label (tenant or engine): what its counters owe, not yet netted (<= 0)."""
        return {k: replace(v) for k, v in self._owed.items()}

    def _publish_residual(self, eng: MeteredEngine, st: EngineState) -> None:
        latest = eng.track.latest
        if self.metrics and latest is not None:
            name = eng.info.name
            self.metrics.residual.labels(name).set(
                max(0.0, latest.energy_j - st.boundary_j - eng.carry_j))
            gap_j = self.unaccounted_j(name)
            if gap_j is not None:
                self.metrics.unaccounted.labels(name).set(gap_j)
                self.metrics.counter_step.labels(name).set(eng.counters.step_j)

    def unaccounted_j(self, engine: str) -> float | None:
        """Joules the engine's counters grew by that no apportioned interval holds and none
        will (0 while none is lost; counters.py); None where nothing is checked (no counter,
        or not apportioned by this process)."""
        eng = self.engines[engine]
        st, latest, metered_j = eng.state, eng.track.latest, eng.counters.metered_j
        if st is None or st.apportioned_j is None or latest is None or metered_j is None:
            return None
        pending_j = latest.energy_j - st.boundary_j + eng.carry_j
        return unaccounted_j(metered_j, st.apportioned_j, pending_j)

    def energy_check(self) -> dict[str, Any]:
        """Per engine, the counters' growth not found in the ledger (J; 0 while nothing is
        lost, None before the first reading) against one counter step, its tolerance."""
        engines: dict[str, Any] = {}
        for name, eng in self.engines.items():
            gap_j = self.unaccounted_j(name)
            counters = eng.counters
            # A reset's unread gap was estimated (or could not be): the ledger's joules are
            # not all measured, which the check says until this apportioner restarts
            engines[name] = {"unaccounted_j": gap_j, "counter_step_j": counters.step_j,
                             "estimated_j": counters.estimated_j,
                             "estimated_gaps": counters.gaps,
                             "alarm": (gap_j or 0.0) > max(counters.step_j, 1e-6)
                             or counters.gaps > 0}
        return {"engines": engines, "leader": self.is_leader}


def _net(counter: Any, total: float) -> float:
    """Increment `counter` by `total` when positive; else return it as what is still owed."""
    if total > 0.0:
        counter.inc(total)
        return 0.0
    return total
