"""The apportioner's plan for one engine (pure): from a ledger snapshot of the work of the
intervals that are ready or revised, the interval rows, the request shares, the per-tenant
sums and the engine's next state that one `Ledger.commit` stores. No I/O and no clock: the
shell (apportioner.py) reads the snapshot, runs `plan_steps` and commits what it built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import NamedTuple

from accounting.apportion import ShareColumns, apportion_by
from accounting.coefficients import Coefficients
from accounting.counters import CounterState
from accounting.failed import BILL_ALL, Cut, split_failed
from accounting.ledger.base import (
    EngineState,
    IntervalRow,
    PendingWork,
    ShareRow,
    WorkSnapshot,
    hour_of,
)
from accounting.pricing import Pricing
from core.vocab import FailedEnergy

BUSY_ROWS = 1024  # an interval with more rows yields to the loop between apportioning and booking


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the gateway config says about one endpoint."""

    name: str
    model: str
    precision: str
    gpus: int = 1
    kind: str = "vllm"  # engine kind: its default work coefficients differ


@dataclass(slots=True)
class TenantSum:
    """What one tenant was charged (or, for a revision, by how much its charge moved)."""

    energy_j: float = 0.0
    carbon_g: float = 0.0
    cost_usd: float = 0.0

    def add(self, energy_j: float, carbon_g: float, cost_usd: float) -> None:
        self.energy_j += energy_j
        self.carbon_g += carbon_g
        self.cost_usd += cost_usd


class FitSample(NamedTuple):
    """One apportioned interval with work, as the online coefficient fit reads it."""

    energy_j: float
    interval_s: float
    prefill_tokens: float
    decode_tokens: float
    kv_tokens: float
    max_decode_tokens: float


class ReadyInterval(NamedTuple):
    """An interval that may be apportioned, with the engine's cumulative energy at its end
    (None: a model meter, which estimates the energy from the interval's work)."""

    idx: int
    end_j: float | None


class StoredShare(NamedTuple):
    """A tenant's stored charge in one interval (what a revision replaces)."""

    interval_idx: int
    tenant: str
    energy_j: float
    carbon_g: float
    cost_usd: float


# (interval_s, prefill tokens, decode tokens) -> joules: a model meter's estimate
Estimate = Callable[[float, float, float], float]


@dataclass(frozen=True, slots=True)
class PlanInput:
    info: EngineInfo
    interval_s: float
    idle_power_w: float
    coeffs: Coefficients
    estimated: bool  # the energy is estimated, not measured
    pricing: Pricing
    state: EngineState
    carry_j: float  # a negative counter step carried into the next interval
    ready: Sequence[ReadyInterval]
    dirty: Sequence[int]  # intervals before state.next_interval revised by late work
    snapshot: WorkSnapshot  # the work of `ready` and `dirty`, with their versions
    stored: Mapping[int, IntervalRow]  # the stored rows of the dirty intervals
    stored_shares: Sequence[StoredShare]  # and their tenants' stored charges
    resets: int  # the energy track's resets, kept in the state
    counter: CounterState | None  # the counters as last read (None: as in `state`)
    estimate: Estimate | None = None  # a model meter's (then every `end_j` is None)
    fit: bool = False  # collect FitSamples
    failed_energy: FailedEnergy = "failed_account"  # who pays failed requests' energy


@dataclass(slots=True)
class Plan:
    """What one commit stores, and what the shell does after it."""

    intervals: list[IntervalRow] = field(default_factory=list)  # the ready ones, then revised
    n_ready: int = 0
    shares: list[ShareRow] = field(default_factory=list)
    done: list[tuple[int, int]] = field(default_factory=list)  # (interval, version read)
    tenants: dict[str, TenantSum] = field(default_factory=dict)
    samples: list[FitSample] = field(default_factory=list)
    revised: int = 0
    idle_delta_j: float = 0.0
    failed_delta_j: float = 0.0
    carry_j: float = 0.0
    state: EngineState | None = None

    @property
    def new_intervals(self) -> list[IntervalRow]:
        return self.intervals[:self.n_ready]


def plan_engine(inp: PlanInput) -> Plan:
    """The whole plan at once (see `plan_steps`)."""
    plan = Plan()
    for _ in plan_steps(inp, plan):
        pass
    return plan


def plan_steps(inp: PlanInput, plan: Plan) -> Iterator[None]:
    """Fill `plan`, yielding after each interval (and inside a busy one) so a shell on a
    request loop can let requests through; the plan is complete when the iterator ends."""
    st = inp.state
    by_idx = _rows_by_interval(inp.snapshot.rows, st.next_interval, set(inp.dirty))
    versions = inp.snapshot.versions
    plan.done = [(k, versions[k]) for k in (*(r.idx for r in inp.ready), *inp.dirty)
                 if k in versions]
    boundary_s, boundary_j, carry = st.boundary_s, st.boundary_j, inp.carry_j
    for k, e_end in inp.ready:
        rows = by_idx.get(k, [])
        if e_end is None:  # estimated from the work itself
            assert inp.estimate is not None
            e_end = boundary_j + inp.estimate(
                inp.interval_s, math.fsum(p.row.prefill_tokens for p in rows),
                math.fsum(p.row.decode_tokens for p in rows))
        raw = e_end - boundary_j + carry
        carry = min(raw, 0.0)  # a negative step is carried, never dropped
        boundary_s, boundary_j = (k + 1) * inp.interval_s, e_end
        yield from _interval(inp, plan, k, max(raw, 0.0), rows)
        yield
    plan.n_ready = len(plan.intervals)
    for old in inp.stored_shares:
        # A revision moves joules between requests: count the change, not the total.
        if old.interval_idx in inp.stored:
            plan.tenants.setdefault(old.tenant, TenantSum()).add(
                -old.energy_j, -old.carbon_g, -old.cost_usd)
    for k in inp.dirty:
        stored = inp.stored.get(k)
        if stored is None:
            # Work from before this engine was first metered: no measured energy to share
            # (the interval is marked clean all the same).
            continue
        yield from _interval(inp, plan, k, stored.energy_j, by_idx.get(k, []))
        plan.revised += 1
    new = plan.new_intervals
    revised = plan.intervals[plan.n_ready:]
    plan.idle_delta_j = math.fsum([
        *(i.idle_j for i in new),
        *(i.idle_j - inp.stored[i.interval_idx].idle_j for i in revised)])
    plan.failed_delta_j = math.fsum([
        *(i.failed_j for i in new),
        *(i.failed_j - inp.stored[i.interval_idx].failed_j for i in revised)])
    plan.carry_j = carry
    plan.state = EngineState(
        st.engine, inp.ready[-1].idx + 1 if inp.ready else st.next_interval, boundary_s,
        boundary_j, inp.resets, inp.counter or st.counter,
        None if st.apportioned_j is None
        else st.apportioned_j + math.fsum(i.energy_j for i in new))


