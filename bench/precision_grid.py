"""Does the capacity search land where a fine grid does?

On the demo's scaled fleet (loadgen/demo_precision.py), per precision: the capacity search
(seed 0, 3 trials per rate), then a fine grid of rates from 0.75 to 1.25 x the search's
capacity in 5 % steps, with the same seeds (so the grid sees the same arrival patterns and
the comparison is the search's arithmetic, not sampling). The grid's capacity is where its
mean attainment crosses the target (linear between the last grid rate met, having met every
lower one, and the next). Reports the search's estimate and bracket against it.

    .venv/bin/python -m bench.precision_grid [--trial-s 8]

Writes bench/results/precision_grid.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
import uvloop

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.provenance import commit  # noqa: E402
from loadgen import demo_precision as dp  # noqa: E402
from loadgen.arms import Arm  # noqa: E402
from loadgen.capacity import SearchConfig, measure  # noqa: E402
from loadgen.client import ClientOptions, Target  # noqa: E402
from loadgen.demo import EXAMPLES  # noqa: E402
from loadgen.runner import RunOptions, RunOutcome  # noqa: E402
from loadgen.search import search_arm, trial_runner  # noqa: E402

OUT = REPO / "bench" / "results"
GRID = [0.75 + 0.05 * i for i in range(11)]


def grid_capacity(points: list[tuple[float, float]], target: float) -> float | None:
    """Where the mean attainment, over ascending rates, first falls below `target`."""
    last = None
    for rate, att in sorted(points):
        if att < target:
            if last is None:
                return None
            (r0, a0) = last
            return r0 + (rate - r0) * (a0 - target) / (a0 - att)
        last = (rate, att)
    return None if last is None else last[0]


async def one_arm(arm: Arm, trial_s: float) -> dict[str, Any]:
    w = dp.engine_workload(trial_s, 0)
    opts = RunOptions(fetch_energy=False, progress=False, client=ClientOptions())
    cfg = SearchConfig(start_rps=dp.SEARCH_START_RPS, max_rps=dp.SEARCH_MAX_RPS,
                       trials=dp.TRIALS, seed=0, max_trials=dp.MAX_TRIALS)

    def say(s: str) -> None:
        print(s, file=sys.stderr)

    found, _ = await search_arm(arm, w, cfg, dp.BASE, opts, say)
    cap = found.search.capacity_rps
    assert cap is not None and found.search.interval is not None
    n = found.search.interval.n  # the grid runs every seed the search ended with
    runs: dict[tuple[float, int], RunOutcome] = {}
    run_at = trial_runner(arm, w, dp.BASE, opts, runs, say)
    # every grid rate gets all its trials: no early stop, the grid is the reference
    full = SearchConfig(start_rps=1.0, max_rps=1e9, target_attainment=0.0, trials=n,
                        max_trials=n)
    grid = [(cap * f, (await measure(run_at, cap * f, full)).attainment.mean) for f in GRID]
    ref = grid_capacity(grid, dp.TARGET_ATTAINMENT)
    return {"arm": arm.label, "search_capacity_rps": cap,
            "search_bracket_rps": [found.search.largest_met_rps, found.search.first_miss_rps],
            "search_rates_tried": len(found.search.steps), "seeds": n,
            "grid": [{"rate_rps": r, "mean_attainment": a} for r, a in grid],
            "grid_capacity_rps": ref,
            "search_vs_grid_pct": None if ref is None else 100 * (cap / ref - 1)}


async def all_arms(stack: dp.ScaledStack, trial_s: float) -> list[dict[str, Any]]:
    base = stack.gateways["least_load"]
    arms = [Arm(f"{p} (vllm)", p, "vllm", Target(base, f"{dp.MODEL}@{p}"))
            for p in dp.PRECISIONS]
    return list(await asyncio.gather(*(one_arm(a, trial_s) for a in arms)))


def markdown(doc: dict[str, Any]) -> str:
    lines = ["# Capacity search vs a fine grid (the demo's scaled fleet)", "",
             f"Commit {doc['commit']}. `python -m bench.precision_grid --trial-s "
             f"{doc['trial_s']:g}` on a shared 2-core machine: {doc['fleet']}. Per precision: "
             f"the search (seed 0, {dp.TRIALS} trials per rate, seeds added up to "
             f"{dp.MAX_TRIALS} while its interval is wider than +/-10 %), then a grid of "
             "0.75-1.25 x its capacity in 5 % steps with every seed the search ended with; the "
             "grid's capacity is where its mean attainment crosses 90 %. Rates in engine time "
             f"(simulator time_scale {dp.TIME_SCALE:g}).", "",
             "| arm | search capacity (req/s) | search bracket | rates the search tried | "
             "grid capacity (req/s) | search vs grid |", "| --- | --- | --- | --- | --- | --- |"]
    for a in doc["arms"]:
        lo, hi = a["search_bracket_rps"]
        ref, pct = a["grid_capacity_rps"], a["search_vs_grid_pct"]
        lines.append(f"| {a['arm']} | {a['search_capacity_rps']:.1f} | [{lo:.1f}, "
                     + ("-" if hi is None else f"{hi:.1f}") + f"] | {a['search_rates_tried']} | "
                     + ("n/a" if ref is None else f"{ref:.1f}") + " | "
                     + ("n/a" if pct is None else f"{pct:+.1f} %") + " |")
    within = sum(1 for a in doc["arms"] if a["search_vs_grid_pct"] is not None
                 and abs(a["search_vs_grid_pct"]) <= 5)
    lines += ["", f"Within 5 % of the grid: **{within} of {len(doc['arms'])}**."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trial-s", type=float, default=8.0)
    args = ap.parse_args()
    ran_on = commit()
    with tempfile.TemporaryDirectory(prefix="wattgate-bench-") as tmp_name:
        tmp = Path(tmp_name)
        with open(tmp / "procs.log", "w") as log, dp.scaled_stack(
                tmp, EXAMPLES / "local.yaml", log) as stack:
            arms = uvloop.run(all_arms(stack, args.trial_s))
    doc = {"commit": ran_on, "trial_s": args.trial_s,
           "fleet": "four simulated vLLM H100 engines (llama-3.1-8b; BF16, FP8, INT8, INT4), "
                    f"time_scale {dp.TIME_SCALE:g}, 256 prompt words, 32 output tokens, "
                    "Poisson arrivals, through a least_load gateway; SLO TTFT <= 500 ms and TPOT <= 9 ms "
                    "(engine time) for 90 % of requests",
           "arms": arms}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "precision_grid.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    (OUT / "precision_grid.md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
