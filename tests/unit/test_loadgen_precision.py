"""Precision reports: SLO capacity per precision and the recommended precision."""

from __future__ import annotations

from loadgen.experiments import SweepPoint
from loadgen.precision import precision_report, precision_rows


def pt(arm: str, rate: float, attainment: float, j: float) -> SweepPoint:
    return SweepPoint(arm, rate, rate, True, rate * attainment, attainment, j, 0.1, 0.01,
                      carbon_g_per_1m_tokens=10 * j, usd_per_1m_tokens=j)


POINTS = [
    # bf16 meets the SLO up to 20, fp8 and int8 up to 40 (int8 cheaper there), int4 never
    pt("bf16", 10, 1.0, 0.30), pt("bf16", 20, 0.95, 0.20), pt("bf16", 40, 0.50, 0.15),
    pt("fp8", 10, 1.0, 0.40), pt("fp8", 20, 1.0, 0.25), pt("fp8", 40, 0.92, 0.12),
    pt("int8", 10, 1.0, 0.35), pt("int8", 20, 1.0, 0.22), pt("int8", 40, 0.91, 0.10),
    pt("int4", 10, 0.20, 0.05), pt("int4", 20, 0.10, 0.04), pt("int4", 40, 0.0, 0.03),
]


def test_recommends_fewest_joules_among_precisions_meeting_the_slo_at_the_highest_rate() -> None:
    r = precision_report(POINTS, ["bf16", "fp8", "int8", "int4"], 0.9, "TPOT <= 9 ms",
                         {"int8": 0.99})
    caps = {a.precision: a.capacity_rps for a in r.arms}
    assert caps == {"bf16": 20, "fp8": 40, "int8": 40, "int4": None}
    # int4 has the fewest J/token of all, but never meets the SLO: not recommended
    assert r.recommended == "int8"
    assert "up to 40 req/s" in r.why and "0.100 J" in r.why and "fp8 at 0.120" in r.why
    assert "bf16 only up to 20 req/s" in r.why and "int4 met it at no rate tried" in r.why
    assert "quality score 0.99" in r.why
    rows = {row[0]: row for row in precision_rows(r)}
    # 40 req/s is the highest rate tried and int8 met it: a lower bound, said as such
    assert rows["int8 (recommended)"][1:3] == [">= 40 (max tested, not saturated)", "0.100"]
    assert "its capacity is >= 40, not reached" in r.why
    assert rows["bf16"][1] == "20"
    assert rows["int4"][1] == "none met"
    assert "40: 0.150 (SLO missed)" in rows["bf16"][3]


def test_no_recommendation_when_no_precision_meets_the_slo() -> None:
    r = precision_report([p for p in POINTS if p.arm == "int4"], ["int4"], 0.9, "TTFT", {})
    assert r.recommended is None and "lower rates" in r.why


def test_arm_labels_keep_their_precisions_format() -> None:
    """An arm labelled by engine kind and precision is described by its precision."""
    pts = [SweepPoint("fp8 (trtllm)", p.rate_rps, *[getattr(p, f) for f in
                      SweepPoint.__dataclass_fields__][2:]) for p in POINTS if p.arm == "fp8"]
    r = precision_report(pts, ["fp8 (trtllm)"], 0.9, "TPOT", {"fp8": 0.97},
                         arm_precisions={"fp8 (trtllm)": "fp8"})
    assert r.arms[0].numeric_format.startswith("FP8 E4M3")
    assert r.arms[0].quality == 0.97
