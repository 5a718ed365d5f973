"""Attainment, the error ratio and their alerts through promtool, by outcome class: refusals
(a tenant at its budget, bad keys) and cancellations mixed into healthy traffic change neither
and page no one; engine failures (5xx, an engine's 429, timeouts) count as misses and errors
and do page. Skipped where promtool is not installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_promtool import PROMTOOL, RULES, SLO_DESCRIPTION, promtool

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")]

ALERTS = ("WattgateSLOAttainmentLow", "WattgateSLOAttainmentCritical", "WattgateErrorRatioHigh")
ERROR_DESCRIPTION = ("Engine or gateway failures (5xx, an engine's 429, timeouts, broken "
                     "streams); refusals (4xx) and cancellations are not counted. See "
                     "wattgate_upstream_errors_total by engine.")


def requests(tenant: str, status: str, outcome: str, per_min: int) -> tuple[str, str]:
    return (f'wattgate_requests_total{{model="m", tenant="{tenant}", slo_class="interactive", '
            f'status="{status}", outcome="{outcome}"}}', f"0+{per_min}x60")


def met(tenant: str, per_min: int) -> tuple[str, str]:
    return (f'wattgate_slo_met_total{{model="m", tenant="{tenant}", slo_class="interactive"}}',
            f"0+{per_min}x60")


# Per minute, in both cases: acme has 465 requests served, 450 of them within the SLO.
SERVED = [requests("acme", "ok", "served", 465), met("acme", 450)]

# initech is at its budget and keeps sending: 600 429s a minute; a client with a bad key
# 120 401s; clients leave 30 streams early; 15 engine timeouts a minute.
REFUSALS = [
    requests("initech", "budget_exceeded", "refused", 600), met("initech", 0),
    requests("acme", "rate_limit_exceeded", "refused", 30),
    requests("unauthenticated", "invalid_api_key", "refused", 120),
    requests("acme", "client_disconnected", "cancelled", 30),
    requests("acme", "upstream_timeout", "failed", 15),
]

# Engines fail 510 requests a minute: 502s, an engine's own 429 (out of capacity), timeouts.
FAILURES = [
    requests("acme", "upstream_http_502", "failed", 192),
    requests("acme", "upstream_http_429", "failed", 192),
    requests("acme", "upstream_timeout", "failed", 126),
    requests("initech", "budget_exceeded", "refused", 60),
]


def run(tmp_path: Path, series: list[tuple[str, str]], alerts: list[dict[str, Any]],
        exprs: list[dict[str, Any]]) -> None:
    tests = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "alert_rule_test": alerts, "promql_expr_test": exprs}]}
    path = tmp_path / "outcomes.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def near(rule: str, value: float, **labels: str) -> dict[str, Any]:
    """An expression test that `rule` is `value` (to 1e-9: rate()'s extrapolation leaves the
    last bit of a ratio to chance) with exactly these labels."""
    text = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"expr": f"abs({rule} - {value!r}) < bool 1e-9", "eval_time": "30m",
            "exp_samples": [{"labels": f"{{{text}}}", "value": 1}]}


def rates(rule: str, *rows: tuple[float, dict[str, str]]) -> dict[str, Any]:
    """An expression test that `rule` has exactly these series and values (rates of whole
    requests per second are exact)."""
    samples = []
    for value, labels in rows:
        text = ", ".join(f'{k}="{v}"' for k, v in labels.items())
        samples.append({"labels": f"{rule}{{{text}}}", "value": value})
    return {"expr": rule, "eval_time": "30m", "exp_samples": samples}


def test_refusals_and_cancellations_leave_attainment_and_errors_alone(tmp_path: Path) -> None:
    """450 met of 465 served + 15 failed: attainment 450/480, error ratio 15/480, though 750
    of every 1,260 requests were refused; refusals and cancellations have their own rates."""
    quiet = [{"eval_time": "40m", "alertname": name, "exp_alerts": []} for name in ALERTS]
    exprs = [
        near("wattgate:slo_attainment:ratio_rate5m", 450 / 480, slo_class="interactive"),
        near("wattgate:error_ratio:rate5m", 15 / 480, model="m"),
        rates("wattgate:refused:rate5m",
              (10.0, {"tenant": "initech", "status": "budget_exceeded"}),
              (0.5, {"tenant": "acme", "status": "rate_limit_exceeded"}),
              (2.0, {"tenant": "unauthenticated", "status": "invalid_api_key"})),
        rates("wattgate:cancelled:rate5m",
              (0.5, {"tenant": "acme", "status": "client_disconnected"})),
    ]
    run(tmp_path, SERVED + REFUSALS, quiet, exprs)


def test_engine_failures_are_misses_and_errors_and_page(tmp_path: Path) -> None:
    """450 met of 465 served + 510 failed: attainment 450/975 (46 %), error ratio 510/975
    (52 %)."""
    low = {"exp_labels": {"severity": "warning", "slo_class": "interactive"},
           "exp_annotations": {"summary": "SLO class interactive: attainment 46.15% (< 90%)",
                               "description": SLO_DESCRIPTION}}
    critical = {"exp_labels": {"severity": "critical", "slo_class": "interactive"},
                "exp_annotations": {"summary": "SLO class interactive: attainment 46.15% "
                                               "(< 75%)"}}
    errors = {"exp_labels": {"severity": "warning", "model": "m"},
              "exp_annotations": {"summary": "Model m: 52.31% of served and failed requests "
                                             "fail", "description": ERROR_DESCRIPTION}}
    alerts = [{"eval_time": "40m", "alertname": name, "exp_alerts": [alert]}
              for name, alert in zip(ALERTS, (low, critical, errors), strict=True)]
    exprs = [near("wattgate:slo_attainment:ratio_rate5m", 450 / 975, slo_class="interactive"),
             near("wattgate:error_ratio:rate5m", 510 / 975, model="m")]
    run(tmp_path, SERVED + FAILURES, alerts, exprs)


def test_a_class_with_only_refusals_has_no_attainment_and_no_alert(tmp_path: Path) -> None:
    """Nothing was served or failed: there is no ratio to judge (not 0 %, which would page)."""
    series = [requests("initech", "budget_exceeded", "refused", 600), met("initech", 0)]
    quiet = [{"eval_time": "40m", "alertname": name, "exp_alerts": []} for name in ALERTS]
    exprs = [{"expr": "wattgate:slo_attainment:ratio_rate5m", "eval_time": "30m",
              "exp_samples": []}]
    run(tmp_path, series, quiet, exprs)
