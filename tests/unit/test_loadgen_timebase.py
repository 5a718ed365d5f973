"""One time base per table and plot: a scaled run's tables are in engine time and say so; the
search report names its base in its header, method and plot axes."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from loadgen import report, report_html
from loadgen import search_report as sr
from loadgen.capacity import SearchConfig, Trial, search_capacity
from loadgen.decide import ArmResult, decide
from loadgen.timebase import WALL, TimeBase
from tests.unit.test_loadgen_report import outcome

SCALED = TimeBase(0.1)


def test_run_rows_are_in_the_named_time_base() -> None:
    o = outcome(0)
    wall = dict(zip(report.RUN_HEADER, report.run_rows([o], WALL)[0], strict=True))
    eng = dict(zip(report.RUN_HEADER, report.run_rows([o], SCALED)[0], strict=True))
    assert float(eng["TTFT p50"]) == float(wall["TTFT p50"]) * 0.1  # 50 ms wall -> 5 ms
    assert float(eng["req/s"]) == pytest.approx(float(wall["req/s"]) * 10, rel=1e-3)
    assert eng["lag p99"] == wall["lag p99"]  # the client's own clock
    assert "time base: engine time (simulator time_scale 0.1)" in report.run_table([o], base=SCALED)
    assert "time base: wall time" in report.run_table([o])


def search_report_of(base: TimeBase) -> sr.SearchReport:
    async def run_at(rate_rps: float, seed: int) -> Trial:
        cap = 100 * (1 + 0.02 * random.Random(seed).gauss(0, 1))
        return Trial(seed, max(0.0, 1 - 0.1 * (rate_rps / cap) ** 6), 0.3 - rate_rps / 1e3)

    cfg = SearchConfig(start_rps=25.0, max_rps=400.0)
    res = asyncio.run(search_capacity(run_at, cfg))
    arms = (ArmResult("bf16 (vllm)", "bf16", "vllm", res),)
    d = decide(arms, None, "TPOT <= 9 ms", 0.9, "req/s")
    return sr.SearchReport(arms, d, cfg, "TPOT <= 9 ms (engine time)", base)


def test_search_report_names_its_time_base_everywhere(tmp_path: Path) -> None:
    r = search_report_of(SCALED)
    text = sr.text(r)
    assert "SLO capacity (req/s, engine time) [95 % CI]" in text
    assert "Time base: engine time (simulator time_scale 0.1)" in text
    assert "bf16 (vllm): 25: " in text  # the load curve, one line per arm
    html = report_html.search_section(r)
    assert "offered rate (req/s, engine time (simulator time_scale 0.1))" in html
    doc = sr.to_json(r)
    assert doc["time_base"] == "engine time (simulator time_scale 0.1)"
    assert doc["arms"][0]["capacity_interval"]["method"].startswith("95 % Student t")
    report_html.write_html(tmp_path / "r.html", "t", [outcome(0)], search=r, base=SCALED)
    page = (tmp_path / "r.html").read_text()
    assert "Recommended: bf16 (vllm)." in page and "ms, engine time" in page