def _rows_by_interval(rows: Sequence[PendingWork], next_interval: int, dirty: set[int]
                      ) -> dict[int, list[PendingWork]]:
    """The snapshot's rows of the ready intervals and of the dirty ones (the dirty range read
    may hold clean intervals between dirty ones: those are left out)."""
    by_idx: dict[int, list[PendingWork]] = {}
    for pw in rows:
        k = pw.row.interval_idx
        if k >= next_interval or k in dirty:
            by_idx.setdefault(k, []).append(pw)
    return by_idx


def _billed(inp: PlanInput, rows: list[PendingWork], cols: ShareColumns, t0: float
            ) -> tuple[ShareColumns, Sequence[float], tuple[float, float, float]]:
    """The interval's shares as billed, each share's part in the failed account (empty: none)
    and that account's (J, gCO2e, USD) (failed.py)."""
    if inp.failed_energy != "failed_account":
        return cols, (), (0.0, 0.0, 0.0)
    cuts = {p.row.request_id: Cut(p.bill_until_s, t0 + p.row.start_s, p.row.residency_s)
            for p in rows if p.bill_until_s != BILL_ALL}
    if not cuts:  # no failed request in the interval (the usual case)
        return cols, (), (0.0, 0.0, 0.0)
    billed, failed = split_failed(cols, cuts)
    gpus = inp.info.gpus
    carbon, cost = inp.pricing.charges(failed.energy_j, [b * gpus for b in failed.busy_s], t0)
    return billed, failed.energy_j, (math.fsum(failed.energy_j), math.fsum(carbon),
                                     math.fsum(cost))


def _interval(inp: PlanInput, plan: Plan, k: int, energy_j: float,
              rows: list[PendingWork]) -> Iterator[None]:
    """Apportion `energy_j` of interval k over `rows` into `plan`."""
    dt = inp.interval_s
    info = inp.info
    work = [p.row for p in rows]
    c = inp.coeffs
    result = apportion_by(energy_j, dt, inp.idle_power_w, work, c)
    if len(rows) > BUSY_ROWS:
        # A busy interval (thousands of requests) takes milliseconds to apportion and about
        # as long to book: let requests through in between.
        yield
    t0 = k * dt
    pricing = inp.pricing
    gpus = info.gpus
    cols, failed_col, (failed_j, failed_carbon, failed_cost) = _billed(
        inp, rows, result.columns, t0)
    plan.intervals.append(IntervalRow(
        info.name, k, t0, dt, info.model, info.precision, info.gpus, energy_j,
        result.static_j, result.dynamic_j, result.idle_j, result.idle_s,
        pricing.carbon_g(result.idle_j, result.idle_s * info.gpus, t0),
        pricing.cost_usd(result.idle_j, result.idle_s * info.gpus, t0),
        inp.estimated, c.alpha, c.beta, c.gamma, failed_j, failed_carbon, failed_cost))
    if cols.request_ids:
        # Column-wise: carbon and cost priced once per interval, rows built by zip.
        gpu_s = [b * gpus for b in cols.busy_s]
        carbon, cost = pricing.charges(cols.energy_j, gpu_s, t0)
        # the columns in ShareRow's field order (its `_make` builds each row in C)
        plan.shares.extend(map(ShareRow._make, zip(
            cols.request_ids, repeat(info.name), repeat(k), repeat(t0), repeat(hour_of(t0)),
            cols.energy_j, cols.static_j, cols.dynamic_j, gpu_s, carbon, cost,
            repeat(1 if inp.estimated else 0), failed_col or repeat(0.0))))
        tenant_of = {p.row.request_id: p.tenant for p in rows}
        tenants = plan.tenants
        for rid, e, cg, usd in zip(cols.request_ids, cols.energy_j, carbon, cost, strict=True):
            tenant = tenant_of[rid]
            acc = tenants.get(tenant)
            if acc is None:
                acc = tenants[tenant] = TenantSum()
            acc.energy_j += e
            acc.carbon_g += cg
            acc.cost_usd += usd
    if work and inp.fit:
        plan.samples.append(FitSample(
            energy_j, dt, math.fsum(r.prefill_tokens for r in work),
            math.fsum(r.decode_tokens for r in work), math.fsum(r.kv_tokens for r in work),
            max(r.decode_tokens for r in work)))
