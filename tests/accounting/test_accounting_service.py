"""Service behaviour: per-tenant Prometheus counters, the estimated `model` meter, and a
meter that fails without stopping the books."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from accounting.config import AccountingConfig, EngineMeterConfig
from accounting.ledger.sqlite import SqliteLedger
from accounting.service import AccountingService, EngineInfo
from engines.meters.base import EnergyReading, MeterError
from engines.meters.model import PowerModel
from engines.meters.registry import MeterSpec
from tests.accounting.test_accounting_accuracy import T0_WALL, run_engine
from tests.accounting.test_ledger_sqlite import Clock, ReplayMeter, conservation, drive, make_config


@pytest.mark.timeout(60)
async def test_tenant_counters_add_up_to_apportioned_energy(tmp_path: Path) -> None:
    run = run_engine(31, duration_s=12.0)
    clock = Clock(T0_WALL)
    registry = CollectorRegistry()
    svc = AccountingService(make_config(), [EngineInfo("e0", "m", "bf16", 1)],
                            ledger=SqliteLedger(tmp_path / "l.db"),
                            meters={"e0": ReplayMeter(run.readings, clock)}, clock=clock,
                            registry=registry)
    await svc.ledger.open()
    await drive(svc, run, clock, run.readings[-1][0])
    intervals_j, _, _, _ = await conservation(svc.ledger)
    tenants = math.fsum(registry.get_sample_value("wattgate_tenant_energy_joules_total",
                                                  {"tenant": t}) or 0.0 for t in ("t0", "t1", "t2"))
    idle = registry.get_sample_value("wattgate_engine_idle_energy_joules_total", {"engine": "e0"})
    engine = registry.get_sample_value("wattgate_engine_energy_joules_total", {"engine": "e0"})
    assert engine == pytest.approx(intervals_j, rel=1e-9)
    debt = math.fsum(v.energy_j + v.idle_j  # revisions not netted
                     for v in svc.counter_debt().values())
    assert debt <= 0.0
    assert tenants + (idle or 0.0) + debt == pytest.approx(intervals_j, rel=1e-9)
    assert (registry.get_sample_value("wattgate_tenant_carbon_grams_total", {"tenant": "t0"})
            or 0.0) > 0.0
    await svc.stop()


@pytest.mark.timeout(60)
async def test_model_meter_books_are_flagged_estimated(tmp_path: Path) -> None:
    """Without a counter, energy comes from the power model and every row says estimated."""
    run = run_engine(32, duration_s=8.0)
    clock = Clock(T0_WALL)
    model = PowerModel(idle_power_w=80.0, prefill_j_per_token=0.01, decode_j_per_token=0.15)
    cfg = AccountingConfig(interval_s=1.0, settle_s=2.0, meters=(
        ("e0", EngineMeterConfig(MeterSpec(kind="model", power_model=model))),))
    svc = AccountingService(cfg, [EngineInfo("e0", "m", "bf16", 1)],
                            ledger=SqliteLedger(tmp_path / "l.db"), clock=clock)
    await svc.ledger.open()
    await drive(svc, run, clock, run.readings[-1][0] + 3)
    rid = run.records[len(run.records) // 2].request_id
    got = await svc.ledger.request(rid)
    assert got is not None and got["estimated"] and got["energy_j"] > 0
    usage = await svc.ledger.usage(0.0, 1e12, None)
    assert all(row[9] for row in usage.energy) and all(row[7] for row in usage.idle)
    expected = sum(model.prefill_j_per_token * r.prompt_tokens
                   + model.decode_j_per_token * r.completion_tokens for r in run.records)
    shares = math.fsum(r[5] for r in usage.energy)
    assert shares > 0.8 * expected  # token energy plus idle power while busy
    await svc.stop()


class FlakyMeter:
    kind = "flaky"
    estimated = False

    def __init__(self, clock: Clock):
        self.clock = clock
        self.calls = 0

    async def read(self) -> EnergyReading:
        self.calls += 1
        if self.calls % 3 == 0:
            raise MeterError("flaky: connection refused")
        return EnergyReading(self.clock(), (200.0 * (self.clock() - T0_WALL),))

    async def close(self) -> None:
        return None


@pytest.mark.timeout(60)
async def test_failing_meter_reads_are_counted_and_energy_still_conserved(tmp_path: Path) -> None:
    run = run_engine(33, duration_s=8.0)
    clock = Clock(T0_WALL)
    registry = CollectorRegistry()
    meter = FlakyMeter(clock)
    svc = AccountingService(make_config(), [EngineInfo("e0", "m", "bf16", 1)],
                            ledger=SqliteLedger(tmp_path / "l.db"), meters={"e0": meter},
                            clock=clock, registry=registry)
    await svc.ledger.open()
    await drive(svc, run, clock, T0_WALL + 12)
    intervals_j, shares_idle_j, boundary_j, n = await conservation(svc.ledger)
    assert (registry.get_sample_value("wattgate_meter_errors_total", {"engine": "e0"}) or 0) >= 5
    # Every interval at 200 W, the first one measured from the first reading (0.25 s in) on.
    first_j = 200.0 * 0.25
    assert intervals_j == pytest.approx(200.0 * n - first_j, rel=1e-9)
    assert intervals_j == pytest.approx(boundary_j - first_j, rel=1e-9)
    assert shares_idle_j == pytest.approx(intervals_j, rel=1e-9)
    await svc.stop()
