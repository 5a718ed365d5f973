"""A tenant's rate limit holds for the whole node under `wattgate serve --workers 2`: the
workers lease from the parent's buckets (gateway/workers/rates.py). Twice the limit is sent
over a new connection per request (the kernel spreads them over both workers), then over one
keep-alive connection (one worker): each is admitted what one token bucket of the limit
admits within 2 %, where each worker on its own would admit up to twice that. A joule budget
and a concurrency cap, kept in the ledger, hold over both workers too."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.integration.test_rate_limit_shared_store import LIMIT, check_one_bucket, traffic
from tests.integration.test_tenant_budget_replicas import BUDGET_J, CAP, one
from tests.support.fake_engine import FakeEngine, fake_engine
from tests.support.gateway import KEY_A, KEY_B, raw_config
from tests.support.procs import free_port, running, wait_http, wattgate_cmd

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@contextlib.asynccontextmanager
async def node(tmp_path: Path) -> AsyncIterator[str]:
    async with fake_engine(FakeEngine(model="m", tokens=2)) as eng:
        port = free_port()
        raw = raw_config([{"name": "e1", "url": eng.url, "precision": "int4"}],
                         listen={"host": "127.0.0.1", "port": port})
        raw["tenants"][0]["limits"] = {"requests_per_second": LIMIT}
        raw["tenants"][1]["limits"] = {"requests_per_second": LIMIT}
        cfg = tmp_path / "gw.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        url = f"http://127.0.0.1:{port}"
        with running(wattgate_cmd("serve", "--workers", "2", "--config", str(cfg)),
                     log=tmp_path / "gw.log"):
            await both_workers_up(url)
            yield url


async def both_workers_up(url: str) -> None:
    """Both workers serve (the first to listen answers /readyz before the second binds)."""
    await asyncio.to_thread(wait_http, url + "/readyz", 90.0)
    deadline = time.monotonic() + 60.0
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(url + "/metrics") as r:
                up = [line for line in (await r.text()).splitlines()
                      if line.startswith("wattgate_worker_up{")]
            if len(up) == 2 and all(line.endswith(" 1.0") for line in up):
                # a worker's series answer just before it binds the port
                await asyncio.sleep(0.5)
                return
            assert time.monotonic() < deadline, f"workers not both up: {up}"
            await asyncio.sleep(0.2)


def session(*, keep_alive: bool) -> aiohttp.ClientSession:
    connector = (aiohttp.TCPConnector(limit=1) if keep_alive
                 else aiohttp.TCPConnector(force_close=True, limit=64))
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30))


async def workers_served(client: aiohttp.ClientSession, url: str) -> list[float]:
    async with client.get(url + "/metrics") as r:
        text = await r.text()
    return [float(line.split()[1]) for line in text.splitlines()
            if line.startswith("wattgate_worker_requests_total{")]


async def test_a_tenant_is_admitted_its_node_limit_over_two_workers(tmp_path: Path) -> None:
    async with node(tmp_path) as url:
        spread, pinned = session(keep_alive=False), session(keep_alive=True)
        try:
            got = await traffic([spread], [url], KEY_A, [1], 4.0)
            served = await workers_served(spread, url)
            assert len(served) == 2 and min(served) > 0, served  # both workers took some
            check_one_bucket(got, "new connections over two workers")
            check_one_bucket(await traffic([pinned], [url], KEY_B, [1], 4.0),
                             "one keep-alive connection")
        finally:
            await spread.close()
            await pinned.close()


async def test_a_budget_and_a_concurrency_cap_hold_over_two_workers_on_sqlite(
        tmp_path: Path) -> None:
    """The burst of the three-replica budget test at one node of two workers sharing a SQLite
    ledger: exactly the budget's 20 reservations admitted, tenant-b's cap of 5 in flight
    held across both workers (admissions are SQLite write transactions from two processes)."""
    async with fake_engine(FakeEngine(model="m", ttft_s=5.0)) as eng:
        port = free_port()
        raw = raw_config([{"name": "e1", "url": eng.url, "precision": "bf16"},
                          {"name": "e2", "url": eng.url, "precision": "int4"}],
                         listen={"host": "127.0.0.1", "port": port})
        raw["tenants"][0]["budgets"] = [{"period": "day", "j": BUDGET_J}]
        raw["tenants"][0]["precisions"] = {"allowed": ["bf16"]}
        raw["tenants"][1]["limits"] = {"max_concurrent": CAP}
        raw["accounting"] = {"interval_s": 1, "flush_s": 0.2, "settle_s": 1.0,
                             "ledger": {"kind": "sqlite", "path": str(tmp_path / "ledger.db")}}
        cfg = tmp_path / "gw.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        url = f"http://127.0.0.1:{port}"
        with running(wattgate_cmd("serve", "--workers", "2", "--config", str(cfg)),
                     log=tmp_path / "gw.log"):
            await both_workers_up(url)
            connector = aiohttp.TCPConnector(limit=0, force_close=True)
            async with aiohttp.ClientSession(
                    connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as s:
                burst = [one(s, url) for _ in range(200)]
                burst += [one(s, url, KEY_B) for _ in range(30)]
                got_all = await asyncio.gather(*burst)
                served = await workers_served(s, url)
    got, got_b = got_all[:200], got_all[200:]
    assert len(served) == 2 and min(served) > 0, served  # the burst reached both workers
    assert sum(1 for status, _ in got if status == 200) == 20
    assert {code for status, code in got if status != 200} == {"budget_exceeded"}
    assert sorted(status for status, _ in got_b) == [200] * CAP + [429] * (30 - CAP)
