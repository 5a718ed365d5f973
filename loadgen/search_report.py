"""The capacity-search report (pure): the table, its text for a terminal, and its JSON.

Every column names its time base; intervals are 95 % (methods in loadgen/capacity.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.capacity import (
    CAPACITY_METHOD,
    REPEAT_METHOD,
    T_METHOD,
    CapacityResult,
    Interval,
    RateStep,
    SearchConfig,
)
from loadgen.decide import ArmResult, Decision, capacity_text, headline, interval_text, j_at
from loadgen.experiments import numeric_format
from loadgen.timebase import TimeBase


@dataclass(frozen=True, slots=True)
class SearchReport:
    arms: tuple[ArmResult, ...]
    decision: Decision
    config: SearchConfig
    slo: str
    base: TimeBase
    notes: tuple[str, ...] = ()  # per-arm notes (splits, direct targets, unchecked kinds)


def header(r: SearchReport) -> tuple[str, ...]:
    need = "n/a" if r.decision.need_rps is None else f"{r.decision.need_rps:.3g}"
    tb = r.base.short
    return ("arm", "engine", "precision", f"SLO capacity (req/s, {tb}) [95 % CI]",
            f"a repeat's range (req/s, {tb})", f"J/out-tok at {need} req/s [95 % CI]",
            "rates tried", "quality", "format")


def curve_title(r: SearchReport) -> str:
    return (f"J per output token along the load curve (req/s, {r.base.short}: J/out-tok "
            "+/- half its 95 % interval, mean attainment)")


def curve_lines(r: SearchReport) -> list[str]:
    """One line per arm: every rate tried, in order."""
    return [f"{a.label}: " + "; ".join(_curve_point(s) for s in a.search.steps)
            for a in r.arms]


def _curve_point(s: RateStep) -> str:
    j = s.j_per_output_token
    jt = "n/a" if j is None else (f"{j.mean:.3f}" + (f"+/-{(j.high - j.low) / 2:.3f}"
                                                     if math.isfinite(j.high) else ""))
    mark = "" if s.meets else " missed"
    stop = f", stopped after {len(s.trials)} of the trials" if s.stopped_early else ""
    return f"{s.rate_rps:.3g}: {jt}, {s.attainment.mean:.0%}{mark}{stop}"


def rows(r: SearchReport) -> list[list[str]]:
    need = r.decision.need_rps
    out = []
    for a in r.arms:
        mark = (" (recommended)" if a.label == r.decision.recommended else
                " (no significant difference)" if a.label in r.decision.tied else "")
        out.append([a.label + mark, a.engine_kind, a.precision, capacity_text(a.search),
                    repeat_text(a.search),
                    interval_text(j_at(a, need)) if need is not None else "n/a",
                    str(len(a.search.steps)), quality_text(a, r.decision.min_quality),
                    numeric_format(a.precision)])
    return out


def repeat_text(c: CapacityResult) -> str:
    """Where another run with other seeds is expected to put this capacity: '[88.1, 102]',
    or why there is none (one trial, or not saturated)."""
    iv = c.repeat
    if c.capacity_rps is None or not c.saturated:
        return "n/a"
    if iv is None or not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return "n/a (1 trial)"
    return f"[{iv.low:.3g}, {iv.high:.3g}]"


def quality_text(a: ArmResult, floor: float | None) -> str:
    """The arm's quality score, and "< floor" when the decision left it out."""
    if a.quality is None:
        return "not known" + (" (excluded)" if floor is not None else "")
    low = floor is not None and a.quality.score < floor
    return f"{a.quality.score:g}" + (f" < floor {floor:g} (excluded)" if low else "")


def quality_note(r: SearchReport) -> str:
    """Each arm's quality score and, once each, where the scores come from."""
    floor = r.decision.min_quality
    scores = ", ".join(f"{a.label} {'not known' if a.quality is None else f'{a.quality.score:g}'}"
                       for a in r.arms)
    sources = dict.fromkeys(a.quality.source for a in r.arms if a.quality is not None)
    return (f"Quality floor: {'none' if floor is None else f'{floor:g}'}. Quality relative to "
            f"16-bit: {scores} (sources: {'; '.join(sources) or 'none'}).")


