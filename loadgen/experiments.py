"""Experiments over several runs (pure parts): paired precision arms, rate sweeps, presets.

A comparison replays one plan (same seeded schedule and prompts) against each precision, so
request i of one arm pairs with request i of every other. Each arm states its numeric format and
an accuracy condition (a user-supplied quality score, or "not measured"): a faster or cheaper
precision is never presented as interchangeable with another without that statement.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loadgen.energy import EnergyStats
from loadgen.run_summary import RequestMetrics, Summary

NUMERIC_FORMATS: dict[str, str] = {
    "bf16": "BF16 weights and activations",
    "fp16": "FP16 weights and activations",
    "fp8": "FP8 E4M3 weights and activations (W8A8)",
    "int8": "INT8 SmoothQuant weights and activations (W8A8)",
    "int4": "INT4 AWQ weights, 16-bit activations (W4A16)",
}


def numeric_format(precision: str) -> str:
    """The format of a precision, or of an arm labelled "fp8 (vllm)" (precision first)."""
    key = precision.split(" ", 1)[0]
    return NUMERIC_FORMATS.get(key, f"{key} (format not catalogued)")


def accuracy_condition(precision: str, quality: dict[str, float]) -> str:
    if precision in quality:
        return f"quality score {quality[precision]:g} (user-supplied)"
    return "accuracy not measured"


@dataclass(frozen=True, slots=True)
class PairedDelta:
    """Arm minus baseline over requests that succeeded in both (same index = same request)."""

    arm: str
    baseline: str
    pairs: int
    ttft_median_delta_s: float
    tpot_median_delta_s: float
    e2e_median_delta_s: float
    ttft_faster_share: float  # share of pairs where the arm's TTFT was lower
    j_per_token_delta_pct: float | None  # None when either arm has no energy


def _median_delta(pairs: Sequence[tuple[RequestMetrics, RequestMetrics]],
                  pick: Callable[[RequestMetrics], float | None]) -> float:
    diffs = [b - a for x, y in pairs
             if (a := pick(x)) is not None and (b := pick(y)) is not None]
    return statistics.median(diffs) if diffs else math.nan


def paired_delta(base_label: str, base: Sequence[RequestMetrics], arm_label: str,
                 arm: Sequence[RequestMetrics], base_energy: EnergyStats | None,
                 arm_energy: EnergyStats | None) -> PairedDelta:
    by_index = {m.result.index: m for m in base if m.result.ok}
    pairs = [(by_index[m.result.index], m) for m in arm
             if m.result.ok and m.result.index in by_index]
    ttft_faster = sum(1 for a, b in pairs if a.from_intended.ttft_s is not None
                      and b.from_intended.ttft_s is not None
                      and b.from_intended.ttft_s < a.from_intended.ttft_s)
    energy_pct = None
    if base_energy and arm_energy and base_energy.j_per_output_token > 0:
        energy_pct = 100 * (arm_energy.j_per_output_token / base_energy.j_per_output_token - 1)
    return PairedDelta(
        arm=arm_label, baseline=base_label, pairs=len(pairs),
        ttft_median_delta_s=_median_delta(pairs, lambda m: m.from_intended.ttft_s),
        tpot_median_delta_s=_median_delta(pairs, lambda m: m.from_intended.tpot_s),
        e2e_median_delta_s=_median_delta(pairs, lambda m: m.from_intended.e2e_s),
        ttft_faster_share=ttft_faster / len(pairs) if pairs else math.nan,
        j_per_token_delta_pct=energy_pct)


@dataclass(frozen=True, slots=True)
class SweepPoint:
    arm: str  # precision or label
    rate_rps: float
    achieved_rate_rps: float
    graded: bool
    goodput_rps: float | None
    attainment: float | None
    j_per_output_token: float | None
    ttft_p99_s: float
    tpot_p99_s: float
    # per million tokens (prompt + output); None without energy, or from the simulator's
    # ground truth (joules only)
    carbon_g_per_1m_tokens: float | None = None
    usd_per_1m_tokens: float | None = None


def point(arm: str, rate_rps: float, s: Summary, e: EnergyStats | None) -> SweepPoint:
    billed = e is not None and (e.carbon_g > 0 or e.cost_usd > 0)
    return SweepPoint(arm, rate_rps, s.achieved_rate_rps, s.graded, s.goodput_rps, s.attainment,
                      e.j_per_output_token if e else None, s.from_intended.ttft_s.p99,
                      s.from_intended.tpot_s.p99,
                      e.carbon_g_per_1k_tokens * 1e3 if e and billed else None,
                      e.usd_per_1k_tokens * 1e3 if e and billed else None)


@dataclass(frozen=True, slots=True)
class SweepResult:
    target_attainment: float
    points: tuple[SweepPoint, ...]
    best_goodput: dict[str, SweepPoint]  # per arm: max goodput among points meeting the target
    min_energy: SweepPoint | None  # lowest J/token among points meeting the target


def meets(p: SweepPoint, target_attainment: float) -> bool:
    return p.graded and p.attainment is not None and p.attainment >= target_attainment


def sweep_result(points: Sequence[SweepPoint], target_attainment: float) -> SweepResult:
    best: dict[str, SweepPoint] = {}
    for p in points:
        if meets(p, target_attainment) and (p.arm not in best or (p.goodput_rps or 0)
                                            > (best[p.arm].goodput_rps or 0)):
            best[p.arm] = p
    with_energy = [p for p in points if meets(p, target_attainment)
                   and p.j_per_output_token is not None]
    min_e = min(with_energy, key=lambda p: p.j_per_output_token or math.inf, default=None)
    return SweepResult(target_attainment, tuple(points), best, min_e)


def pareto_front(points: Sequence[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """Points (label, goodput rps, J/token) not dominated by another (more goodput with no more
    J/token, or fewer J/token with no less goodput); sorted by J/token."""
    front = []
    for lab, g, e in points:
        dominated = any((g2 >= g and e2 <= e) and (g2 > g or e2 < e) for _, g2, e2 in points)
        if not dominated:
            front.append((lab, g, e))
    return sorted(front, key=lambda p: p[2])
