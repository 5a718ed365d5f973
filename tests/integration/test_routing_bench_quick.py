"""The routing benchmark's quick mode, through real gateways on a simulated fleet: slo_energy
spends fewer joules per output token than least_load at the same schedule and attainment, on
the Poisson schedule and on the replayed (Azure-format) trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.routing import main


@pytest.mark.timeout(500)
def test_slo_energy_uses_fewer_joules_per_token_than_least_load(tmp_path: Path) -> None:
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "routing-quick.json").read_text())
    assert {r["schedule"] for r in doc["rows"]} == {"poisson", "trace"}
    for schedule in ("poisson", "trace"):
        by = {r["policy"]: r for r in doc["rows"] if r["schedule"] == schedule}
        assert by["slo_energy"]["ledger_j_per_output_token"] < \
            0.85 * by["least_load"]["ledger_j_per_output_token"], schedule
        assert by["slo_energy"]["fleet_j_per_output_token"] < \
            by["least_load"]["fleet_j_per_output_token"], schedule
        # the light load is within every engine's SLO capacity: packing must not cost
        # attainment
        assert by["slo_energy"]["attainment"] >= by["least_load"]["attainment"] - 0.01, schedule
        # the capacity signal's surplus engines burnt idle joules, a share of the fleet's
        for r in by.values():
            assert 0.0 <= r["surplus_idle_j"] <= r["fleet_energy_j"]
    assert (tmp_path / "routing-quick.svg").read_text().startswith("<svg")
