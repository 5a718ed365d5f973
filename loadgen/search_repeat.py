"""Capacity searches repeated with other seeds, compared (pure, over `compare.json`'s "search"
documents): the same recommendation, and each arm's capacity inside the other runs'
confidence intervals and repeat ranges.

A confidence interval says where the true capacity is, not where another run's estimate will
fall: two equally precise estimates fall outside each other's 95 % interval about one time in
six to ten (loadgen/capacity.py), so `capacities_inside_other_intervals` is expected below the
total even when nothing moves; the repeat range is the interval built for that question.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def inside(cap: float | None, iv: dict[str, Any] | None) -> bool:
    """`cap` within the JSON interval `iv` (a missing high end is unbounded)."""
    high = iv["high"] if iv and iv["high"] is not None else float("inf")
    return bool(cap is not None and iv is not None and iv["low"] <= cap <= high)


def overlap(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return False
    inf = float("inf")
    return bool(a["low"] <= (inf if b["high"] is None else b["high"])
                and b["low"] <= (inf if a["high"] is None else a["high"]))


def same_verdict(runs: Sequence[dict[str, Any]]) -> bool:
    """One recommendation across the runs, or "no significant difference" in every run."""
    verdicts = [(r["decision"]["verdict"], r["decision"]["recommended"]) for r in runs]
    return len(set(verdicts)) == 1 or all(v == "no significant difference" for v, _ in verdicts)


def answers(run: dict[str, Any]) -> set[str]:
    """The arms a run's decision names: the one recommended, or those with no significant
    difference between them (none when nothing met the SLO)."""
    d = run["decision"]
    return {d["recommended"]} if d["recommended"] else set(d["tied"])


def agreeing(runs: Sequence[dict[str, Any]]) -> set[str]:
    """The arms every run's answer names: empty when two runs contradict each other (one
    recommends an arm another leaves out). A short run that cannot tell two arms apart
    ("no significant difference") agrees with one that recommends either of them."""
    sets = [answers(r) for r in runs]
    return set.intersection(*sets) if sets else set()


def _outside_text(label: str, i: int, j: int, cap: float | None,
                  iv: dict[str, Any] | None) -> str:
    if cap is not None and iv and iv["high"] is not None:
        return f"{label}: run {i} {cap:.3g} outside run {j} [{iv['low']:.3g}, {iv['high']:.3g}]"
    return f"{label}: run {i} {cap} outside run {j} {iv}"


def checks(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Same verdict across runs; each arm's capacity inside every other run's interval and
    repeat range; each pair of runs' intervals overlapping (arms matched by position)."""
    contained, in_repeat, overlaps, pairs, outside = 0, 0, 0, 0, []
    for i, a in enumerate(runs):
        for j, b in enumerate(runs):
            if i == j:
                continue
            for arm_a, arm_b in zip(a["arms"], b["arms"], strict=True):
                cap, iv = arm_a["capacity_rps"], arm_b["capacity_interval"]
                ok = inside(cap, iv)
                contained += ok
                in_repeat += inside(cap, arm_b.get("capacity_repeat_range"))
                if i < j:
                    pairs += 1
                    overlaps += overlap(arm_a["capacity_interval"], iv)
                if not ok:
                    outside.append(_outside_text(arm_a["label"], i, j, cap, iv))
    return {"same_recommendation": same_verdict(runs), "agreeing": sorted(agreeing(runs)),
            "verdicts": [(r["decision"]["verdict"], r["decision"]["recommended"]) for r in runs],
            "capacities_inside_other_intervals": contained,
            "capacities_inside_other_repeat_ranges": in_repeat,
            "interval_pairs_overlapping": overlaps, "interval_pairs": pairs,
            "outside": outside}
