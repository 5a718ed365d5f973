"""The precision recommendation with its uncertainty (loadgen/decide.py) and arms split by
engine kind (loadgen/arms.py)."""

from __future__ import annotations

import math

from core.quality import published
from loadgen.arms import Endpoint, endpoints_of, plan_arms
from loadgen.capacity import CapacityResult, Interval, RateStep, Trial
from loadgen.client import Target
from loadgen.decide import ArmResult, capacity_text, decide, headline


def iv(mean: float, half: float, n: int = 3) -> Interval:
    return Interval(mean, mean - half, mean + half, n, "t")


def step(rate: float, attain: float, j: float, j_half: float) -> RateStep:
    trials = tuple(Trial(s, attain, j) for s in range(3))
    return RateStep(rate, trials, iv(attain, 0.01), iv(j, j_half), attain >= 0.9, False)


def arm(label: str, capacity: float | None, j: float, j_half: float = 0.005,
        saturated: bool = True, cap_half: float = 3.0) -> ArmResult:
    steps = [step(r, 0.99, j * (1 + 10 / r), j_half) for r in (25.0, 50.0)]
    if capacity is not None:
        steps.append(step(capacity, 0.95, j, j_half))
        steps.append(step(capacity * 1.04 if saturated else capacity, 0.5, j, j_half))
    interval = None if capacity is None else Interval(
        capacity, capacity - cap_half, capacity + cap_half if saturated else math.inf, 3, "t")
    res = CapacityResult(tuple(sorted(steps, key=lambda s: s.rate_rps)), capacity,
                         capacity * 1.04 if capacity and saturated else None, interval,
                         max(s.rate_rps for s in steps))
    return ArmResult(label, label.split(" ")[0], "vllm", res)


def test_fewest_joules_at_the_highest_capacity_is_recommended() -> None:
    d = decide([arm("bf16 (vllm)", 100.0, 0.30), arm("fp8 (vllm)", 100.0, 0.20),
                arm("int4 (vllm)", 60.0, 0.10)], None, "TPOT <= 9 ms", 0.9, "req/s")
    assert d.verdict == "recommended" and d.recommended == "fp8 (vllm)"
    assert d.need_rps == 100.0 and d.need_source == "the highest capacity found"
    assert "not meeting it there: int4 (vllm)" in d.why  # cheapest, but cannot carry 100
    assert headline(d).startswith("Recommended: fp8 (vllm).")


def test_overlapping_energy_intervals_are_no_significant_difference() -> None:
    d = decide([arm("bf16 (vllm)", 100.0, 0.205, 0.01), arm("fp8 (vllm)", 100.0, 0.20, 0.01)],
               None, "SLO", 0.9, "req/s")
    assert d.verdict == "no significant difference" and d.recommended is None
    assert set(d.tied) == {"bf16 (vllm)", "fp8 (vllm)"}


def test_a_capacity_interval_reaching_the_need_qualifies() -> None:
    """97 +/- 4 cannot be shown to miss 100: int8 stays in the comparison."""
    d = decide([arm("bf16 (vllm)", 100.0, 0.30), arm("int8 (vllm)", 97.0, 0.15, cap_half=4.0)],
               None, "SLO", 0.9, "req/s")
    assert d.recommended == "int8 (vllm)"


def test_need_picks_the_cheapest_arm_that_meets_it() -> None:
    arms = [arm("bf16 (vllm)", 100.0, 0.30), arm("int4 (vllm)", 60.0, 0.10)]
    assert decide(arms, 40.0, "SLO", 0.9, "req/s").recommended == "int4 (vllm)"
    assert decide(arms, 90.0, "SLO", 0.9, "req/s").recommended == "bf16 (vllm)"
    none = decide(arms, 500.0, "SLO", 0.9, "req/s")
    assert none.verdict == "no arm meets the SLO at the rate needed" and none.recommended is None


def test_wide_intervals_ask_for_more_trials() -> None:
    d = decide([arm("bf16 (vllm)", 100.0, 0.30, 0.05), arm("fp8 (vllm)", 100.0, 0.10, 0.02)],
               None, "SLO", 0.9, "req/s")
    assert d.recommended == "fp8 (vllm)" and not d.narrow_enough
    assert "run more trials" in d.why


def test_unsaturated_capacity_is_a_lower_bound() -> None:
    a = arm("fp8 (vllm)", 200.0, 0.2, saturated=False)
    assert capacity_text(a.search) == ">= 200 (max tested, not saturated)"
    assert capacity_text(arm("bf16 (vllm)", 100.0, 0.3).search) == "100 [97, 103]"


def test_no_arm_met_the_slo() -> None:
    d = decide([arm("bf16 (vllm)", None, 0.3)], None, "SLO", 0.9, "req/s")
    assert d.recommended is None and "try lower rates" in d.why


