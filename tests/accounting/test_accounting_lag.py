"""`wattgate_accounting_lag_seconds`: the age of each engine's last apportioned interval,
computed when scraped (so a stuck apportioning loop shows a growing lag, not a frozen one), and
published only by the process that apportions."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from accounting.apportioner import Apportioner
from accounting.config import AccountingConfig
from accounting.ledger.base import EngineState
from accounting.ledger.sqlite import SqliteLedger
from accounting.metering import EngineInfo, metered_engines
from accounting.metrics import ApportionerMetrics
from engines.meters.base import EnergyReading, MeterError

LAG = "wattgate_accounting_lag_seconds"


class SilentMeter:
    kind = "silent"
    estimated = False

    async def read(self) -> EnergyReading:
        raise MeterError("not read in this test")

    async def close(self) -> None:
        pass


def _apportioner(tmp_path: Path, registry: CollectorRegistry) -> Apportioner:
    config = AccountingConfig()
    infos = [EngineInfo("e0", "m", "bf16"), EngineInfo("e1", "m", "fp8")]
    engines = metered_engines(config, infos, {"e0": SilentMeter(), "e1": SilentMeter()})
    return Apportioner(config, engines, SqliteLedger(tmp_path / "l.db"),
                       ApportionerMetrics(registry), started_s=time.time())


def test_the_leader_publishes_the_age_of_each_engines_boundary(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    app = _apportioner(tmp_path, registry)
    boundary = time.time() - 42.0
    app.engines["e0"].state = EngineState("e0", 7, boundary, 0.0)
    assert registry.get_sample_value(LAG, {"engine": "e0"}) is None  # not the leader
    app.is_leader = True
    first = registry.get_sample_value(LAG, {"engine": "e0"})
    assert first is not None and first == pytest.approx(42.0, abs=1.0)
    assert registry.get_sample_value(LAG, {"engine": "e1"}) is None  # nothing apportioned yet
    time.sleep(0.2)  # no step ran: the lag still grows
    second = registry.get_sample_value(LAG, {"engine": "e0"})
    assert second is not None and second >= first + 0.2
    assert app.lag_s(now=boundary + 5.0) == {"e0": 5.0}
