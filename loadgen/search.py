"""Capacity searches over arms: the shell that runs loadgen/capacity.py's trials.

A trial at rate R (requests/s in engine time) is one run of the workload with its arrival
process set to R x time_scale on the wall, graded against the SLO / time_scale (and the
schedule-lag limit / time_scale): with a simulator whose engine time runs at time_scale x wall
time, all are the engine's own figures.
Energy is fetched once after every search, since the search decides on attainment alone.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from core.vocab import SloClass
from loadgen import arrivals
from loadgen.arms import Arm
from loadgen.capacity import (
    RunAt,
    SearchConfig,
    Trial,
    over_saturated,
    retry_ungraded,
    search_capacity,
    with_energy,
)
from loadgen.decide import ArmResult
from loadgen.runner import RunOptions, RunOutcome, add_energy, run_workload
from loadgen.timebase import TimeBase
from loadgen.workload import Workload, build_plan


def at_rate(w: Workload, rate_rps: float, seed: int, base: TimeBase) -> Workload:
    """`w` offering `rate_rps` engine-time requests/s with `seed`, its SLO in wall time."""
    wall = rate_rps * base.time_scale
    arrival: arrivals.ArrivalProcess
    if isinstance(w.arrival, arrivals.Gamma):
        arrival = arrivals.Gamma(wall, w.arrival.burstiness)
    elif isinstance(w.arrival, arrivals.Constant):
        arrival = arrivals.Constant(wall)
    elif isinstance(w.arrival, arrivals.Poisson):
        arrival = arrivals.Poisson(wall)
    else:
        raise ValueError("a capacity search needs one open-loop arrival process for the whole "
                         "workload (poisson, gamma or constant), not per-tenant arrivals or a "
                         "closed loop")
    k = base.time_scale
    slos = tuple(SloClass(s.name, ttft_s=None if s.ttft_s is None else s.ttft_s / k,
                          tpot_s=None if s.tpot_s is None else s.tpot_s / k,
                          e2e_s=None if s.e2e_s is None else s.e2e_s / k)
                 for s in w.slo_classes)
    return replace(w, arrival=arrival, seed=seed, slo_classes=slos)


def ttft_limit_s(w: Workload) -> float:
    """The tightest TTFT limit of the workload's classes (inf when none has one)."""
    return min((s.ttft_s for s in w.slo_classes if s.ttft_s is not None), default=float("inf"))


def trial_of(o: RunOutcome, seed: int, ttft_limit_wall_s: float) -> Trial:
    rs = [m.result for m in o.requests]
    saturated = over_saturated([r.intended_s for r in rs], [r.end_s for r in rs],
                               [None if r.first_token_s is None else r.first_token_s
                                - r.intended_s for r in rs], ttft_limit_wall_s)
    e2e_s = o.summary.from_intended.e2e_s.p50
    span_s = max(r.intended_s for r in rs) - min(r.intended_s for r in rs) if rs else 0.0
    lifetimes = span_s / e2e_s if e2e_s and not math.isnan(e2e_s) and e2e_s > 0 else None
    return Trial(seed, o.summary.attainment, None, saturated, lifetimes)


def trial_runner(arm: Arm, w: Workload, base: TimeBase, opts: RunOptions,
                 runs: dict[tuple[float, int], RunOutcome], say: Callable[[str], None]
                 ) -> RunAt:
    """The `run_at(rate, seed)` of one arm: one run of `w` at that rate, kept in `runs`."""
    # the schedule-lag limit is engine time too: at time_scale 0.1 a 10 ms wall lag is 1 ms
    quiet = replace(opts, fetch_energy=False, progress=False,
                    lag_threshold_s=opts.lag_threshold_s / base.time_scale)

    async def run_at(rate_rps: float, seed: int) -> Trial:
        wr = at_rate(w, rate_rps, seed, base)
        plan = build_plan(wr)

        async def once() -> Trial:
            o = await run_workload(wr, arm.target, quiet,
                                   label=f"{arm.label}@{rate_rps:.4g}#{seed}", plan=plan)
            runs[(rate_rps, seed)] = o
            return trial_of(o, seed, ttft_limit_s(wr))

        trial, n = await retry_ungraded(once)
        att = "n/a" if trial.attainment is None else f"{trial.attainment:.1%}"
        say(f"search {arm.label}: {rate_rps:.4g} req/s ({base.short}), seed {seed}: "
            f"{len(plan)} requests, attainment {att}"
            + (", over-saturated" if trial.over_saturated else "")
            + (f" ({n} runs: the client fell behind its schedule)" if n > 1 else ""))
        return trial

    return run_at


async def search_arm(arm: Arm, w: Workload, cfg: SearchConfig, base: TimeBase,
                     opts: RunOptions, say: Callable[[str], None]
                     ) -> tuple[ArmResult, list[RunOutcome]]:
    """One arm's capacity search; its trials' outcomes with energy, labelled arm@rate#seed."""
    runs: dict[tuple[float, int], RunOutcome] = {}
    run_at = trial_runner(arm, w, base, opts, runs, say)
    result = await search_capacity(run_at, cfg)
    done = {k: await add_energy(o, opts) for k, o in runs.items()} if opts.fetch_energy else runs

    def j_of(rate_rps: float, seed: int) -> float | None:
        e = done[(rate_rps, seed)].energy_overall
        return e.j_per_output_token if e is not None and e.output_tokens > 0 else None

    result = with_energy(result, j_of, cfg.target_attainment)
    return (ArmResult(arm.label, arm.precision, arm.engine_kind, result, arm.quality),
            [done[k] for k in sorted(done)])


async def search_arms(arms: Sequence[Arm], w: Workload, cfg: SearchConfig, base: TimeBase,
                      opts: RunOptions, say: Callable[[str], None], *, at_once: bool = False
                      ) -> tuple[list[ArmResult], list[RunOutcome]]:
    """Every arm's search: one after another, or `at_once` when each arm has engines of its
    own (the arms then share only the client and the gateway)."""
    if at_once:
        pairs = await asyncio.gather(*(search_arm(a, w, cfg, base, opts, say) for a in arms))
    else:
        pairs = [await search_arm(a, w, cfg, base, opts, say) for a in arms]
    return [r for r, _ in pairs], [o for _, os in pairs for o in os]
