"""Precision reports (pure): per precision, the highest offered rate that meets the SLO, J per
output token along the load curve and at that capacity, gCO2e and USD per million tokens, the
quality score where given, and the recommended precision with the reason.

The recommendation: among the arms that meet the SLO at the highest rate any arm meets it at,
the one with the fewest J per output token there. A precision that only meets the SLO at light
load is never recommended over one that carries more load within it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from core.vocab import SloClass
from loadgen.experiments import SweepPoint, accuracy_condition, meets, numeric_format


@dataclass(frozen=True, slots=True)
class PrecisionArm:
    """One precision over the rates it was offered (sorted by rate)."""

    precision: str
    numeric_format: str
    accuracy: str  # the quality score, or "accuracy not measured"
    quality: float | None
    curve: tuple[SweepPoint, ...]
    capacity: SweepPoint | None  # the highest offered rate meeting the SLO; None if none did

    @property
    def capacity_rps(self) -> float | None:
        return self.capacity.rate_rps if self.capacity else None

    @property
    def saturated(self) -> bool:
        """Whether the SLO was missed at some rate above its capacity (else the capacity is
        only a lower bound: the highest rate tried)."""
        cap = self.capacity_rps
        return any(p.rate_rps > (cap or 0.0) for p in self.curve)  # above it: all missed

    def capacity_text(self) -> str:
        if self.capacity_rps is None:
            return "none met"
        if not self.saturated:
            return f">= {self.capacity_rps:g} (max tested, not saturated)"
        return f"{self.capacity_rps:g}"


@dataclass(frozen=True, slots=True)
class PrecisionReport:
    target_attainment: float
    slo: str  # e.g. "TTFT <= 500 ms and TPOT <= 9 ms"
    rate_note: str  # what the rates count (e.g. engine time under a simulator time scale)
    arms: tuple[PrecisionArm, ...]
    recommended: str | None
    why: str


def precision_arm(precision: str, points: Sequence[SweepPoint], target_attainment: float,
                  quality: dict[str, float], numeric: str = "") -> PrecisionArm:
    """`precision`: the arm's label; `numeric`: its precision when the label is more (an arm
    "fp8 (vllm)" is FP8 on one engine kind)."""
    curve = tuple(sorted((p for p in points if p.arm == precision), key=lambda p: p.rate_rps))
    ok = [p for p in curve if meets(p, target_attainment)]
    prec = numeric or precision
    return PrecisionArm(precision, numeric_format(prec), accuracy_condition(prec, quality),
                        quality.get(prec), curve,
                        max(ok, key=lambda p: p.rate_rps) if ok else None)


def _j(p: SweepPoint | None) -> float:
    return p.j_per_output_token if p and p.j_per_output_token is not None else math.inf


def recommend(arms: Sequence[PrecisionArm], target_attainment: float, slo: str
              ) -> tuple[str | None, str]:
    """(precision, why): fewest J per output token among the arms meeting the SLO at the
    highest rate any arm meets it at; (None, why) when no arm met it."""
    capable = [a for a in arms if a.capacity is not None]
    if not capable:
        return None, (f"no precision met {slo} for {target_attainment:.0%} of requests at any "
                      "rate tried: try lower rates")
    top = max(a.capacity_rps or 0.0 for a in capable)
    at_top = [a for a in capable if a.capacity_rps == top]
    best = min(at_top, key=lambda a: _j(a.capacity))
    j = best.capacity.j_per_output_token if best.capacity else None
    parts = [f"{best.precision} meets {slo} for {target_attainment:.0%} of requests up to "
             f"{top:g} req/s, the highest rate any precision met"
             + ("" if best.saturated else " (and the highest rate tried: its capacity is >= "
                f"{top:g}, not reached)")]
    parts.append(f", at {j:.3f} J per output token there" if j is not None
                 else " (no energy data)")
    others = [a for a in at_top if a is not best]
    if others:
        parts.append("; also meeting it there: " + ", ".join(
            f"{a.precision} at {_j(a.capacity):.3f} J/token" for a in others))
    lower = sorted((a for a in capable if a.capacity_rps != top),
                   key=lambda a: -(a.capacity_rps or 0.0))
    if lower:
        parts.append("; " + ", ".join(f"{a.precision} only up to {a.capacity_rps:g} req/s"
                                      for a in lower))
    failed = [a.precision for a in arms if a.capacity is None]
    if failed:
        parts.append("; " + ", ".join(failed) + " met it at no rate tried")
    parts.append(f". Accuracy: {best.accuracy}.")
    return best.precision, "".join(parts).replace(" ;", ";")


def precision_report(points: Sequence[SweepPoint], precisions: Sequence[str],
                     target_attainment: float, slo: str, quality: dict[str, float],
                     rate_note: str = "offered requests/s",
                     arm_precisions: dict[str, str] | None = None,
                     excluded: Sequence[str] = ()) -> PrecisionReport:
    """`precisions`: the arms' labels; `arm_precisions`: label -> precision where they differ;
    `excluded`: why arms under the quality floor are left out (loadgen/decide.py)."""
    kept = [p for p in precisions if not any(x.startswith(f"{p} excluded") for x in excluded)]
    arms = tuple(precision_arm(p, points, target_attainment, quality,
                               (arm_precisions or {}).get(p, "")) for p in kept)
    rec, why = recommend(arms, target_attainment, slo)
    if excluded:
        why = f"{why} {'; '.join(excluded)}."
    return PrecisionReport(target_attainment, slo, rate_note, arms, rec, why)


def slo_text(slos: Sequence[SloClass], time_scale: float = 1.0) -> str:
    """'TTFT <= 500 ms and TPOT <= 9 ms' per class; limits divided by `time_scale` when the
    loadgen grades wall time against engines that run at time_scale x real time."""
    def one(s: SloClass) -> str:
        lims = [f"{k} <= {v * time_scale * 1e3:g} ms" for k, v in
                (("TTFT", s.ttft_s), ("TPOT", s.tpot_s), ("E2E", s.e2e_s)) if v is not None]
        return " and ".join(lims) or "no limits"
    if len(slos) == 1:
        return one(slos[0])
    return "; ".join(f"{s.name}: {one(s)}" for s in slos)


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None or math.isnan(x) else fmt.format(x)


PRECISION_HEADER = ("precision", "SLO capacity (req/s)", "J/out-tok at capacity",
                    "J/out-tok along the curve (rate: J)", "gCO2e/1M tok", "USD/1M tok",
                    "quality", "format")


def precision_rows(r: PrecisionReport) -> list[list[str]]:
    """The rows of the precision table (strings, units in the header)."""
    rows = []
    for a in r.arms:
        c = a.capacity
        curve = ", ".join(f"{p.rate_rps:g}: {_f(p.j_per_output_token, '{:.3f}')}"
                          + ("" if meets(p, r.target_attainment) else " (SLO missed)")
                          for p in a.curve)
        rows.append([a.precision + (" (recommended)" if a.precision == r.recommended else ""),
                     a.capacity_text(),
                     _f(c.j_per_output_token if c else None, "{:.3f}"), curve,
                     _f(c.carbon_g_per_1m_tokens if c else None, "{:.1f}"),
                     _f(c.usd_per_1m_tokens if c else None, "{:.3f}"),
                     _f(a.quality, "{:g}") if a.quality is not None else "not measured",
                     a.numeric_format])
    return rows


def headline(r: PrecisionReport) -> str:
    if r.recommended is None:
        return f"No recommended precision: {r.why}"
    return f"Recommended precision at the SLO: {r.recommended}. {r.why}"
