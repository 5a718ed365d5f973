"""Three gateway processes keep their tenants' rate limits in one PostgreSQL store
(`tenant_controls.shared_store`), in front of a fake engine. Clients send twice the limit:
one keep-alive client on one replica, then traffic spread 80/10/10, are each admitted what
one token bucket of the limit admits (full, then refilled at the limit) within 2 %; with
each replica enforcing limit / 3 instead the first would get a third. Then the store is
stopped mid-run: `on_store_down: open` admits at limit / 3 per replica and recovers when the
store is back; `closed` answers 503 `rate_limit_store_unavailable`."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
import yaml

from tests.support.fake_engine import FakeEngine, fake_engine
from tests.support.gateway import KEY_A, KEY_B, digest, raw_config
from tests.support.postgres import PostgresServer, postgres
from tests.support.procs import free_port, running, stop, wait_http, wattgate_cmd

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow, pytest.mark.postgres]
LIMIT = 40.0  # requests per second, each tenant
OFFERED = 2 * LIMIT
KEY_C = "sk-test-tenant-c"
KEY_D = "sk-test-tenant-d"
FAR_LIMIT = 1000.0  # tenant-d: far above what is sent
BODY = orjson.dumps({"model": "m", "prompt": "hello", "max_tokens": 2})


@dataclass(frozen=True, slots=True)
class Sent:
    replica: int
    sent_s: float
    done_s: float
    status: int
    code: str


def gateway_configs(tmp_path: Path, engine_url: str, dsn: str, on_store_down: str
                    ) -> Iterator[tuple[Path, int]]:
    for i in range(3):
        port = free_port()
        raw = raw_config([{"name": "e1", "url": engine_url, "precision": "int4"}],
                         listen={"host": "127.0.0.1", "port": port},
                         tenant_controls={"shared_store": {"dsn": dsn,
                                                           "on_store_down": on_store_down}})
        raw["tenants"][0]["limits"] = {"requests_per_second": LIMIT}
        raw["tenants"][1]["limits"] = {"requests_per_second": LIMIT}
        raw["tenants"].append({"name": "tenant-c", "api_key_sha256": digest(KEY_C),
                               "slo_class": "batch",
                               "limits": {"requests_per_second": LIMIT}})
        raw["tenants"].append({"name": "tenant-d", "api_key_sha256": digest(KEY_D),
                               "slo_class": "batch",
                               "limits": {"requests_per_second": FAR_LIMIT}})
        cfg = tmp_path / f"gw{i}-{on_store_down}.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        yield cfg, port


@contextlib.asynccontextmanager
async def replicas(tmp_path: Path, server: PostgresServer, on_store_down: str
                   ) -> AsyncIterator[tuple[list[str], list[subprocess.Popen[bytes]]]]:
    async with fake_engine(FakeEngine(model="m", tokens=2)) as eng:
        with contextlib.ExitStack() as stack:
            urls, procs = [], []
            for i, (cfg, port) in enumerate(gateway_configs(tmp_path, eng.url, server.dsn,
                                                            on_store_down)):
                procs.append(stack.enter_context(running(
                    wattgate_cmd("serve", "--config", str(cfg)),
                    log=tmp_path / f"gw{i}-{on_store_down}.log")))
                urls.append(f"http://127.0.0.1:{port}")
            for url in urls:  # off the loop: the engine answers their health checks
                await asyncio.to_thread(wait_http, url + "/readyz", 90.0)
            yield urls, procs


async def send(s: aiohttp.ClientSession, url: str, key: str, replica: int) -> Sent:
    sent_s = time.monotonic()
    async with s.post(url + "/v1/completions", data=BODY,
                      headers={"Authorization": f"Bearer {key}",
                               "Content-Type": "application/json"}) as r:
        body = await r.read()
        code = "" if r.status == 200 else orjson.loads(body)["error"]["code"]
    return Sent(replica, sent_s, time.monotonic(), r.status, code)


async def traffic(sessions: Sequence[aiohttp.ClientSession], urls: Sequence[str], key: str,
                  weights: Sequence[int], duration_s: float) -> list[Sent]:
    """OFFERED requests a second in all, on a fixed schedule (open loop), replica i getting
    weights[i] of every sum(weights), each over its own keep-alive session."""
    plan = [i for i, w in enumerate(weights) for _ in range(w)]
    start = time.monotonic()
    tasks = []
    for k in range(int(OFFERED * duration_s)):
        delay = start + k / OFFERED - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        i = plan[k % len(plan)]
        tasks.append(asyncio.ensure_future(send(sessions[i], urls[i], key, i)))
    return list(await asyncio.gather(*tasks))


def sessions(n: int) -> list[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=30)
    return [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32), timeout=timeout)
            for _ in range(n)]


def check_one_bucket(got: list[Sent], name: str) -> None:
    """Admitted: what a full bucket of LIMIT refilled at LIMIT/s admits over the run (the
    run's span by send times, and by the last answer: a replica running late admits later)."""
    assert {g.status for g in got} <= {200, 429}, {g.code for g in got}
    admitted = sum(g.status == 200 for g in got)
    first = min(g.sent_s for g in got)
    low = LIMIT * (1 + max(g.sent_s for g in got) - first)
    high = LIMIT * (1 + max(max(g.sent_s for g in got),
                            max(g.done_s for g in got if g.status == 200)) - first)
    per = [sum(g.status == 200 for g in got if g.replica == i) for i in range(3)]
    print(f"{name}: {len(got)} sent, admitted {admitted} {per}; one bucket of the limit "
          f"admits {low:.1f} (by the last send) to {high:.1f} (by the last answer)")
    assert 0.98 * low <= admitted <= 1.02 * high


async def test_three_replicas_on_one_store_admit_the_limit_and_fail_open(tmp_path: Path
                                                                         ) -> None:
    with postgres() as server:
        async with replicas(tmp_path, server, "open") as (urls, _):
            clients = sessions(3)
            try:
                await far_from_the_limit(clients[0], urls[0])
                # one keep-alive client on one replica: its full limit, not a third of it
                check_one_bucket(await traffic(clients, urls, KEY_A, [1, 0, 0], 4.0),
                                 "one client on one replica")
                check_one_bucket(await traffic(clients, urls, KEY_B, [8, 1, 1], 4.0),
                                 "spread 80/10/10")
                await store_down_open(server, clients, urls)
            finally:
                for c in clients:
                    await c.close()


async def far_from_the_limit(client: aiohttp.ClientSession, url: str) -> None:
    """Requests far below the limit are admitted from the replica's lease: past a client's
    start (its rate is known within 100 ms) they do not wait for the store."""
    await traffic([client], [url], KEY_D, [1], 0.5)  # the start
    waits = await metric(client, url, "wattgate_tenant_rate_lease_waits_total")
    statements = await metric(client, url, "wattgate_tenant_rate_store_statements_total")
    got = await traffic([client], [url], KEY_D, [1], 2.0)
    assert {g.status for g in got} == {200}
    waits = await metric(client, url, "wattgate_tenant_rate_lease_waits_total") - waits
    statements = await metric(client, url,
                              "wattgate_tenant_rate_store_statements_total") - statements
    print(f"far from the limit: {len(got)} requests, {waits:.0f} waited for a lease; "
          f"{statements:.0f} statements to the store (heartbeats included)")
    assert waits <= 2  # a top-up slower than half a lease (50 ms) on a loaded machine
    assert statements < len(got) / 4


async def metric(s: aiohttp.ClientSession, url: str, name: str) -> float:
    async with s.get(url + "/metrics") as r:
        text = await r.text()
    return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[1])