DOC = {"endpoints": [
    {"model": "m", "name": "h100-bf16", "url": "http://e:1", "kind": "vllm", "precision": "bf16"},
    {"model": "m", "name": "h100-fp8", "url": "http://e:2", "kind": "vllm", "precision": "fp8"},
    {"model": "m", "name": "h100-trt-fp8", "url": "http://e:5", "kind": "trtllm",
     "precision": "fp8"},
    {"model": "other", "name": "x", "url": "http://e:9", "kind": "vllm", "precision": "int8"}]}


def gateway_targets(precs: list[str]) -> dict[str, Target]:
    return {p: Target("http://gw:8", f"m@{p}") for p in precs}


def test_a_precision_served_by_two_engine_kinds_is_split_into_one_arm_each() -> None:
    arms = plan_arms(["bf16", "fp8"], gateway_targets(["bf16", "fp8"]), {},
                     endpoints_of(DOC, "m"))
    assert [(a.label, a.engine_kind, a.target.base_url, a.target.model) for a in arms] == [
        ("bf16 (vllm)", "vllm", "http://gw:8", "m@bf16"),
        ("fp8 (trtllm, h100-trt-fp8)", "trtllm", "http://e:5", "m"),
        ("fp8 (vllm, h100-fp8)", "vllm", "http://e:2", "m")]
    assert "served by trtllm and vllm engines" in arms[1].note


def test_without_the_endpoint_list_arms_say_the_kind_is_unchecked() -> None:
    arms = plan_arms(["int8"], gateway_targets(["int8"]), {"bf16": Target("http://e:1", "m")},
                     None)
    assert arms[0].engine_kind == "unchecked" and "--admin-key" in arms[0].note
    direct = plan_arms(["bf16"], {}, {"bf16": Target("http://e:1", "m")}, [])
    assert direct[0].label == "bf16" and direct[0].engine_kind == "direct"


def test_endpoints_of_keeps_the_model() -> None:
    assert [e.name for e in endpoints_of(DOC, "other")] == ["x"]
    assert endpoints_of(DOC, "m")[0] == Endpoint("h100-bf16", "http://e:1", "vllm", "bf16",
                                                 published("bf16"))


def test_trials_of_a_few_request_lifetimes_are_flagged() -> None:
    """Near capacity, a trial spanning 3 E2E lifetimes measures a transient: said, and the
    intervals are not taken as narrow enough."""
    a = arm("int8 (vllm)", 100.0, 0.2, 0.001, cap_half=1.0)
    short = [s if s.rate_rps != 100.0 else RateStep(
        s.rate_rps, tuple(Trial(t.seed, t.attainment, t.j_per_output_token, False, 3.0)
                          for t in s.trials), s.attainment, s.j_per_output_token, s.meets,
        False) for s in a.search.steps]
    flagged = ArmResult(a.label, a.precision, a.engine_kind, CapacityResult(
        tuple(short), a.search.largest_met_rps, a.search.first_miss_rps, a.search.interval,
        a.search.max_tested_rps))
    assert decide([a], None, "SLO", 0.9, "req/s").narrow_enough
    d = decide([flagged], None, "SLO", 0.9, "req/s")
    assert not d.narrow_enough and "span only 3.0 request lifetimes" in d.why


def test_the_report_table_shows_each_capacitys_repeat_range() -> None:
    """The terminal and HTML tables carry the repeat range beside the 95 % CI, in the table's
    time base; an arm that never saturated, or ran one trial, has none."""
    import dataclasses

    from loadgen import report_html, search_report
    from loadgen.capacity import SearchConfig
    from loadgen.search_report import SearchReport
    from loadgen.timebase import TimeBase

    def with_repeat(a: ArmResult, repeat: Interval | None) -> ArmResult:
        return dataclasses.replace(a, search=dataclasses.replace(a.search, repeat=repeat))

    arms = (with_repeat(arm("bf16 (vllm)", 40.0, 0.3), iv(40.0, 4.6)),
            with_repeat(arm("fp8 (vllm)", 70.0, 0.2, saturated=False), iv(70.0, 5.0)),
            with_repeat(arm("int4 (vllm)", 30.0, 0.4),
                        Interval(30.0, -math.inf, math.inf, 1, "t")))
    report = SearchReport(arms, decide(list(arms), None, "SLO", 0.9, "req/s"),
                          SearchConfig(25.0, 400.0), "SLO", TimeBase(0.4))
    header = search_report.header(report)
    col = header.index("a repeat's range (req/s, engine time)")
    assert [r[col] for r in search_report.rows(report)] == ["[35.4, 44.6]", "n/a",
                                                            "n/a (1 trial)"]
    assert "[35.4, 44.6]" in search_report.text(report)
    html = report_html.search_section(report)
    assert "a repeat&#x27;s range (req/s, engine time)" in html and "[35.4, 44.6]" in html
