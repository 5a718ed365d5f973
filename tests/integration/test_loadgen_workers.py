"""Several client processes share one schedule: the plan is dealt round-robin, all workers start
on one monotonic t0, and the merged results come back in plan order."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.config import SloClass
from loadgen import lengths, run_summary
from loadgen.arrivals import Constant
from loadgen.client import Target
from loadgen.workers import deal, run_workers
from loadgen.workload import TenantSpec, Workload, build_plan
from tests.support.procs import free_port, running, wattgate_cmd


@pytest.fixture
def engine() -> Iterator[str]:
    port = free_port()
    with running(wattgate_cmd("loadgen", "selftest-engine", "--port", str(port), "--ttft-ms",
                              "5"), f"http://127.0.0.1:{port}/health"):
        yield f"http://127.0.0.1:{port}"


def test_deal_splits_round_robin_and_keeps_every_request_once() -> None:
    w = Workload("m", (TenantSpec("t"),), Constant(100.0), duration_s=1.0)
    plan = build_plan(w)
    parts = deal(plan, 3)
    assert [len(p) for p in parts] == [34, 33, 33]
    assert sorted(r.index for p in parts for r in p) == list(range(100))
    assert all(p[i].intended_s < p[i + 1].intended_s for p in parts for i in range(len(p) - 1))


@pytest.mark.timeout(90)
def test_two_worker_processes_run_one_schedule_on_a_shared_clock(engine: str) -> None:
    w = Workload("m", (TenantSpec("t", prompt_tokens=lengths.fixed(8),
                                  output_tokens=lengths.fixed(4), slo_class="s"),),
                 Constant(100.0), duration_s=1.0, slo_classes=(SloClass("s", ttft_s=0.5),))
    plan = build_plan(w)
    results, _ = run_workers(plan, Target(engine, "m"), 2)
    assert [r.index for r in results] == list(range(len(plan)))
    assert all(r.ok for r in results)
    # Sends follow the one schedule: intended times are the plan's, lag stays small.
    assert [r.intended_s for r in results] == [r.intended_s for r in plan]
    # a busy machine may lag the sends: bounded generously, never a failure of the schedule
    s, _ = run_summary.summarize(results, w.slo, requested_rate_rps=100.0, lag_threshold_s=10.0)
    assert s.graded and s.lag_s.p50 < 0.25
    assert s.achieved_rate_rps == pytest.approx(100.0, rel=0.5)
