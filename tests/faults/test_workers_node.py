"""The fault suite's failing peer and the adversaries' budget wave against one node of
`wattgate serve --workers 2` (real processes: the parent, two workers on one port, one
accounting child, one SQLite ledger), as tests/faults/test_replicas_shared_store.py checks
them with three replicas on PostgreSQL.

- A fast-failing engine beside a healthy peer: each worker learns on its own, and still at
  least 95 % of the requests, spread over both workers by the kernel, are answered whole by
  the peer; the meters over the run are the tenants' + idle + failed energy in
  `/admin/v1/usage`, and every answered request is in the node's one ledger.
- The budget wave on many connections (both workers): reservations go through the one
  ledger, so the tenant is billed at most 5 % past its budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from loadgen.truth.budget_wave import run, standing
from loadgen.truth.fleet import gateway_config as fleet_config
from tests.faults.helpers import ADMIN, ep, metrics_text
from tests.faults.test_failing_peers import NO_EJECTION, TIMEOUTS
from tests.faults.test_replicas_shared_store import (
    ACCOUNTING,
    BUDGET_J,
    OVERSHOOT,
    PLAN,
    SPEC,
    drive,
    sim_engine,
)
from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.gateway import raw_config
from tests.support.procs import free_port, running, wait_http, wattgate_cmd

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]
WORKERS = 2


@contextlib.asynccontextmanager
async def node(tmp_path: Path, raw: dict[str, Any]) -> AsyncIterator[str]:
    """One `wattgate serve --workers 2` on a free port, ready; always stopped."""
    port = free_port()
    cfg = tmp_path / "node.yaml"
    cfg.write_text(yaml.safe_dump({**raw, "listen": {"host": "127.0.0.1", "port": port}}))
    url = f"http://127.0.0.1:{port}"
    cmd = wattgate_cmd("serve", "--config", str(cfg), "--workers", str(WORKERS))
    with running(cmd, log=tmp_path / "node.log"):
        await asyncio.to_thread(wait_http, url + "/readyz", 90.0)
        # /readyz is answered by the first worker up; the kernel spreads connections only
        # over the workers listening, so wait for both
        deadline = time.monotonic() + 60.0
        async with aiohttp.ClientSession() as s:
            while len(ups := [line for line in (await metrics_text(s, url)).splitlines()
                              if line.startswith("wattgate_worker_up{")
                              and line.endswith(" 1.0")]) < WORKERS:
                assert time.monotonic() < deadline, ups
                await asyncio.sleep(0.2)
        yield url


def per_worker(text: str) -> list[float]:
    """`wattgate_worker_requests_total` of each worker, from the node's merged /metrics."""
    return [float(line.split()[-1]) for line in text.splitlines()
            if line.startswith("wattgate_worker_requests_total{")]


