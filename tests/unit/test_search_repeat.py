"""Capacity searches repeated with other seeds, compared (loadgen/search_repeat.py)."""

from __future__ import annotations

from typing import Any

from loadgen.search_repeat import agreeing, checks


def _run(recommended: str | None, tied: list[str], caps: list[float],
         half: float = 5.0) -> dict[str, Any]:
    verdict = "recommended" if recommended else "no significant difference"
    return {"decision": {"verdict": verdict, "recommended": recommended, "tied": tied},
            "arms": [{"label": f"a{i}", "capacity_rps": c,
                      "capacity_interval": {"mean": c, "low": c - half, "high": c + half},
                      "capacity_repeat_range": {"mean": c, "low": c - 2 * half,
                                                "high": c + 2 * half}}
                     for i, c in enumerate(caps)]}


def test_a_tie_that_includes_the_recommended_arm_agrees_a_different_one_does_not() -> None:
    int8, tie, fp8 = (_run("int8", [], [10.0]), _run(None, ["int8", "fp8"], [10.0]),
                      _run("fp8", [], [10.0]))
    assert agreeing([int8, tie, int8]) == {"int8"}
    assert agreeing([int8, fp8]) == set()
    assert agreeing([tie, tie]) == {"int8", "fp8"}
    c = checks([int8, tie, int8])
    assert not c["same_recommendation"] and c["agreeing"] == ["int8"]


def test_capacities_are_counted_inside_the_other_runs_intervals_and_repeat_ranges() -> None:
    runs = [_run("x", [], [100.0, 50.0]), _run("x", [], [104.0, 62.0]),
            _run("x", [], [96.0, 50.0])]
    c = checks(runs)
    # arm 0 (CI +/-5): 104 and 96 miss each other's; arm 1: 62 and the two 50s miss each
    # other's CI (4) and repeat range (+/-10: 4), and their intervals do not overlap (2 pairs)
    assert c["capacities_inside_other_intervals"] == 12 - 2 - 4
    assert len(c["outside"]) == 6
    assert c["capacities_inside_other_repeat_ranges"] == 12 - 4
    assert c["interval_pairs_overlapping"] == 6 - 2 and c["interval_pairs"] == 6
    assert c["same_recommendation"]
