"""Three gateway processes sharing one PostgreSQL ledger hold one tenant's budget together:
200 requests released at once, spread over the three, at a tenant whose joule budget has
room for 20 reservations (and, in the same burst, 30 at a tenant capped at 5 in flight).
Exactly 20 are admitted (reservations are inserted under a per-tenant advisory lock, so no
two replicas admit against the same room), the rest get 429 budget_exceeded, and the
ledger's charges for the admitted requests are printed against the budget (the overshoot
docs/operations.md states)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from tests.support.fake_engine import FakeEngine, fake_engine
from tests.support.gateway import ADMIN_KEY, KEY_A, KEY_B, raw_config
from tests.support.postgres import fresh_database, postgres_server
from tests.support.procs import free_port, running, wait_http, wattgate_cmd

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow, pytest.mark.postgres]
# "hello" is 2 prompt tokens by the byte estimate; with max_tokens 48, the BF16 prior (0.05 J
# a prompt token, 2.2 J an output token) reserves 105.7 J. 2,150 J has room for 20 (2,114 J),
# not 21.
BUDGET_J = 2150.0
BODY = {"model": "m", "prompt": "hello", "max_tokens": 48}
CAP = 5


async def one(s: aiohttp.ClientSession, url: str, key: str = KEY_A) -> tuple[int, str]:
    async with s.post(url + "/v1/completions", data=orjson.dumps(BODY),
                      headers={"Authorization": f"Bearer {key}",
                               "Content-Type": "application/json"}) as r:
        body = await r.read()
        code = orjson.loads(body)["error"]["code"] if r.status != 200 else ""
        return r.status, code


async def test_three_replicas_hold_one_budget_under_a_burst_of_200(tmp_path: Path) -> None:
    with postgres_server() as server:
        dsn = await fresh_database(server, "budgets")
        async with fake_engine(FakeEngine(model="m", ttft_s=5.0)) as eng:
            ports = [free_port() for _ in range(3)]
            with contextlib.ExitStack() as stack:
                for i, port in enumerate(ports):
                    raw = raw_config([{"name": "e1", "url": eng.url, "precision": "bf16"},
                                      {"name": "e2", "url": eng.url, "precision": "int4"}],
                                     listen={"host": "127.0.0.1", "port": port})
                    raw["tenants"][0]["budgets"] = [{"period": "day", "j": BUDGET_J}]
                    raw["tenants"][0]["precisions"] = {"allowed": ["bf16"]}
                    raw["tenants"][1]["limits"] = {"max_concurrent": CAP}
                    raw["accounting"] = {"interval_s": 1, "flush_s": 0.2, "settle_s": 1.0,
                                         "ledger": {"kind": "postgres", "dsn": dsn}}
                    cfg = tmp_path / f"gw{i}.yaml"
                    cfg.write_text(yaml.safe_dump(raw))
                    stack.enter_context(running(
                        wattgate_cmd("serve", "--config", str(cfg)),
                        log=tmp_path / f"gw{i}.log"))
                urls = [f"http://127.0.0.1:{p}" for p in ports]
                for url in urls:  # off the loop: the engine answers their health checks
                    await asyncio.to_thread(wait_http, url + "/readyz", 90.0)
                connector = aiohttp.TCPConnector(limit=0, force_close=True)
                timeout = aiohttp.ClientTimeout(total=120)
                async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
                    burst = [one(s, urls[i % 3]) for i in range(200)]
                    burst += [one(s, urls[i % 3], KEY_B) for i in range(30)]
                    got_all = await asyncio.gather(*burst)
                    got, got_b = got_all[:200], got_all[200:]
                    spent = await charged(s, urls[0])
    admitted = sum(1 for status, _ in got if status == 200)
    refused = [code for status, code in got if status == 429]
    print(f"admitted {admitted}, refused {len(refused)}; charged {spent:.1f} J of a "
          f"{BUDGET_J:.0f} J budget ({100 * (spent - BUDGET_J) / BUDGET_J:+.1f} %)")
    assert admitted == 20
    assert len(refused) == 180 and set(refused) == {"budget_exceeded"}
    # tenant-b's cap of 5 requests in flight holds over the three processes too
    assert sorted(status for status, _ in got_b) == [200] * CAP + [429] * (30 - CAP)
    assert {code for status, code in got_b if status == 429} == {"rate_limit_exceeded"}


async def charged(s: aiohttp.ClientSession, url: str) -> float:
    """tenant-a's charges in the ledger once its requests are final (no reservation held)."""
    deadline = time.monotonic() + 60.0
    budget: dict[str, Any] = {}
    while time.monotonic() < deadline:
        async with s.get(url + "/v1/usage", headers={"Authorization": f"Bearer {KEY_A}"}) as r:
            budget = (await r.json())["budgets"][0]
        if budget["held"] == 0 and budget["spent"] > 0:
            break
        await asyncio.sleep(0.5)
    async with s.get(url + "/admin/v1/usage?tenant=tenant-a",
                     headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as r:
        bill = (await r.json())["total"]["energy_j"]
    assert budget["spent"] == pytest.approx(bill, rel=1e-6)
    return float(budget["spent"])
