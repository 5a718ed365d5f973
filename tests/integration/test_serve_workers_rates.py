"""A tenant's rate limit holds for the whole node under `wattgate serve --workers 2`: the
workers lease from the parent's buckets (gateway/workers/rates.py). Twice the limit is sent
over a new connection per request (the kernel spreads them over both workers), then over one
keep-alive connection (one worker): each is admitted what one token bucket of the limit
admits within 2 %, where each worker on its own would admit up to twice that."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.integration.test_rate_limit_shared_store import LIMIT, check_one_bucket, traffic
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
            await asyncio.to_thread(wait_http, url + "/readyz", 90.0)
            yield url


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