def method_note(r: SearchReport) -> str:
    c = r.config
    return (f"Time base: {r.base.name}. SLO: {r.slo} for {c.target_attainment:.0%} of "
            f"requests (mean attainment of a rate's trials). Search: from {c.start_rps:g} "
            f"req/s x{c.growth:g} until missed (at most {c.max_rps:g}), then bisection to "
            f"{c.tolerance:.0%}; {c.trials} trials per rate (seeds {c.seed}..."
            f"{c.seed + c.trials - 1}); a rate stops early once its target is out of reach or "
            f"after an over-saturated trial (TTFT and in-flight rising, TTFT by more than its "
            f"limit); then each seed is run at the rates tried until its own crossing is "
            f"bracketed, and seeds are added while the capacity's interval is wider than "
            f"+/-{c.max_half_width_pct:g} % (at most {c.max_trials}). Intervals: attainment and "
            f"J/out-tok: {T_METHOD}; capacity: {CAPACITY_METHOD}; a repeat's range (where "
            f"another run with other seeds is expected to put its estimate): {REPEAT_METHOD}.")


def text(r: SearchReport) -> str:
    from loadgen.report import text_table

    lines = [headline(r.decision), method_note(r), quality_note(r),
             text_table(header(r), rows(r)),
             curve_title(r) + ":", *curve_lines(r)]
    return "\n".join([*lines, *r.notes])


def _iv(iv: Interval | None) -> dict[str, Any] | None:
    if iv is None:
        return None
    fin = math.isfinite
    return {"mean": iv.mean, "low": iv.low if fin(iv.low) else None,
            "high": iv.high if fin(iv.high) else None, "n": iv.n, "method": iv.method}


def to_json(r: SearchReport) -> dict[str, Any]:
    d = r.decision
    return {
        "time_base": r.base.name, "slo": r.slo,
        "target_attainment": r.config.target_attainment,
        "search": {"start_rps": r.config.start_rps, "max_rps": r.config.max_rps,
                   "trials": r.config.trials, "max_trials": r.config.max_trials,
                   "max_half_width_pct": r.config.max_half_width_pct,
                   "tolerance": r.config.tolerance,
                   "growth": r.config.growth, "seed": r.config.seed},
        "decision": {"verdict": d.verdict, "recommended": d.recommended, "tied": list(d.tied),
                     "need_rps": d.need_rps, "need_source": d.need_source,
                     "narrow_enough": d.narrow_enough, "why": d.why,
                     "min_quality": d.min_quality, "excluded": list(d.excluded)},
        "arms": [{"label": a.label, "precision": a.precision, "engine_kind": a.engine_kind,
                  "quality": None if a.quality is None else {
                      "score": a.quality.score, "benchmark": a.quality.benchmark,
                      "source": a.quality.source},
                  "capacity_rps": a.search.capacity_rps, "saturated": a.search.saturated,
                  "first_miss_rps": a.search.first_miss_rps,
                  "max_tested_rps": a.search.max_tested_rps,
                  "capacity_interval": _iv(a.search.interval),
                  "capacity_repeat_range": _iv(a.search.repeat),
                  "j_per_output_token_at_need": _iv(j_at(a, d.need_rps))
                  if d.need_rps is not None else None,
                  "steps": [{"rate_rps": s.rate_rps, "meets": s.meets,
                             "stopped_early": s.stopped_early,
                             "attainment": _iv(s.attainment),
                             "j_per_output_token": _iv(s.j_per_output_token),
                             "trials": [{"seed": t.seed, "attainment": t.attainment,
                                         "j_per_output_token": t.j_per_output_token,
                                         "over_saturated": t.over_saturated}
                                        for t in s.trials]}
                            for s in a.search.steps]}
                 for a in r.arms],
        "notes": list(r.notes),
    }


def curve_series(r: SearchReport) -> Sequence[tuple[str, list[RateStep]]]:
    return [(a.label, list(a.search.steps)) for a in r.arms]
