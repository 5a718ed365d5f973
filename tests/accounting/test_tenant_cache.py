"""The apportioner's tenant cache holds the requests not yet final, not a fixed count of the
latest, and one string per tenant."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from accounting.ledger.sqlite import SqliteLedger
from accounting.ledger.tenant_cache import TenantCache
from tests.accounting.test_accounting_accuracy import T0_WALL, run_engine
from tests.accounting.test_ledger_sqlite import Clock, conservation, make_service

pytestmark = pytest.mark.timeout(120)


def test_settling_drops_the_final_generation_and_its_cuts() -> None:
    cache = TenantCache()
    for i in range(100):
        cache.add(f"a{i}", "".join(["ten", "ant-a"]), finished_s=100.0 + i,
                  cut_s=5.0 if i == 7 else None)
    cache.settle(1000.0)  # the old generation is empty: the young one becomes old
    for i in range(50):
        cache.add(f"b{i}", "tenant-b", finished_s=300.0 + i)
    assert cache.get("a7", "") == "tenant-a" and cache.cut("a7", 0.0) == 5.0
    cache.settle(150.0)  # some of the a's are not final yet: nothing goes
    assert len(cache) == 150
    cache.settle(200.0 + 0.5)  # every a finished before: they go, with their cuts
    assert len(cache) == 50
    assert cache.get("a7", "?") == "?" and cache.cut("a7", 0.0) == 0.0
    assert cache.missing(["a1", "b1"]) == ["a1"]
    b = [cache.get(f"b{i}", "") for i in range(50)]
    assert all(t is b[0] for t in b) and b[0] is sys.intern("tenant-b")


def test_a_generation_that_never_settles_is_capped() -> None:
    cache = TenantCache(limit_n=1000)
    for i in range(10_000):
        cache.add(f"r{i}", "t", finished_s=float(i))
        assert len(cache) <= 2000
    assert cache.get("r9999", "") == "t"


async def test_the_cache_holds_what_is_not_final_during_a_run(tmp_path: Path) -> None:
    run = run_engine(3, duration_s=60.0)
    clock = Clock(T0_WALL)
    svc = make_service(SqliteLedger(tmp_path / "l.db"), run, clock)
    await svc.ledger.open()
    cache: TenantCache = svc.ledger._tenant_cache  # type: ignore[attr-defined]
    recs = sorted(run.records, key=lambda r: r.wall(r.finished_s))
    held = []
    i = 0
    while clock.t < run.readings[-1][0]:
        clock.t += 0.25
        while i < len(recs) and recs[i].wall(recs[i].finished_s) <= clock.t:
            svc.record(recs[i])
            i += 1
        await svc.step()
        held.append(len(cache))
    assert len(recs) > 300
    # about two windows of requests between finishing and being apportioned (settle_s 2,
    # flush 0.5, requests in flight held), not every request of the run
    assert max(held) < len(recs) / 3
    intervals_j, shares_idle_j, _, _ = await conservation(svc.ledger)
    assert shares_idle_j == pytest.approx(intervals_j, rel=1e-9)
    await svc.stop()
