"""The apportioner's alerts through promtool: a stalled apportioner (its last apportioned
interval aging) and a gateway whose apportioner child stays down fire; a lag within hold_s, a
replica that does not apportion (no lag series) and a child restarted within the minute stay
quiet. Skipped where promtool is not installed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.test_promtool import PROMTOOL, RULES, promtool

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")]


def _run(tmp_path: Path, series: list[tuple[str, str]], checks: list[dict[str, object]]) -> None:
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m",
                   "input_series": [{"series": s, "values": v} for s, v in series],
                   "alert_rule_test": checks}],
    }
    path = tmp_path / "apportioner.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_stalled_apportioning_alert_fires_past_five_minutes_of_lag(tmp_path: Path) -> None:
    # e1's apportioner stops at minute 5: its lag grows by 60 s a minute from 3 s. e2 is held
    # by a long request up to hold_s (60 s) and recovers. Only the leader publishes a lag.
    series = [
        ('wattgate_accounting_lag_seconds{engine="e1", instance="a"}', "3x5 63+60x30"),
        ('wattgate_accounting_lag_seconds{engine="e2", instance="a"}', "3x10 60x10 3x15"),
    ]
    summary = "Engine e1: nothing apportioned for {}"
    _run(tmp_path, series, [
        {"eval_time": "9m", "alertname": "WattgateApportioningStalled", "exp_alerts": []},
        {"eval_time": "20m", "alertname": "WattgateApportioningStalled", "exp_alerts": [{
            "exp_labels": {"severity": "critical", "engine": "e1"},
            "exp_annotations": {
                "summary": summary.format("15m 3s"),
                "description": (
                    "The end of the engine's last apportioned interval is five minutes old: "
                    "bills are not being made final (a stuck apportioner, a ledger it cannot "
                    "write, a meter lagging past max_lag_s). Apportioning waits at most "
                    "accounting.hold_s for open requests; see docs/operations.md.")}}]},
    ])


def test_apportioner_down_alert_fires_when_the_child_stays_down(tmp_path: Path) -> None:
    # gateway a's child is down for good from minute 3; b's is restarted within a minute.
    series = [
        ('wattgate_apportioner_up{instance="a"}', "1x3 0x20"),
        ('wattgate_apportioner_up{instance="b"}', "1x5 0 1x17"),
    ]
    _run(tmp_path, series, [
        {"eval_time": "4m", "alertname": "WattgateApportionerDown", "exp_alerts": []},
        {"eval_time": "10m", "alertname": "WattgateApportionerDown", "exp_alerts": [{
            "exp_labels": {"severity": "critical", "instance": "a"},
            "exp_annotations": {
                "summary": "Gateway a: its apportioner child is down or does not answer",
                "description": (
                    "The gateway restarts a child that exits or misses its liveness probes, "
                    "with a back-off of up to 30 s; down for minutes means it keeps dying (see "
                    "the gateway's log).")}}]},
    ])
