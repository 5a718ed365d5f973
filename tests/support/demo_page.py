"""A demo report built from made-up runs in a second (loadgen/demo.py's own page writer, fed
with synthetic results), for tests of what the page shows and where."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from core.quality import published
from core.vocab import SloClass
from loadgen import demo, energy, run_summary
from loadgen import demo_precision as dp
from loadgen.capacity import SearchConfig
from loadgen.client import Target
from loadgen.decide import decide
from loadgen.results import RequestResult
from loadgen.runner import RunOutcome
from loadgen.search_report import SearchReport
from tests.unit.test_loadgen_decide import arm

# (precision, joules) per request; 4 output tokens each
LEAST_LOAD = [("bf16", 2.0), ("fp8", 2.4), ("int8", 1.8)] * 20
SLO_ENERGY = [("bf16", 1.6), ("int8", 1.5), ("int8", 1.5)] * 20
IDLE_J = 5432.0


def _result(i: int, tenant: str) -> RequestResult:
    first = 0.1 * i + 0.05
    reads = tuple((first + 0.01 * k, 1) for k in range(4))
    return RequestResult(i, tenant, "interactive", 0.1 * i, 0.1 * i, first, reads[-1][0], reads,
                         20, 4, "ok", 200, f"gw-{i}")


def outcome(label: str, served: Sequence[tuple[str, float]],
            tenants: Sequence[str] = ("acme",)) -> RunOutcome:
    results = [_result(i, tenants[i % len(tenants)]) for i in range(len(served))]
    rows = {f"gw-{i}": energy.EnergyRow(f"gw-{i}", r.tenant, "m", f"h100-{p}", p, 20, 4, j, j / 1e4,
                                        j / 1e6, final=True, estimated=False)
            for i, ((p, j), r) in enumerate(zip(served, results, strict=True))}
    fetch = energy.EnergyFetch(rows, 0, 0, "")
    summary, per_request = run_summary.summarize(
        results, lambda _: SloClass("interactive", ttft_s=0.5, tpot_s=0.05),
        requested_rate_rps=10.0, label=label)
    return RunOutcome(label, Target("http://127.0.0.1:1", "m"), summary, per_request, fetch,
                      energy.overall_energy(fetch, results),
                      energy.group_energy(fetch, results, "tenant"),
                      energy.group_energy(fetch, results, "precision"))


def results() -> demo.DemoResults:
    arms = [dataclasses.replace(arm(f"{p} (vllm)", cap, j), quality=published(p))
            for p, cap, j in (("bf16", 100.0, 0.30), ("fp8", 100.0, 0.20), ("int8", 100.0, 0.25),
                              ("int4", 100.0, 0.10))]
    decision = decide(arms, None, "TTFT <= 500 ms and TPOT <= 9 ms (engine time)", 0.9,
                      "req/s (engine time)", dp.MIN_QUALITY)
    search = SearchReport(tuple(arms), decision, SearchConfig(25.0, 400.0),
                          "TTFT <= 500 ms and TPOT <= 9 ms (engine time)", dp.BASE)
    tenants = outcome("tenants", [("fp8", 2.0), ("int4", 1.0), ("bf16", 3.0)] * 10,
                      ("acme", "globex", "initech"))
    routing = dp.RoutingRuns([outcome("least_load", LEAST_LOAD),
                              outcome("slo_energy", SLO_ENERGY)],
                             {"least_load": 12.0, "slo_energy": 110.0})
    return demo.DemoResults(tenants, [], search, [], routing, IDLE_J)


def write(out_dir: Path) -> Path:
    """demo.html (and .json, .csv) under `out_dir`, as `wattgate demo` writes them."""
    demo.show(results(), out_dir)
    return out_dir / "demo.html"
