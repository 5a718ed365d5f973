"""Fairness against the simulator's truth: a tenant cannot move its energy onto others by how
it ends, sizes, reads or splits its requests.

Each strategy runs for a few seconds beside an honest neighbour tenant, through a real
`wattgate serve` (accounting on, `sim` meters) in front of two simulated engines (vllm BF16,
trtllm FP8). The strategist's bills are joined to the simulator's per-request truth: it must
pay at least its truth minus 2 % of it (at most 2 % of its energy moved onto others), plus
NOISE for the busy 2-core machine.

A strategy that moves energy does so in every run; a busy machine moves it in one run now and
then (the gateway's timestamps of a request's prefill lag when its core is taken, and the
prefill's energy lands in the neighbour's time). So each strategy is judged by the majority of
up to three runs: two that pass end it, two that fail fail it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import uvloop

from loadgen.truth import join
from loadgen.truth.client import Shape
from loadgen.truth.fleet import EngineSpec, Fleet, running_fleet
from loadgen.truth.workload import Planned, drive, poisson

FAIR = 0.02  # the most of its energy a strategist may move onto others
# Run-to-run spread of a tenant's total error on this shared 2-core machine: the adversarial
# tenant of bench.accounting_truth was within -1.6 % and -0.8 % over its two 90-s runs, and
# honest tenants of these short runs within a few per cent (see the test's printout).
NOISE = 0.03
SPECS = (EngineSpec("vllm-bf16", "bf16", "vllm"), EngineSpec("trt-fp8", "fp8", "trtllm"))
SECONDS = 6.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("fleet"), ("honest", "strategist"), SPECS) as f:
        yield f


def honest() -> list[Planned]:
    """The neighbour: medium streams, about 4 per second, read to the end."""
    import random

    rnd = random.Random(11)
    return [Planned(t, Shape("honest", "honest", rnd.randint(500, 1000), rnd.randint(80, 150)))
            for t in poisson(rnd, 4.0, 0.0, SECONDS)]


def every(step_s: float, shape: Shape) -> list[Planned]:
    return [Planned(i * step_s, shape) for i in range(int(SECONDS / step_s))]


STRATEGIES: dict[str, list[Planned]] = {
    # Hang up one token short of the end: the engine did all the work.
    "drop-before-end": every(0.5, Shape("s", "strategist", 3000, 300, cancel_after=296)),
    # All prefill, one token out.
    "prefill-max-tokens-1": every(0.8, Shape("s", "strategist", 24000, 1)),
    # Many open streams decoding long outputs, read slowly.
    "slow-long-streams": [Planned(0.1 * i, Shape("s", "strategist", 200, 600, read_pause_s=0.02))
                          for i in range(16)],
    # One 3,000-token job sent as 20 requests of 150 tokens at once, every second.
    "split-into-small": [Planned(t + 0.005 * i, Shape("s", "strategist", 150, 20))
                         for t in range(int(SECONDS)) for i in range(20)],
    # Several completions per request.
    "n-greater-than-1": every(0.5, Shape("s", "strategist", 500, 100, n=4)),
}


def run_strategy(f: Fleet, plan: list[Planned]) -> dict[str, tuple[float, float, int]]:
    """tenant -> (billed J, truth J, requests) over the run's final bills."""
    async def go() -> list[join.Joined]:
        sent = await drive(f.gateway_url, plan, print, deadline_s=SECONDS + 60)
        return await join.join(f.gateway_url, f.engine_urls, sent, 30.0, print)

    rows = uvloop.run(go())
    assert rows and all(r.final for r in rows), "every bill final"
    out = {}
    for tenant in ("honest", "strategist"):
        mine = [r for r in rows if r.sent.shape.tenant == tenant]
        out[tenant] = (math.fsum(r.bill_j for r in mine), math.fsum(r.truth_j for r in mine),
                       len(mine))
    return out


def verdict(strategy: str, totals: dict[str, tuple[float, float, int]]) -> str | None:
    """None when the strategist paid its share, or why not."""
    for tenant, (bill_j, truth_j, n) in totals.items():
        err = (bill_j - truth_j) / truth_j if truth_j else math.nan
        print(f"{strategy}: {tenant:10} n={n:3} billed {bill_j:9.1f} J truth {truth_j:9.1f} J "
              f"error {err:+.2%}")
    bill_j, truth_j, _ = totals["strategist"]
    if truth_j == 0.0:
        # The engine refused the strategy (the simulator serves n = 1 only): nothing ran, so
        # nothing may be billed, and the neighbour pays no more than its own truth allows.
        hb, ht, _ = totals["honest"]
        if bill_j != 0.0:
            return f"{strategy}: refused, yet billed {bill_j:.1f} J"
        if hb > ht * (1 + FAIR + NOISE):
            return f"{strategy}: refused, and the neighbour billed {hb:.1f} J for {ht:.1f} J"
        return None
    if bill_j < truth_j * (1 - FAIR - NOISE):
        return (f"{strategy}: billed {bill_j:.1f} J against {truth_j:.1f} J of truth "
                f"({(bill_j - truth_j) / truth_j:+.2%}): energy moved onto the neighbour")
    return None


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_strategist_pays_at_least_its_truth_minus_two_percent(fleet: Fleet, strategy: str
                                                              ) -> None:
    plan = sorted([*honest(), *STRATEGIES[strategy]], key=lambda p: p.at_s)
    passed, failures = 0, list[str]()
    while passed < 2 and len(failures) < 2:
        why = verdict(strategy, run_strategy(fleet, plan))
        if why is None:
            passed += 1
        else:
            failures.append(why)
    assert passed == 2, "; ".join(failures)
