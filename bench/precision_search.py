"""Is the demo's precision answer stable from run to run?

Runs the demo's precision phase (loadgen/demo_precision.py: four simulated vLLM H100 engines,
BF16/FP8/INT8/INT4, time_scale 0.4, through a least_load gateway; capacity by search, 3 trials
per rate, 95 % intervals) once per seed, and checks across the runs: the same recommendation
(or "no significant difference"), and each arm's capacity inside every other run's interval.

    .venv/bin/python -m bench.precision_search [--seeds 0,1000,2000] [--trial-s 3] [--name N]

Writes bench/results/N.json and .md (N: precision_search).
"""

from __future__ import annotations

import argparse
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
from loadgen import search_report as sr  # noqa: E402
from loadgen.demo import ADMIN_KEY, EXAMPLES, finality_wait_s  # noqa: E402
from loadgen.search_repeat import checks  # noqa: E402

OUT = REPO / "bench" / "results"


def one_run(seed: int, trial_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="wattgate-bench-") as tmp_name:
        tmp = Path(tmp_name)
        with open(tmp / "procs.log", "w") as log, dp.scaled_stack(
                tmp, EXAMPLES / "local.yaml", log) as stack:
            report, _ = uvloop.run(dp.precision_search(
                stack, trial_s, seed, ADMIN_KEY, finality_wait_s(EXAMPLES / "local.yaml"),
                lambda s: print(s, file=sys.stderr)))
    print(sr.text(report))
    return sr.to_json(report)


def markdown(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    lines = ["# Precision search: three seeded runs of the demo's precision phase", "",
             f"Commit {doc['commit']}. `python -m bench.precision_search --seeds "
             f"{','.join(map(str, s['seeds']))} --trial-s {s['trial_s']:g}` on a shared 2-core "
             f"machine: {s['fleet']}; "
             f"SLO {doc['runs'][0]['slo']} for 90 % of requests; search from "
             f"{s['start_rps']:g} req/s x2 to at most {s['max_rps']:g}, bisection to 5 %, "
             f"{s['trials']} trials of {s['trial_s']:g} s (wall) per rate, seeds added up to "
             f"{s.get('max_trials', s['trials'])} while a capacity interval is wider than "
             "+/-10 %. Time base: "
             f"{doc['runs'][0]['time_base']}. Intervals: 95 %, Student t (capacity: over the "
             "per-trial capacities, widened to the search bracket).", ""]
    lines += run_rows(doc["runs"], s["seeds"])
    return "\n".join(lines) + "\n"


def run_rows(runs: list[dict[str, Any]], seeds: list[int]) -> list[str]:
    """The runs' table (capacities with intervals, the verdicts) and the checks across them."""
    lines = ["| seed | verdict | recommended | " + " | ".join(
                 f"{a['label']} capacity [95 % CI]" for a in runs[0]["arms"])
             + " | J/out-tok at need [95 % CI] |",
             "| --- | --- | --- | " + " | ".join("---" for _ in runs[0]["arms"])
             + " | --- |"]
    for seed, r in zip(seeds, runs, strict=True):
        caps = []
        for a in r["arms"]:
            iv = a["capacity_interval"]
            caps.append("none met" if iv is None else
                        f"{iv['mean']:.3g} [{iv['low']:.3g}, "
                        + ("inf" if iv["high"] is None else f"{iv['high']:.3g}") + "]")
        js = "; ".join(f"{a['label']} {j['mean']:.3f} [{j['low']:.3f}, {j['high']:.3f}]"
                       for a in r["arms"] if (j := a["j_per_output_token_at_need"])
                       and j["low"] is not None)
        d = r["decision"]
        lines.append(f"| {seed} | {d['verdict']} | {d['recommended'] or '-'} | "
                     + " | ".join(caps) + f" | at {d['need_rps']:.3g} req/s: {js} |")
    c = checks(runs)
    lines += ["", f"Same recommendation (or all 'no significant difference'): "
              f"**{c['same_recommendation']}**. Capacities inside the other runs' intervals: "
              f"**{c['capacities_inside_other_intervals']} of "
              f"{c['capacities_inside_other_intervals'] + len(c['outside'])}**."]
    lines += [f"- outside: {x}" for x in c["outside"]]
    total = c["capacities_inside_other_intervals"] + len(c["outside"])
    lines += ["", f"Inside the other runs' repeat ranges (95 % prediction intervals for another "
              f"run's estimate): **{c['capacities_inside_other_repeat_ranges']} of {total}**. "
              f"Pairs of runs whose capacity intervals overlap: "
              f"**{c['interval_pairs_overlapping']} of {c['interval_pairs']}**. Two equally "
              "precise estimates fall outside each other's 95 % confidence interval about one "
              "time in six to ten (loadgen/capacity.py), so the first count is expected below "
              "the total even when nothing moves."]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1000,2000")
    ap.add_argument("--trial-s", type=float, default=3.0)
    ap.add_argument("--name", default="precision_search", help="results file name")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    ran_on = commit()  # the code as loaded, before the runs
    runs = [one_run(seed, args.trial_s) for seed in seeds]
    doc = {"commit": ran_on,
           "settings": {"seeds": seeds, "trial_s": args.trial_s, "trials": dp.TRIALS,
                        "max_trials": dp.MAX_TRIALS,
                        "start_rps": dp.SEARCH_START_RPS, "max_rps": dp.SEARCH_MAX_RPS,
                        "fleet": "four simulated vLLM H100 engines (llama-3.1-8b; BF16, FP8, "
                                 f"INT8, INT4), time_scale {dp.TIME_SCALE:g}, 256 prompt "
                                 "words, 32 output tokens, Poisson arrivals, through a "
                                 "least_load gateway"},
           "runs": runs, "checks": checks(runs)}
    write(args.name, doc, markdown(doc))


def write(name: str, doc: dict[str, Any], md: str) -> None:
    """bench/results/NAME.json and .md, and the Markdown printed."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    (OUT / f"{name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