async def store_down_open(server: PostgresServer, clients: list[aiohttp.ClientSession],
                          urls: list[str]) -> None:
    await traffic(clients, urls, KEY_C, [8, 1, 1], 1.0)
    server.stop()
    got = await traffic(clients, urls, KEY_C, [8, 1, 1], 3.0)
    assert {g.status for g in got} == {200, 429}
    span_s = max(g.sent_s for g in got) - min(g.sent_s for g in got)
    per = [sum(g.status == 200 for g in got if g.replica == i) for i in range(3)]
    sent = [sum(g.replica == i for g in got) for i in range(3)]
    share = LIMIT / 3  # each replica's own bucket: full, then refilled at its share
    print(f"store down (open): admitted {per} of {sent} over {span_s:.2f} s; a share "
          f"admits {share * (1 + span_s):.1f}")
    # the busy replica: its share (and at most a lease it held when the store went down)
    assert share * (1 + span_s) * 0.95 <= per[0] <= share * (1 + span_s) * 1.05 + 2
    assert per[1:] == sent[1:]  # the others are under their share
    for url in urls:
        assert await store_up(clients[0], url) == 0.0
    server.start()
    deadline = time.monotonic() + 30.0
    while not all([await store_up(clients[0], url) == 1.0 for url in urls]):
        assert time.monotonic() < deadline, "the replicas did not reach the store again"
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # the bucket refills from what the outage left
    check_one_bucket(await traffic(clients, urls, KEY_C, [1, 1, 1], 3.0), "store back")


async def store_up(s: aiohttp.ClientSession, url: str) -> float:
    return await metric(s, url, "wattgate_tenant_rate_store_up")


async def test_store_down_closed_refuses_rate_limited_requests_with_503(tmp_path: Path
                                                                        ) -> None:
    with postgres() as server:
        async with replicas(tmp_path, server, "closed") as (urls, procs):
            clients = sessions(3)
            try:
                before = await traffic(clients, urls, KEY_A, [1, 1, 1], 1.0)
                assert {g.status for g in before} <= {200, 429}
                assert sum(g.status == 200 for g in before) >= LIMIT
                server.stop()
                got = await traffic(clients, urls, KEY_A, [1, 1, 1], 2.0)
                late = [g for g in got if g.sent_s > min(x.sent_s for x in got) + 0.5]
                print(f"store down (closed): {[(g.status, g.code) for g in got[:5]]} ...; "
                      f"after 0.5 s: {sorted({(g.status, g.code) for g in late})}")
                assert {(g.status, g.code) for g in late} == {
                    (503, "rate_limit_store_unavailable")}
                body = await error_of(clients[0], urls[0], KEY_A)
                assert body["type"] == "service_unavailable" and "retry" in body["message"]
                server.start()
                deadline = time.monotonic() + 30.0
                while (await send(clients[1], urls[1], KEY_A, 1)).status != 200:
                    assert time.monotonic() < deadline, "still refused with the store back"
                    await asyncio.sleep(0.2)
                await asyncio.to_thread(stop, procs[2])  # SIGTERM: a graceful stop
                assert procs[2].returncode == 0
                assert await live_replicas(server.dsn) == 2  # it left the live ones
            finally:
                for c in clients:
                    await c.close()


async def error_of(s: aiohttp.ClientSession, url: str, key: str) -> dict[str, Any]:
    async with s.post(url + "/v1/completions", data=BODY,
                      headers={"Authorization": f"Bearer {key}",
                               "Content-Type": "application/json"}) as r:
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        return dict(orjson.loads(await r.read())["error"])


async def live_replicas(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM rate_limit_replicas"))
    finally:
        await conn.close()
