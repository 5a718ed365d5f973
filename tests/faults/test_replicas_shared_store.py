"""The fault suite's failing peer and the budget wave with three gateway replicas (real
processes) on one PostgreSQL server that is both their ledger and their shared rate store
(`tenant_controls.shared_store` without a DSN of its own; `on_store_down: closed`, so a
request admitted at all went through the store).

- A fast-failing engine beside a healthy peer (tests/faults/test_failing_peers.py with one
  gateway): each replica learns on its own, and still at least 95 % of the requests spread
  over the three are answered whole by the peer.
- Conservation across the replicas: over the run's window the ledger's metered energy is the
  tenants' + idle + failed energy in `/admin/v1/usage`, every answered request is in the one
  ledger, written by all three replicas.
- The adversaries' budget wave (tests/integration/test_budget_attack.py with one gateway)
  with every wave spread over the three: the tenant is billed at most 5 % past its budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import yaml

from loadgen.truth.budget_wave import WavePlan, run, standing
from loadgen.truth.fleet import MODEL, EngineSpec
from loadgen.truth.fleet import gateway_config as fleet_config
from tests.faults.helpers import ADMIN, body, ep, metrics_text, post
from tests.faults.test_failing_peers import NO_EJECTION, TIMEOUTS, served_by_good
from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.gateway import raw_config
from tests.support.postgres import fresh_database, postgres_server
from tests.support.procs import free_port, running, wait_http, wattgate_cmd

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow, pytest.mark.postgres]
REPLICAS = 3
FAR_RPS = 1000.0  # a rate limit far above what is sent: admission asks the store, never refuses
ACCOUNTING = {"interval_s": 1, "settle_s": 1, "poll_s": 0.1, "flush_s": 0.3}
STORE = {"shared_store": {"on_store_down": "closed"}}


@contextlib.asynccontextmanager
async def replicas(tmp_path: Path, configs: Sequence[dict[str, Any]]
                   ) -> AsyncIterator[list[str]]:
    """One `wattgate serve` per config (its own free port), all ready; always stopped."""
    with contextlib.ExitStack() as stack:
        urls = []
        for i, raw in enumerate(configs):
            port = free_port()
            raw = {**raw, "listen": {"host": "127.0.0.1", "port": port}}
            cfg = tmp_path / f"gw{i}.yaml"
            cfg.write_text(yaml.safe_dump(raw))
            stack.enter_context(running(wattgate_cmd("serve", "--config", str(cfg)),
                                        log=tmp_path / f"gw{i}.log"))
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:  # off the loop: in-process engines answer their health checks
            await asyncio.to_thread(wait_http, url + "/readyz", 90.0)
        yield urls


async def drive(s: aiohttp.ClientSession, urls: Sequence[str], n: int, concurrency: int,
                cap_s: float = 90.0) -> list[tuple[bool, str | None]]:
    """`n` requests (streamed and not, alternately) from `concurrency` clients, client k on
    replica k mod 3 (a keep-alive client stays on one replica); (served by the peer, id)."""
    out: list[tuple[bool, str | None]] = []
    todo = iter(range(n))
    deadline = time.monotonic() + cap_s

    async def client(url: str) -> None:
        for i in todo:
            if time.monotonic() > deadline:
                return
            stream = i % 2 == 1
            status, raw, headers = await post(s, url, body(stream=stream, prompt=f"p{i % 7}"))
            out.append((served_by_good(status, raw, headers, stream),
                        headers.get("x-wattgate-request-id")))

    await asyncio.gather(*(client(urls[k % len(urls)]) for k in range(concurrency)))
    return out


async def apportioned_past(dsn: str, engines: Sequence[str], until_s: float,
                           timeout_s: float = 60.0) -> None:
    """Wait until every engine's intervals up to `until_s` are committed to the ledger."""
    deadline = time.monotonic() + timeout_s
    conn = await asyncpg.connect(dsn)
    try:
        while True:
            rows = dict(await conn.fetch("SELECT engine, next_interval FROM engine_state"))
            if all(float(rows.get(e, 0)) >= until_s + 1.0 for e in engines):
                return
            assert time.monotonic() < deadline, f"not apportioned past {until_s}: {rows}"
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def ledger_facts(dsn: str, since_s: float, until_s: float
                       ) -> tuple[float, set[str], set[str]]:
    """(metered joules of intervals in [since, until), request ids, replicas that wrote)."""
    conn = await asyncpg.connect(dsn)
    try:
        metered = await conn.fetchval(
            "SELECT COALESCE(SUM(energy_j), 0) FROM intervals WHERE start_s >= $1 "
            "AND start_s < $2", since_s, until_s)
        rows = await conn.fetch("SELECT request_id, replica FROM requests")
    finally:
        await conn.close()
    return float(metered), {r[0] for r in rows}, {r[1] for r in rows}


