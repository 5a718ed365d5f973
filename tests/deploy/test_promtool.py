"""Alert rules and dashboard queries through Prometheus' own promtool: they parse, and the
alerts fire (and stay quiet) on synthetic series. Skipped where promtool is not installed
(Debian: `apt-get install prometheus`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.support.procs import REPO

RULES = REPO / "deploy" / "prometheus" / "rules" / "wattgate.rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "wattgate-dashboard.json"
PROMTOOL = shutil.which("promtool")

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=30,
                          check=False)


def test_rules_file_passes_promtool_check() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def grafana_to_promql(expr: str) -> str:
    """Grafana's variables replaced by what Grafana would send for 'All' over the last hour."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\w+", ".*", expr)


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    doc = orjson.loads(DASHBOARD.read_bytes())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 25
    rules = [{"record": f"dashboard:query_{i}", "expr": grafana_to_promql(e)}
             for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rejects_a_broken_query(tmp_path: Path) -> None:
    """The check above is real: an unbalanced expression fails."""
    path = tmp_path / "bad.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "bad", "rules": [
        {"record": "bad:query", "expr": "sum(rate(wattgate_requests_total[5m])"}]}]}))
    assert promtool("check", "rules", str(path)).returncode != 0


def alert(name: str, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return {"exp_labels": labels, "exp_annotations": annotations}


SLO_DESCRIPTION = ("Fewer than 90% of the served and failed requests of this class met every "
                   "limit of the class over 10 minutes (refusals and cancellations are not "
                   "counted). Check engine saturation (vllm:num_requests_waiting), failures, "
                   "routing policy and precision mix.")


def test_alerts_fire_on_bad_series_and_stay_quiet_on_good_ones(tmp_path: Path) -> None:
    # Per minute: 60 requests per class; `interactive` meets its SLO in 30 (50%), `batch` in
    # all. Engine e1 is down from the start; e2 is healthy. 80% of the energy is idle.
    series = [
        ('wattgate_requests_total{model="m", slo_class="interactive", status="ok", '
         'outcome="served"}', "0+60x200"),
        ('wattgate_slo_met_total{model="m", slo_class="interactive"}', "0+30x200"),
        ('wattgate_requests_total{model="m", slo_class="batch", status="ok", '
         'outcome="served"}', "0+60x200"),
        ('wattgate_slo_met_total{model="m", slo_class="batch"}', "0+60x200"),
        ('wattgate_endpoint_healthy{model="m", engine="e1", precision="fp8"}', "0x200"),
        ('wattgate_endpoint_healthy{model="m", engine="e2", precision="bf16"}', "1x200"),
        ('wattgate_engine_energy_joules_total{engine="e2"}', "0+6000x200"),
        ('wattgate_engine_idle_energy_joules_total{engine="e2"}', "0+4800x200"),
        # The apportioning replica waits 45 s for a request in flight; another replica 0.
        ('wattgate_accounting_held_seconds{instance="a"}', "45x200"),
        ('wattgate_accounting_held_seconds{instance="b"}', "0x200"),
    ]
    low = alert("WattgateSLOAttainmentLow", {"severity": "warning", "slo_class": "interactive"},
                {"summary": "SLO class interactive: attainment 50% (< 90%)",
                 "description": SLO_DESCRIPTION})
    critical = alert("WattgateSLOAttainmentCritical",
                     {"severity": "critical", "slo_class": "interactive"},
                     {"summary": "SLO class interactive: attainment 50% (< 75%)"})
    unhealthy = alert("WattgateEndpointUnhealthy",
                      {"severity": "warning", "model": "m", "engine": "e1", "precision": "fp8"},
                      {"summary": "Engine e1 (fp8) fails health checks"})
    idle = alert("WattgateIdleEnergyShareHigh", {"severity": "info"},
                 {"summary": "80% of GPU energy went to idle engines over the last hour",
                  "description": "Consider fewer engines or a cheaper precision for the offered "
                                 "load."})
    held = alert("WattgateApportioningHeld", {"severity": "info"},
                 {"summary": "Apportioning waits 45s for requests still in flight",
                  "description": "A request open for minutes (a stuck stream, a slow reader) "
                                 "keeps the intervals it spans from being billed, for at most "
                                 "accounting.hold_s; they are revised when it ends."})
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "WattgateSLOAttainmentLow", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "WattgateSLOAttainmentLow", "exp_alerts": [low]},
                {"eval_time": "20m", "alertname": "WattgateSLOAttainmentCritical",
                 "exp_alerts": [critical]},
                {"eval_time": "20m", "alertname": "WattgateEndpointUnhealthy",
                 "exp_alerts": [unhealthy]},
                {"eval_time": "20m", "alertname": "WattgateNoHealthyEndpoint", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "WattgateErrorRatioHigh", "exp_alerts": []},
                {"eval_time": "150m", "alertname": "WattgateIdleEnergyShareHigh",
                 "exp_alerts": [idle]},
                {"eval_time": "10m", "alertname": "WattgateApportioningHeld", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "WattgateApportioningHeld",
                 "exp_alerts": [held]},
            ],
            "promql_expr_test": [{
                "expr": "wattgate:slo_attainment:ratio_rate5m", "eval_time": "20m",
                "exp_samples": [{"labels": 'wattgate:slo_attainment:ratio_rate5m{slo_class="batch"}',
                                 "value": 1},
                                {"labels": 'wattgate:slo_attainment:ratio_rate5m{slo_class="interactive"}',
                                 "value": 0.5}],
            }],
        }],
    }
    path = tmp_path / "rules.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