async def apportioned_past(db: Path, engines: Sequence[str], until_s: float,
                           timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
            rows = dict(conn.execute("SELECT engine, next_interval FROM engine_state"))
        if all(float(rows.get(e, 0)) >= until_s + 1.0 for e in engines):
            return
        assert time.monotonic() < deadline, f"not apportioned past {until_s}: {rows}"
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("mode", ["429", "garbage"])
async def test_a_fast_failing_engine_beside_a_peer_behind_two_workers_conserves(
        tmp_path: Path, mode: str) -> None:
    """300 requests from 9 clients on their own connections to one node of two workers
    (least_load, ejection out of the way): >= 95 % answered whole by the healthy peer, both
    workers served, the meters are the tenants' + idle + failed energy, every answered
    request is in the one ledger."""
    db = tmp_path / "ledger.db"
    async with fault_engine(FaultEngine(default=mode)) as bad, \
            fault_engine(FaultEngine()) as good:
        raw = raw_config([ep(bad, "bad"), ep(good, "good")], timeouts=TIMEOUTS,
                         routing={"policy": "least_load"}, outlier_detection=NO_EJECTION,
                         retries={"max_attempts": 2, "deadline_s": 10}, accounting={
                             **ACCOUNTING, "ledger": {"kind": "sqlite", "path": str(db)}})
        since = float(math.floor(time.time()) - 5)
        async with node(tmp_path, raw) as url:
            # a connector per client: each client is its own connection, as the kernel spreads
            # connections (not requests) over the workers
            sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
                        for _ in range(9)]
            try:
                results = await asyncio.gather(*(
                    drive(s, [url], 300 // len(sessions), concurrency=1) for s in sessions))
                until = float(math.floor(time.time()) + 1)
                workers = per_worker(await metrics_text(sessions[0], url))
                await apportioned_past(db, ("bad", "good"), until)
                q = f"since={since}&until={until}&group_by=tenant"
                async with sessions[0].get(f"{url}/admin/v1/usage?{q}", headers=ADMIN) as r:
                    assert r.status == 200, await r.text()
                    usage = await r.json()
            finally:
                for s in sessions:
                    await s.close()
    flat = [x for part in results for x in part]
    with contextlib.closing(sqlite3.connect(db)) as conn:
        metered = conn.execute("SELECT COALESCE(SUM(energy_j), 0) FROM intervals WHERE "
                               "start_s >= ? AND start_s < ?", (since, until)).fetchone()[0]
        ids = {r[0] for r in conn.execute("SELECT request_id FROM requests")}
    share = sum(ok for ok, _ in flat) / len(flat)
    rows = {row["tenant"]: row["energy_j"] for row in usage["rows"]}
    print(f"{mode}: {len(flat)} requests, {share:.1%} served by the peer; bad engine tried "
          f"{bad.completions} times; per worker {workers}; metered {metered:.2f} J, "
          f"usage {rows}")
    assert len(flat) >= 270, len(flat)
    assert share >= 0.95, (share, bad.completions, good.completions)
    assert len(workers) == WORKERS and all(n > 0 for n in workers), workers
    assert metered > 1.0
    assert usage["total"]["energy_j"] == pytest.approx(metered, rel=1e-9)
    assert math.fsum(rows.values()) == pytest.approx(metered, rel=1e-9)
    answered = {rid for _, rid in flat if rid is not None}
    assert len(answered) == len(flat) and answered <= ids


async def test_the_budget_wave_on_two_workers_stays_within_the_budget(tmp_path: Path) -> None:
    """The neighbour's cheap streams, then the attacker's waves of 12 long-prompt streams at
    once (each on its own connection, so both workers admit them): billed at most 5 % past
    the budget, nothing left reserved."""
    with sim_engine(tmp_path) as engine:
        extra: dict[str, dict[str, Any]] = {
            "attacker": {"budgets": [{"period": "month", "j": BUDGET_J}]}}
        raw = fleet_config({SPEC.name: engine}, (SPEC,), ("neighbour", "attacker"),
                           tmp_path / "ledger.db", 0, extra)
        async with node(tmp_path, raw) as url:
            await asyncio.sleep(1.5)  # the meters' first readings open the interval grid
            neighbour, waves = await run(url, PLAN, print)
            st = await standing(url, "attacker")
            async with aiohttp.ClientSession() as s:
                workers = per_worker(await metrics_text(s, url))
    assert all(x.http_status == 200 for x in neighbour), [x.http_status for x in neighbour]
    statuses = [x.http_status for w in waves for x in w]
    admitted = statuses.count(200)
    overshoot = st.spent_j / BUDGET_J - 1.0
    print(f"attacker: {admitted} of {len(statuses)} admitted, billed {st.spent_j:.1f} J "
          f"against {BUDGET_J:g} J ({overshoot:+.1%}); per worker {workers}; learnt {st.rates}")
    assert set(statuses) <= {200, 429}
    assert admitted >= 3, "the budget let some of the attack in"
    assert len(workers) == WORKERS and all(n > 0 for n in workers), workers
    assert st.held_j == 0
    assert overshoot <= OVERSHOOT
