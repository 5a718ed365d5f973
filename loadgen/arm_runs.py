"""Runs over arms: one seeded plan replayed on each arm, and rate sweeps (one plan per rate,
replayed on each arm), so that request i pairs across arms."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace

from loadgen import arrivals
from loadgen.client import Target
from loadgen.experiments import PairedDelta, SweepPoint, numeric_format, paired_delta, point
from loadgen.runner import RunOptions, RunOutcome, run_workload
from loadgen.workload import Workload, build_plan


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")


async def compare_arms(w: Workload, targets: dict[str, Target], opts: RunOptions
                       ) -> tuple[list[RunOutcome], list[PairedDelta]]:
    plan = build_plan(w)  # one plan, replayed on every arm: request i pairs across arms
    outcomes = []
    for prec, target in targets.items():
        _err(f"arm {prec}: {numeric_format(prec)} -> {target.base_url} model={target.model}")
        outcomes.append(await run_workload(w, target, opts, label=prec, plan=plan))
    base = outcomes[0]
    deltas = [paired_delta(base.label, base.requests, o.label, o.requests, base.energy_overall,
                           o.energy_overall) for o in outcomes[1:]]
    return outcomes, deltas


async def sweep_rates(w: Workload, targets: dict[str, Target], rates: Sequence[float],
                      opts: RunOptions) -> tuple[list[RunOutcome], list[SweepPoint]]:
    outcomes, points = [], []
    for rate in rates:
        arrival = (arrivals.Gamma(rate, w.arrival.burstiness)
                   if isinstance(w.arrival, arrivals.Gamma) else arrivals.Poisson(rate))
        wr = replace(w, arrival=arrival)
        plan = build_plan(wr)
        for arm, target in targets.items():
            _err(f"sweep {arm} at {rate:g} req/s ({len(plan)} requests)")
            o = await run_workload(wr, target, opts, label=f"{arm}@{rate:g}", plan=plan)
            outcomes.append(o)
            points.append(point(arm, rate, o.summary, o.energy_overall))
    return outcomes, points
