"""The accounting-availability alerts through promtool: a gateway whose accounting child stays
down past a minute, a spill journal that cannot be written, energy a counter reset made an
estimate of, and a request journal that stopped fire; a child restarted within the minute, a
spill that recovers and an engine with nothing estimated stay quiet. Skipped where promtool
is not installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.test_promtool import PROMTOOL
from tests.deploy.test_promtool_apportioner import _run

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")]


def test_accounting_unavailable_fires_past_a_minute_and_not_for_a_restart(
        tmp_path: Path) -> None:
    # a: down from minute 3, for good (+60 s a minute); b: down 30 s at minute 5, then up
    series = [
        ('wattgate_accounting_unavailable_seconds{instance="a"}', "0x3 0+60x10"),
        ('wattgate_accounting_unavailable_seconds{instance="b"}', "0x5 30 0x8"),
    ]
    _run(tmp_path, series, [
        {"eval_time": "4m", "alertname": "WattgateAccountingUnavailable", "exp_alerts": []},
        {"eval_time": "6m", "alertname": "WattgateAccountingUnavailable", "exp_alerts": [{
            "exp_labels": {"severity": "critical", "instance": "a"},
            "exp_annotations": {
                "summary": "Gateway a: accounting unavailable for 2m 0s",
                "description": (
                    "Its accounting child is down or does not answer (a respawn that keeps "
                    "failing: out of file descriptors or memory, see the gateway's log). "
                    "Finished requests wait in the spill journal and are written once a child "
                    "runs again; bills are not final meanwhile.")}}]},
    ])


def test_spill_failing_fires_after_a_minute(tmp_path: Path) -> None:
    series = [
        ('wattgate_accounting_spill_failing{instance="a"}', "0x2 1x6"),
        ('wattgate_accounting_spill_failing{instance="b"}', "0x2 1 0x6"),
    ]
    _run(tmp_path, series, [
        {"eval_time": "2m", "alertname": "WattgateAccountingSpillFailing", "exp_alerts": []},
        {"eval_time": "5m", "alertname": "WattgateAccountingSpillFailing", "exp_alerts": [{
            "exp_labels": {"severity": "critical", "instance": "a"},
            "exp_annotations": {
                "summary": "Gateway a: the spill journal cannot be written (disk full?)",
                "description": (
                    "Records the accounting child has not written are held in the gateway's "
                    "memory only (the write is retried every second); a gateway stopped now "
                    "loses them.")}}]},
    ])


def test_estimated_energy_fires_for_the_hour_after_a_bridged_reset(tmp_path: Path) -> None:
    # e1: a reset's gap of 1,500 J bridged at minute 5 (the counter starts with the process);
    # e2 never estimates anything
    series = [
        ('wattgate_energy_estimated_joules_total{engine="e1", instance="a"}', "0x5 1500x80"),
        ('wattgate_energy_estimated_joules_total{engine="e2", instance="a"}', "0x85"),
    ]
    description = (
        "Its energy counter restarted while unread (a GPU reset or driver reload, often during "
        "a gateway outage): the energy from the last reading to the restart is in the ledger "
        "as idle power over the gap, a floor. /admin/v1/energy-check shows the estimated "
        "joules.")
    _run(tmp_path, series, [
        {"eval_time": "4m", "alertname": "WattgateEnergyEstimated", "exp_alerts": []},
        {"eval_time": "10m", "alertname": "WattgateEnergyEstimated", "exp_alerts": [{
            "exp_labels": {"severity": "warning", "engine": "e1"},
            "exp_annotations": {
                "summary": "Engine e1: 1.5k J estimated in the last hour, not measured",
                "description": description}}]},
        {"eval_time": "80m", "alertname": "WattgateEnergyEstimated", "exp_alerts": []},
    ])


def test_journal_failed_fires_at_once(tmp_path: Path) -> None:
    series = [('wattgate_accounting_journal_failed{instance="a"}', "0x2 1x3"),
              ('wattgate_accounting_journal_failed{instance="b"}', "0x5")]
    _run(tmp_path, series, [
        {"eval_time": "1m", "alertname": "WattgateAccountingJournalFailed", "exp_alerts": []},
        {"eval_time": "3m", "alertname": "WattgateAccountingJournalFailed", "exp_alerts": [{
            "exp_labels": {"severity": "warning", "instance": "a"},
            "exp_annotations": {
                "summary": "a: the request journal stopped (disk full?)",
                "description": (
                    "Records still go to the ledger, but a crash of the gateway and its "
                    "accounting child now loses up to accounting.flush_s of them. Free the disk "
                    "and restart the gateway.")}}]},
    ])