@pytest.mark.parametrize("mode", ["429", "garbage", "500-text"])
async def test_a_fast_failing_engine_beside_a_peer_behind_three_replicas_conserves(
        tmp_path: Path, mode: str) -> None:
    """300 requests at concurrency 9 over three replicas (least_load, ejection out of the
    way): >= 95 % answered whole by the healthy peer; the meters over the run are the
    tenants' + idle + failed energy; every answered request is in the one ledger."""
    with postgres_server() as server:
        dsn = await fresh_database(server, "replicas")
        async with fault_engine(FaultEngine(default=mode)) as bad, \
                fault_engine(FaultEngine()) as good:
            raw = raw_config([ep(bad, "bad"), ep(good, "good")], timeouts=TIMEOUTS,
                             routing={"policy": "least_load"}, outlier_detection=NO_EJECTION,
                             retries={"max_attempts": 2, "deadline_s": 10},
                             tenant_controls=STORE, accounting={
                                 **ACCOUNTING, "ledger": {"kind": "postgres", "dsn": dsn}})
            raw["tenants"][0]["limits"] = {"requests_per_second": FAR_RPS}
            since = float(math.floor(time.time()) - 5)
            async with replicas(tmp_path, [raw] * REPLICAS) as urls, \
                    aiohttp.ClientSession() as s:
                results = await drive(s, urls, 300, concurrency=9)
                until = float(math.floor(time.time()) + 1)
                statements = [metric(await metrics_text(s, u),
                                     "wattgate_tenant_rate_store_statements_total")
                              for u in urls]
                await apportioned_past(dsn, ("bad", "good"), until)
                q = f"since={since}&until={until}&group_by=tenant"
                async with s.get(f"{urls[1]}/admin/v1/usage?{q}", headers=ADMIN) as r:
                    assert r.status == 200, await r.text()
                    usage = await r.json()
                metered, ids, writers = await ledger_facts(dsn, since, until)
    share = sum(ok for ok, _ in results) / len(results)
    rows = {row["tenant"]: row["energy_j"] for row in usage["rows"]}
    print(f"{mode}: {len(results)} requests, {share:.1%} served by the peer; bad engine "
          f"tried {bad.completions} times; store statements per replica {statements}; "
          f"metered {metered:.2f} J, usage {rows}")
    assert len(results) >= 200, len(results)
    assert share >= 0.95, (share, bad.completions, good.completions)
    assert all(n > 0 for n in statements)  # every replica admitted through the store
    # conservation across the replicas: meters = tenants + idle + failed
    assert metered > 1.0
    assert usage["total"]["energy_j"] == pytest.approx(metered, rel=1e-9)
    assert math.fsum(rows.values()) == pytest.approx(metered, rel=1e-9)
    assert rows["tenant-a"] > 0.0
    answered = {rid for _, rid in results if rid is not None}
    assert len(answered) == len(results) and answered <= ids
    assert len(writers) == REPLICAS  # one ledger, written by all three


def metric(text: str, name: str) -> float:
    """A sample without labels on a /metrics page."""
    return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[1])


BUDGET_J = 1200.0  # as tests/integration/test_budget_attack.py, one gateway
OVERSHOOT = 0.05
# a wave 6 s after the last (one gateway: 4 s): its bills final before the next, or a
# whole wave is refused on the reservations still held and the run ends early
PLAN = WavePlan("neighbour", "attacker", neighbour_streams=20, neighbour_s=2.0, waves=7,
                wave=12, prompt_tokens=(9000, 12000), final_wait_s=6.0)
SPEC = EngineSpec("vllm-bf16", "bf16", "vllm")


@contextlib.contextmanager
def sim_engine(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    doc = {"defaults": {"gpu": "h100", "model": MODEL, "served_model_name": MODEL,
                        "host": "127.0.0.1", "max_batch": 256},
           "engines": [{"name": SPEC.name, "precision": SPEC.precision,
                        "dialect": SPEC.dialect, "gpu": SPEC.gpu, "port": port}]}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc))
    url = f"http://127.0.0.1:{port}"
    with running(wattgate_cmd("sim", "fleet", str(tmp_path / "fleet.yaml")), url + "/health",
                 timeout_s=60, log=tmp_path / "fleet.log"):
        yield url


async def test_the_budget_wave_spread_over_three_replicas_stays_within_the_budget(
        tmp_path: Path) -> None:
    """A neighbour's cheap streams, then the attacker's waves of 12 long-prompt streams, each
    wave spread over the three replicas at once: reservations go through the one ledger and
    are learnt from the attacker's own bills, so it is billed at most 5 % past its budget."""
    with postgres_server() as server, sim_engine(tmp_path) as engine:
        dsn = await fresh_database(server, "budget")
        far = {"requests_per_second": FAR_RPS}
        extra: dict[str, dict[str, Any]] = {
            "attacker": {"budgets": [{"period": "month", "j": BUDGET_J}], "limits": far},
            "neighbour": {"limits": far}}
        raw = fleet_config({SPEC.name: engine}, (SPEC,), ("neighbour", "attacker"),
                           tmp_path / "unused.db", 0, extra)
        raw["accounting"]["ledger"] = {"kind": "postgres", "dsn": dsn}
        raw["tenant_controls"] = STORE
        async with replicas(tmp_path, [raw] * REPLICAS) as urls:
            await asyncio.sleep(1.5)  # the meters' first readings open the interval grid
            neighbour, waves = await run(urls[0], PLAN, print, spread=urls)
            st = await standing(urls[2], "attacker")
            async with aiohttp.ClientSession() as s:
                statements = [metric(await metrics_text(s, u),
                                     "wattgate_tenant_rate_store_statements_total")
                              for u in urls]
    assert all(x.http_status == 200 for x in neighbour), [x.http_status for x in neighbour]
    statuses = [x.http_status for w in waves for x in w]
    admitted = statuses.count(200)
    overshoot = st.spent_j / BUDGET_J - 1.0
    per_replica = [sum(x.http_status == 200 for w in waves for x in w[i::REPLICAS])
                   for i in range(REPLICAS)]
    print(f"attacker: {admitted} of {len(statuses)} admitted {per_replica} by replica, "
          f"billed {st.spent_j:.1f} J against {BUDGET_J:g} J ({overshoot:+.1%}), "
          f"{st.held_j:.1f} J still reserved; store statements {statements}; learnt {st.rates}")
    assert set(statuses) <= {200, 429}
    assert admitted >= 3, "the budget let some of the attack in"
    assert st.held_j == 0
    assert overshoot <= OVERSHOOT
    assert all(n > 0 for n in statements)
    assert st.rates and all(r["prompt_tokens"] == [8192, None] for r in st.rates), st.rates
