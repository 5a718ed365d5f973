"""The demo's precision decision is stable from run to run: a short, scaled version of
`bench.precision_search` (three seeds over the demo's precision phase on the scaled fleet;
the full check is bench/results/precision_search_8s.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import uvloop

from loadgen import demo_precision as dp
from loadgen import search_report
from loadgen.demo import ADMIN_KEY, EXAMPLES, finality_wait_s
from loadgen.search_repeat import checks

SEEDS = (0, 1000, 2000)
TRIAL_S = 2.0  # wall; 0.8 s of engine time at the fleet's time_scale 0.4


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_three_seeds_agree_on_the_recommendation_with_overlapping_capacities(
        tmp_path: Path) -> None:
    """Three searches with other seeds do not contradict each other: each recommends INT8
    (the fewest J per output token at the highest capacity, INT4 left out by the quality
    floor) or finds no significant difference between arms INT8 is among (trials this short
    give wide J/token intervals, and the answer then says to run more), and every pair of
    runs' capacity intervals overlaps. They are not asked to put every capacity inside the
    other runs' intervals, nor for one verdict: those are the benchmark's 8 s checks."""
    runs = []
    with open(tmp_path / "procs.log", "w") as log, dp.scaled_stack(
            tmp_path, EXAMPLES / "local.yaml", log) as stack:
        for seed in SEEDS:
            report, _ = uvloop.run(dp.precision_search(
                stack, TRIAL_S, seed, ADMIN_KEY, finality_wait_s(EXAMPLES / "local.yaml"),
                lambda s: print(s, file=sys.stderr), max_trials=dp.TRIALS))
            print(search_report.text(report))
            runs.append(search_report.to_json(report))
    c = checks(runs)
    print({k: v for k, v in c.items() if k != "outside"}, c["outside"])
    assert "int8 (vllm)" in c["agreeing"], c["verdicts"]
    assert c["interval_pairs_overlapping"] == c["interval_pairs"] == 12
