"""The demo's summary line on the tenant whose joule budget deploy/examples/local.yaml sets."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gateway.config import load_config
from loadgen.demo import EXAMPLES, budget_line


def outcome(*results: tuple[str, int, str]) -> Any:
    return SimpleNamespace(requests=[SimpleNamespace(result=SimpleNamespace(
        tenant=t, http_status=h, code=c)) for t, h, c in results])


def test_the_demo_config_gives_initech_a_small_joule_budget() -> None:
    config = load_config(EXAMPLES / "local.yaml")
    initech = next(t for t in config.tenants if t.name == "initech")
    (budget,) = initech.budgets.budgets
    assert budget.unit == "j" and budget.limit <= 1000


def test_budget_line_counts_the_tenants_budget_429s() -> None:
    """Only the gateway's budget refusals: not a rate limit, not an engine's 429."""
    line = budget_line(outcome(("initech", 429, "budget_exceeded"), ("initech", 200, ""),
                               ("initech", 429, "budget_exceeded"),
                               ("initech", 429, "rate_limit_exceeded"),
                               ("initech", 429, "upstream_http_429"),
                               ("acme", 429, "budget_exceeded")))
    assert "initech has 400 J per hour" in line
    assert "2 of its 5 requests were refused with 429" in line
