"""The apportioner's pure plan over a ledger snapshot: conservation per interval, counter steps
carried, tenant sums that match the shares, and revisions counted as changes."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Any

import pytest

from accounting.coefficients import Coefficients
from accounting.ledger.base import EngineState, PendingWork, WorkSnapshot
from accounting.plan import (
    EngineInfo,
    PlanInput,
    ReadyInterval,
    StoredShare,
    plan_engine,
)
from accounting.pricing import Pricing, Series
from accounting.work import WorkRow

INFO = EngineInfo("e0", "m", "bf16", gpus=2)
PRICING = Pricing(pue=1.2, intensity_g_per_kwh=Series.constant(400.0),
                  price_usd_per_kwh=Series.constant(0.1), gpu_hour_usd=2.0)


def rows(k: int) -> list[PendingWork]:
    return [PendingWork("ta", WorkRow(f"a{k}", k, 100.0, 20.0, 0.8, 0.1, 3000.0)),
            PendingWork("tb", WorkRow(f"b{k}", k, 0.0, 40.0, 1.0, 0.0, 9000.0)),
            PendingWork("tb", WorkRow(f"c{k}", k, 50.0, 0.0, 0.2, 0.5, 10.0))]


BASE = PlanInput(
    info=INFO, interval_s=1.0, idle_power_w=160.0, coeffs=Coefficients(0.05, 1.0),
    estimated=False, pricing=PRICING, state=EngineState("e0", 10, 10.0, 5000.0), carry_j=0.0,
    ready=[ReadyInterval(10, 5400.0), ReadyInterval(11, 5350.0), ReadyInterval(12, 5900.0)],
    dirty=[], snapshot=WorkSnapshot([*rows(10), *rows(11), *rows(12)], {10: 1, 11: 1, 12: 2}),
    stored={}, stored_shares=[], resets=0, counter=None)


def plan_input(**kw: Any) -> PlanInput:
    return dataclasses.replace(BASE, **kw)


def test_each_interval_conserves_its_energy_and_a_negative_step_is_carried() -> None:
    plan = plan_engine(plan_input())
    energies = [i.energy_j for i in plan.intervals]
    # 5000 -> 5400 -> 5350 (a step back: carried) -> 5900: nothing lost, nothing negative
    assert energies == [400.0, 0.0, pytest.approx(500.0)]
    assert math.fsum(energies) == pytest.approx(900.0)
    for interval in plan.intervals:
        got = math.fsum(s.energy_j for s in plan.shares if s.interval_idx == interval.interval_idx)
        assert got + interval.idle_j == pytest.approx(interval.energy_j, abs=1e-9)
    assert plan.state == EngineState("e0", 13, 13.0, 5900.0, 0, None, None)
    assert plan.carry_j == 0.0 and plan.n_ready == 3 and plan.revised == 0
    assert plan.done == [(10, 1), (11, 1), (12, 2)]


def test_tenant_sums_are_the_sums_of_their_shares() -> None:
    plan = plan_engine(plan_input())
    tenant_of = {p.row.request_id: p.tenant for k in (10, 11, 12) for p in rows(k)}
    want: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for s in plan.shares:
        acc = want[tenant_of[s.request_id]]
        acc[0] += s.energy_j
        acc[1] += s.carbon_g
        acc[2] += s.cost_usd
    assert set(plan.tenants) == {"ta", "tb"}
    for tenant, got in plan.tenants.items():
        assert [got.energy_j, got.carbon_g, got.cost_usd] == pytest.approx(want[tenant])
    assert all(s.gpu_s >= 0.0 and s.cost_usd > 0.0 for s in plan.shares if s.energy_j > 0.0)


def test_a_revision_counts_the_change_of_each_tenant_not_its_total() -> None:
    first = plan_engine(plan_input(ready=[ReadyInterval(10, 5400.0)],
                                   snapshot=WorkSnapshot(rows(10), {10: 1})))
    stored = {10: first.intervals[0]}
    old = [StoredShare(10, t, s.energy_j, s.carbon_g, s.cost_usd)
           for t, s in first.tenants.items()]
    late = PendingWork("ta", WorkRow("late", 10, 0.0, 80.0, 1.0, 0.0, 5000.0))
    revised = plan_engine(plan_input(
        state=EngineState("e0", 11, 11.0, 5400.0), ready=[], dirty=[10],
        snapshot=WorkSnapshot([*rows(10), late], {10: 2}), stored=stored, stored_shares=old))
    assert revised.n_ready == 0 and revised.revised == 1 and revised.done == [(10, 2)]
    assert revised.intervals[0].energy_j == first.intervals[0].energy_j  # same joules, resplit
    moved = math.fsum(t.energy_j for t in revised.tenants.values())
    assert moved == pytest.approx(first.intervals[0].idle_j - revised.intervals[0].idle_j)
    assert revised.tenants["ta"].energy_j > 0.0 > revised.tenants["tb"].energy_j
    assert revised.state is not None and revised.state.next_interval == 11


def test_a_model_meter_estimates_each_interval_from_its_work() -> None:
    seen: list[tuple[float, float, float]] = []

    def estimate(interval_s: float, prefill: float, decode: float) -> float:
        seen.append((interval_s, prefill, decode))
        return 100.0 + prefill + decode

    plan = plan_engine(plan_input(ready=[ReadyInterval(10, None)], estimate=estimate,
                                  estimated=True, snapshot=WorkSnapshot(rows(10), {10: 1})))
    assert seen == [(1.0, 150.0, 60.0)]
    assert plan.intervals[0].energy_j == 310.0 and plan.intervals[0].estimated
    assert all(s.estimated == 1 for s in plan.shares)
