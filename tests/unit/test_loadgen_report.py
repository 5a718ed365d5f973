"""The console summary and the HTML report say how many records' energy the gateway measured and
how many it estimated from a power model (its per-record `estimated` flag), and what the prompt
lengths count; never a blanket "measured"."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import SloClass
from loadgen import energy, report, report_html, run_summary
from loadgen.client import Target
from loadgen.prompts import WordPrompts
from loadgen.results import RequestResult
from loadgen.runner import RunOutcome


def result(i: int) -> RequestResult:
    first = 0.1 * i + 0.05
    reads = tuple((first + 0.01 * k, 1) for k in range(4))
    return RequestResult(i, "acme", "default", 0.1 * i, 0.1 * i, first, reads[-1][0], reads, 20, 4,
                         "ok", 200, f"gw-{i}")


def outcome(estimated: int, n: int = 5, prompt_note: str = "") -> RunOutcome:
    """A run of n requests through the gateway, the first `estimated` of them flagged."""
    results = [result(i) for i in range(n)]
    rows = {f"gw-{i}": energy.EnergyRow(f"gw-{i}", "acme", "m", "e1", "fp8", 20, 4, 2.0, 0.1,
                                        0.001, final=True, estimated=i < estimated)
            for i in range(n)}
    fetch = energy.EnergyFetch(rows, 0, 0, "")
    summary, per_request = run_summary.summarize(results, lambda _: SloClass("default"),
                                             requested_rate_rps=10.0, label="run")
    return RunOutcome("run", Target("http://127.0.0.1:1", "m"), summary, per_request, fetch,
                      energy.overall_energy(fetch, results),
                      energy.group_energy(fetch, results, "tenant"),
                      energy.group_energy(fetch, results, "precision"), prompt_note)


@pytest.mark.parametrize(("estimated", "says"), [
    (0, "all 5 records measured (energy counters)"),
    (2, "3 of 5 records measured (energy counters), 2 ESTIMATED from a power model"),
    (5, "all 5 records ESTIMATED from a power model (no energy counter), none measured"),
])
def test_console_and_html_count_estimated_and_measured_records(tmp_path: Path, estimated: int,
                                                               says: str) -> None:
    o = outcome(estimated)
    table = report.run_table([o])
    assert says in table
    html_path = tmp_path / "r.html"
    report_html.write_html(html_path, "t", [o])
    assert says in html_path.read_text()
    if estimated == 5:  # nothing was measured: the word must not stand alone
        assert "(measured" not in table and "records measured" not in table


def test_simulator_ground_truth_is_not_called_gateway_measurement() -> None:
    o = outcome(0)
    assert o.energy_fetch is not None
    sim = RunOutcome(o.label, o.target, o.summary, o.requests,
                     energy.EnergyFetch(o.energy_fetch.rows, 0, 0, "", source="sim"),
                     o.energy_overall, (), ())
    assert "simulator ground truth" in sim.energy_note
    assert "measured" not in sim.energy_note


def test_prompt_unit_is_stated_once_for_arms_that_share_a_plan() -> None:
    """Arms replaying one plan say once what their prompt lengths count."""
    note = WordPrompts(chosen=True).note
    table = report.run_table([outcome(0, prompt_note=note), outcome(0, prompt_note=note)])
    assert table.count(note) == 1
    assert "words, not tokens" in table
