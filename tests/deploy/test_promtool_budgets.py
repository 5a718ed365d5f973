"""The tenant budget alerts through promtool: the soft-limit alert fires once a tenant's
budget use reaches its own threshold (and not below it), the exhausted one at 100 %.
Skipped where promtool is not installed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.test_promtool import PROMTOOL, RULES, promtool

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")]

SOFT_DESCRIPTION = ("Past the tenant's budget_soft_percent. At 100% its requests get 429 "
                    "budget_exceeded (or a cheaper precision, with on_budget downgrade) until "
                    "the period ends.")


def test_budget_alerts_fire_at_each_tenants_threshold(tmp_path: Path) -> None:
    # acme (soft 80 %) climbs 70 % -> 85 % -> 100 % of its daily joules; beta (soft 90 %)
    # sits at 85 % of its monthly dollars. Two replicas publish the same gauges.
    series = [
        ('wattgate_tenant_budget_used_ratio{tenant="acme", period="day", unit="j", '
         'instance="a"}', "0.7x9 0.85x10 1.0x10"),
        ('wattgate_tenant_budget_used_ratio{tenant="acme", period="day", unit="j", '
         'instance="b"}', "0.7x9 0.85x10 1.0x10"),
        ('wattgate_tenant_budget_soft_ratio{tenant="acme", instance="a"}', "0.8x30"),
        ('wattgate_tenant_budget_soft_ratio{tenant="acme", instance="b"}', "0.8x30"),
        ('wattgate_tenant_budget_used_ratio{tenant="beta", period="month", unit="usd", '
         'instance="a"}', "0.85x30"),
        ('wattgate_tenant_budget_soft_ratio{tenant="beta", instance="a"}', "0.9x30"),
    ]
    soft = {"exp_labels": {"severity": "warning", "tenant": "acme", "period": "day",
                           "unit": "j"},
            "exp_annotations": {"summary": "Tenant acme has used 85% of its day budget in j",
                                "description": SOFT_DESCRIPTION}}
    spent = {"exp_labels": {"severity": "info", "tenant": "acme", "period": "day", "unit": "j"},
             "exp_annotations": {"summary": "Tenant acme: its day budget in j is spent"}}
    tests = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "WattgateTenantBudgetSoftLimit", "exp_alerts": []},
            {"eval_time": "13m", "alertname": "WattgateTenantBudgetSoftLimit",
             "exp_alerts": [soft]},
            {"eval_time": "13m", "alertname": "WattgateTenantBudgetExhausted", "exp_alerts": []},
            {"eval_time": "25m", "alertname": "WattgateTenantBudgetExhausted",
             "exp_alerts": [spent]},
        ],
    }]}
    path = tmp_path / "budgets.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
