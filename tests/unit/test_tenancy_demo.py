"""The demo's summary line on the tenant whose joule budget deploy/examples/local.yaml sets."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gateway.config import load_config
from loadgen.demo import EXAMPLES, budget_line


def outcome(*results: tuple[str, int]) -> Any:
    return SimpleNamespace(requests=[SimpleNamespace(result=SimpleNamespace(
        tenant=t, http_status=h)) for t, h in results])


def test_the_demo_config_gives_initech_a_small_joule_budget() -> None:
    config = load_config(EXAMPLES / "local.yaml")
    initech = next(t for t in config.tenants if t.name == "initech")
    (budget,) = initech.budgets.budgets
    assert budget.unit == "j" and budget.limit <= 1000


def test_budget_line_counts_the_tenants_429s() -> None:
    line = budget_line(outcome(("initech", 429), ("initech", 200), ("initech", 429),
                               ("acme", 429)))
    assert "initech has 400 J per hour" in line
    assert "2 of its 3 requests were refused with 429" in line
