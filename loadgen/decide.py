"""The precision recommendation from capacity searches, with its uncertainty (pure).

Each arm is one engine kind at one precision (loadgen/arms.py) with its capacity search
(loadgen/capacity.py). The rule:

0. An arm whose quality (core/quality.py) is below `--min-quality` is excluded before anything
   else, and the answer says so ("int4 (vllm) excluded: quality 0.97 < floor 0.98"); an arm
   of unknown quality is excluded under a floor too (it cannot be shown to meet it).
1. The rate needed: `--need`, else the highest capacity any arm reached.
2. An arm qualifies when the SLO cannot be shown to fail at that rate: it met the SLO at some
   rate and the upper end of its capacity interval reaches the need (a capacity that never
   saturated has no upper end).
3. Each qualifying arm's J per output token is read at its rate met closest to the need.
   The one with the fewest wins, unless another qualifying arm's 95 % interval overlaps its
   own: then the answer is "no significant difference" between them, not a coin flip.

Intervals narrow enough to decide: capacity within +/-10 % and J/token within +/-5 %; wider
ones say to run more trials.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from core.quality import Quality, excluded_text
from loadgen.capacity import CapacityResult, Interval, RateStep

CAPACITY_HALF_WIDTH_PCT = 10.0
J_HALF_WIDTH_PCT = 5.0
# fewer request lifetimes (E2E p50) per trial than this, near capacity, measure a transient
MIN_LIFETIMES = 10.0


@dataclass(frozen=True, slots=True)
class ArmResult:
    label: str  # e.g. "fp8 (trtllm)"
    precision: str
    engine_kind: str
    search: CapacityResult
    quality: Quality | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    need_rps: float | None
    need_source: str  # "--need" or "the highest capacity found"
    verdict: str  # "recommended", "no significant difference", "no arm meets the SLO", ...
    recommended: str | None  # an arm label, only when the verdict is "recommended"
    tied: tuple[str, ...]  # with "no significant difference": the arms it cannot separate
    narrow_enough: bool
    why: str
    min_quality: float | None = None  # the floor the arms were held to (None: no floor)
    excluded: tuple[str, ...] = ()  # "int4 (vllm) excluded: quality 0.97 < floor 0.98"


def step_at(search: CapacityResult, need_rps: float) -> RateStep | None:
    """The rate met closest to `need_rps` (ties: the lower rate)."""
    met = [s for s in search.steps if s.meets]
    return min(met, key=lambda s: (abs(s.rate_rps - need_rps), s.rate_rps), default=None)


def j_at(a: ArmResult, need_rps: float) -> Interval | None:
    s = step_at(a.search, need_rps)
    return s.j_per_output_token if s else None


def qualifies(a: ArmResult, need_rps: float) -> bool:
    iv = a.search.interval
    return iv is not None and iv.high >= need_rps


def capacity_text(r: CapacityResult) -> str:
    """'95.3 [91.0, 99.1]', '>= 200 (max tested, not saturated)', or 'none met'."""
    if r.capacity_rps is None or r.interval is None:
        return f"none met (lowest tried {min(s.rate_rps for s in r.steps):g})"
    if not r.saturated:
        return f">= {r.capacity_rps:.3g} (max tested, not saturated)"
    return f"{r.capacity_rps:.3g} [{r.interval.low:.3g}, {r.interval.high:.3g}]"


def interval_text(iv: Interval | None, fmt: str = "{:.3f}") -> str:
    if iv is None:
        return "n/a"
    if not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return fmt.format(iv.mean) + " (1 trial)"
    return f"{fmt.format(iv.mean)} [{fmt.format(iv.low)}, {fmt.format(iv.high)}]"


def short_trials(arms: Sequence[ArmResult]) -> float | None:
    """The fewest request lifetimes a trial at any arm's largest rate met spans, when under
    MIN_LIFETIMES (None when every such trial is long enough or none says)."""
    spans = [t.lifetimes for a in arms if (c := a.search.largest_met_rps) is not None
             for s in a.search.steps if s.rate_rps == c for t in s.trials
             if t.lifetimes is not None]
    low = min(spans, default=None)
    return low if low is not None and low < MIN_LIFETIMES else None


def _narrow(arms: Sequence[ArmResult], need_rps: float) -> bool:
    for a in arms:
        iv, j = a.search.interval, j_at(a, need_rps)
        if iv is None or j is None or j.half_width_pct > J_HALF_WIDTH_PCT:
            return False
        if a.search.saturated and iv.half_width_pct > CAPACITY_HALF_WIDTH_PCT:
            return False
    return True


def below_floor(arms: Sequence[tuple[str, Quality | None]], floor: float | None
                ) -> tuple[str, ...]:
    """Why each (label, quality) under the quality floor is out of the decision."""
    if floor is None:
        return ()
    return tuple(f"{label} excluded: quality not known, floor {floor:g}"
                 if q is None else excluded_text(label, q, floor)
                 for label, q in arms if q is None or q.score < floor)


def is_excluded(label: str, excluded: Sequence[str]) -> bool:
    return any(x.startswith(f"{label} excluded") for x in excluded)


def decide(arms: Sequence[ArmResult], need_rps: float | None, slo: str,
           target_attainment: float, rate_unit: str, min_quality: float | None = None
           ) -> Decision:
    """The recommendation over the arms' searches (rule in the module docstring), the arms
    under the quality floor left out."""
    excluded = below_floor([(a.label, a.quality) for a in arms], min_quality)
    kept = [a for a in arms if not is_excluded(a.label, excluded)]
    d = _decide(kept, need_rps, slo, target_attainment, rate_unit)
    if not excluded:
        return replace(d, min_quality=min_quality)
    return replace(d, min_quality=min_quality, excluded=excluded,
                   why=f"{d.why}; {'; '.join(excluded)}")


def _decide(arms: Sequence[ArmResult], need_rps: float | None, slo: str,
            target_attainment: float, rate_unit: str) -> Decision:
    caps = [a.search.capacity_rps for a in arms if a.search.capacity_rps is not None]
    source = "--need" if need_rps is not None else "the highest capacity found"
    need = need_rps if need_rps is not None else max(caps, default=None)
    if need is None:
        return Decision(None, source, "no arm meets the SLO", None, (), False,
                        f"no arm met {slo} for {target_attainment:.0%} of requests at any "
                        "rate tried: try lower rates")
    ok = [a for a in arms if qualifies(a, need)]
    if not ok:
        return Decision(need, source, "no arm meets the SLO at the rate needed", None, (),
                        False, f"no arm meets {slo} for {target_attainment:.0%} of requests "
                        f"at {need:.3g} {rate_unit}; capacities: " + _caps(arms))
    ranked = sorted(ok, key=lambda a: _mean(j_at(a, need)))
    best, bj = ranked[0], j_at(ranked[0], need)
    narrow = _narrow(ok, need)
    more = "" if narrow else (f"; intervals wider than +/-{CAPACITY_HALF_WIDTH_PCT:g} % "
                              f"(capacity) or +/-{J_HALF_WIDTH_PCT:g} % (J/token): run more "
                              "trials to decide")
    short = short_trials(arms)
    if short is not None:
        narrow = False
        more += (f"; trials near capacity span only {short:.1f} request lifetimes (E2E p50), "
                 f"under {MIN_LIFETIMES:g}: they measure a transient, not a settled queue, and "
                 "the capacities may move from run to run more than their intervals say; "
                 "lengthen the trials")
    head = (f"at {need:.3g} {rate_unit} ({source}), meeting {slo} for "
            f"{target_attainment:.0%} of requests")
    js = "; ".join(f"{a.label} {interval_text(j_at(a, need))} J/out-tok" for a in ranked)
    if bj is None:
        return Decision(need, source, "no energy data", None, tuple(a.label for a in ok),
                        False, f"{head}: no energy data to rank {', '.join(a.label for a in ok)}")
    tied = tuple(a.label for a in ranked[1:] if (j := j_at(a, need)) is None or j.overlaps(bj))
    out = [a.label for a in arms if a not in ok]
    tail = (f"; not meeting it there: {', '.join(out)}" if out else "") + f"; capacities: " \
        f"{_caps(arms)}{more}"
    if tied:
        return Decision(need, source, "no significant difference", None,
                        (best.label, *tied), narrow,
                        f"{head}, between {best.label} and {', '.join(tied)} (95 % "
                        f"intervals overlap): {js}{tail}")
    return Decision(need, source, "recommended", best.label, (), narrow,
                    f"{best.label} has the fewest J per output token {head}: {js}{tail}")


def _mean(iv: Interval | None) -> float:
    return math.inf if iv is None else iv.mean


def _caps(arms: Sequence[ArmResult]) -> str:
    return ", ".join(f"{a.label} {capacity_text(a.search)}" for a in arms)


def headline(d: Decision) -> str:
    if d.verdict == "recommended":
        return f"Recommended: {d.recommended}. {d.why}."
    if d.verdict == "no significant difference":
        return f"No significant difference {d.why}."
    return f"No recommendation ({d.verdict}): {d.why}."
