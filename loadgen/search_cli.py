"""`wattgate loadgen compare --search`: each arm's SLO capacity by search, and the precision
recommendation with its uncertainty (the shell over loadgen/search.py and loadgen/decide.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from loadgen import report, report_html, search_report
from loadgen.arms import Arm, fetch_endpoints, plan_arms, with_quality
from loadgen.capacity import SearchConfig
from loadgen.cli_types import COUNT, POSITIVE, SCORE, Finite
from loadgen.decide import decide
from loadgen.precision import slo_text
from loadgen.runner import RunOptions, RunOutcome
from loadgen.search import search_arms
from loadgen.search_report import SearchReport
from loadgen.targets import arm_targets
from loadgen.timebase import TimeBase
from loadgen.workload import Workload

SEARCH_OPTIONS = [
    click.option("--search", is_flag=True, help="Find each arm's SLO capacity by search (ramp "
                 "x2 from --rate until the SLO is missed, then bisect to --tolerance), with "
                 "--trials seeded trials per rate and 95 % intervals, and recommend with them."),
    click.option("--max-rate", "max_rate", type=POSITIVE, default=None,
                 help="--search: the highest rate to offer (default 64 x --rate)."),
    click.option("--trials", type=COUNT, default=3, show_default=True,
                 help="--search: trials per rate (seeds --seed, --seed+1, ...)."),
    click.option("--max-trials", "max_trials", type=COUNT, default=None,
                 help="--search: add seeds while a capacity's 95 % interval is wider than "
                 "+/-10 %, up to this many trials (default 8, or --trials if more; equal to "
                 "--trials: never add)."),
    click.option("--tolerance", type=Finite(min=0.0, max=1.0, min_open=True, max_open=True),
                 default=0.05, show_default=True,
                 help="--search: stop bisecting when the bracket is within this fraction."),
    click.option("--need", "need_rps", type=POSITIVE, default=None,
                 help="--search: the rate you need (req/s): recommend the fewest J/token that "
                 "meets the SLO there (default: the highest capacity found)."),
    click.option("--min-quality", "min_quality", type=SCORE, default=None,
                 help="Leave out arms whose quality (the gateway's endpoint "
                 "`quality`, --quality, else the published figure for the format) is below "
                 "this score relative to 16-bit, e.g. 0.98."),
    click.option("--time-scale", "time_scale", type=POSITIVE, default=1.0, show_default=True,
                 help="--search: the engines' time_scale (simulator): rates, the SLO and every "
                 "reported latency are engine time; the client sends at rate x scale and "
                 "grades wall latency against SLO / scale."),
]


def search_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(SEARCH_OPTIONS):
        f = opt(f)
    return f


def build_arms(p: dict[str, Any], w: Workload, precisions: Sequence[str],
               direct: dict[str, str], run: Callable[[Any], Any],
               quality: dict[str, float] | None = None) -> list[Arm]:
    """The arms, split by engine kind where the gateway lists several kinds per precision,
    each with its quality (`quality`: --quality's scores, which win)."""
    gateway = arm_targets(p, w, [x for x in precisions if x not in direct], {})
    direct_t = arm_targets(p, w, [x for x in precisions if x in direct], direct)
    endpoints = (run(fetch_endpoints(p["target"], p["admin_key"], w.model))
                 if len(direct) < len(precisions) else [])
    return with_quality(plan_arms(precisions, gateway, direct_t, endpoints), quality or {})


def run_search(p: dict[str, Any], w: Workload, arms: Sequence[Arm], opts: RunOptions,
               run: Callable[[Any], Any], say: Callable[[str], None]
               ) -> tuple[SearchReport, list[RunOutcome]]:
    base = TimeBase(p["time_scale"])
    try:
        cfg = SearchConfig(start_rps=p["rate"], max_rps=p["max_rate"] or 64 * p["rate"],
                           target_attainment=p["target_attainment"], trials=p["trials"],
                           tolerance=p["tolerance"], seed=p["seed"] or w.seed,
                           max_trials=p.get("max_trials") or max(8, p["trials"]))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--rate, --max-rate, --trials, "
                                 "--max-trials or --tolerance") from None
    try:
        results, outcomes = run(search_arms(arms, w, cfg, base, opts, say))
    except ValueError as exc:  # a workload the search cannot set a rate on
        raise click.BadParameter(str(exc), param_hint="--workload") from None
    slo = slo_text(w.slo_classes) + f" ({base.short})"
    decision = decide(results, p["need_rps"], slo, cfg.target_attainment,
                      f"req/s ({base.short})", p.get("min_quality"))
    notes = tuple(f"{a.label}: {a.note}" for a in arms if a.note)
    return SearchReport(tuple(results), decision, cfg, slo, base, notes), outcomes


def write_search(out_dir: Path | None, sr: SearchReport, outcomes: Sequence[RunOutcome],
                 say: Callable[[str], None]) -> None:
    """compare.json (every trial, and the search), .csv and .html under `out_dir`."""
    if out_dir is None:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    report.write_json(out_dir / "compare.json", outcomes, {"search": search_report.to_json(sr)})
    report.write_csv(out_dir / "compare.csv", outcomes)
    report_html.write_html(out_dir / "compare.html", "wattgate loadgen compare --search",
                           outcomes, search=sr, base=sr.base)
    say(f"wrote {out_dir}/compare.json, .csv, .html")
