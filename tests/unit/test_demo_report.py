"""The demo's answer: what slo_energy saves over least_load (in %, with its paired-bootstrap
interval and both attainments), split into packing and precision choice under the quality
floor; the tenants' bills with the idle energy apart and its policy named; all of it in the
answer at the top of the page, before any table (loadgen/demo_saving.py, loadgen/demo.py)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from loadgen import demo_saving
from tests.support import demo_page


def test_the_saving_is_the_ratio_of_joules_per_token_split_exactly_in_two() -> None:
    r = demo_page.results()
    ll, se = r.routing.outcomes
    s = demo_saving.routing_saving(ll, se, 0.98, ("int4 excluded: q",))
    assert s is not None and s.pairs == 60
    # least_load 6.2 J per 12 tokens, slo_energy 4.6 J: 1 - 4.6 / 6.2
    assert s.pct == pytest.approx(100 * (1 - 4.6 / 6.2))
    assert s.low_pct <= s.pct <= s.high_pct
    # packing: bf16 0.5 -> 0.4 and int8 0.45 -> 0.375 J/token at slo_energy's shares (1/3,
    # 2/3); precision: a third of the tokens moved from fp8 (0.6) to int8 (0.45)
    j_ll = 6.2 / 12
    assert s.packing_pct == pytest.approx(100 * (0.1 / 3 + 2 * 0.075 / 3) / j_ll)
    assert s.precision_pct == pytest.approx(100 * (0.6 - 0.45) / 3 / j_ll)
    assert s.packing_pct + s.precision_pct == pytest.approx(s.pct)
    assert s.attainment_ll == 1.0 and s.attainment_se == 1.0
    line = demo_saving.saving_line(s)
    assert line.startswith(f"Routing: slo_energy saves {s.pct:.1f} % [95 % CI ")
    assert "not significant" not in line
    assert "SLO attainment 100.0% vs 100.0%" in line and "quality floor 0.98" in line


def test_the_interval_is_wide_when_the_requests_disagree() -> None:
    noisy = demo_page.outcome("slo_energy", [("bf16", j) for j in (0.5, 3.5) * 30])
    flat = demo_page.outcome("least_load", [("bf16", 2.0)] * 60)
    s = demo_saving.routing_saving(flat, noisy)
    assert s is not None and s.pct == pytest.approx(0.0, abs=1e-9)
    assert s.low_pct < -10.0 and s.high_pct > 10.0  # no significant saving
    assert "(not significant: the interval holds 0)" in demo_saving.saving_line(s)
    assert s.precision_pct == pytest.approx(0.0) and s.packing_pct == pytest.approx(0.0)


def test_a_precision_only_slo_energy_served_counts_as_precision_choice() -> None:
    ll = demo_page.outcome("least_load", [("bf16", 2.0)] * 10)
    se = demo_page.outcome("slo_energy", [("int8", 1.0)] * 10)
    s = demo_saving.routing_saving(ll, se)
    assert s is not None and s.pct == pytest.approx(50.0)
    assert s.precision_pct == pytest.approx(50.0) and s.packing_pct == pytest.approx(0.0)


def test_no_energy_no_saving() -> None:
    ll = demo_page.outcome("least_load", [("bf16", 2.0)] * 10)
    assert demo_saving.routing_saving(ll, ll.__class__(**{**{f: getattr(ll, f) for f in (
        "label", "target", "summary", "requests", "energy_overall", "energy_by_tenant",
        "energy_by_precision")}, "energy_fetch": None})) is None


def test_idle_energy_is_read_from_the_usage_reports_idle_rows() -> None:
    doc = {"rows": [{"tenant": "acme", "account": "requests", "energy_j": 10.0},
                    {"tenant": "(idle)", "account": "idle", "energy_j": 70.0},
                    {"tenant": "(idle)", "account": "idle", "energy_j": 5.5}]}
    assert demo_saving.idle_of(doc) == 75.5
    assert demo_saving.idle_of({"error": "x"}) is None


def test_the_page_opens_with_recommendation_saving_and_bills_with_idle_apart(
        tmp_path: Path) -> None:
    page = demo_page.write(tmp_path).read_text()
    first = html.unescape(page[:page.index("<table")])  # what comes before any table
    answer = first[first.index("class='answer'"):]
    # the recommendation, with its intervals, the cheapest arm excluded by the quality floor
    assert "Recommended: fp8 (vllm)." in answer
    assert "fp8 (vllm) 0.200 [0.195, 0.205] J/out-tok" in answer
    assert "int4 (vllm) excluded: quality 0.97 < floor 0.98" in answer
    # the routing saving in %, its interval, both attainments, its two parts
    assert "Routing: slo_energy saves 25.8 % [95 % CI " in answer
    assert "packing on engines of one precision 16.1 %" in answer
    assert "choosing cheaper precisions 9.7 %" in answer
    # the tenants' bills, the idle energy apart from them
    assert "Tenants' bills: acme " in answer and "idle 5432 J, kept apart" in answer
    assert answer.index("Recommended:") < answer.index("Routing:") < answer.index("Tenants'")
    # the tenants' table has the idle row; its policy is named under it
    body = html.unescape(page)
    assert "<td>(idle, kept apart)</td>" in body and "<td>5432.0</td>" in body
    assert "Policy: idle energy kept apart" in body
    # one footnote for what every routing run shares, not one per run
    assert body.count("energy gateway accounting, apportioned") <= 2
    doc = json.loads((tmp_path / "demo.json").read_text())
    assert doc["idle_j"] == demo_page.IDLE_J
    assert doc["routing_saving"]["pct"] == pytest.approx(100 * (1 - 4.6 / 6.2))
