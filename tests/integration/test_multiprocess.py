"""Three gateway processes on one port (SO_REUSEPORT), one PostgreSQL ledger, one simulated
fleet. One gateway is SIGKILLed mid-run. Checks: traffic keeps flowing, every interval is
apportioned exactly once, tenants' shares + idle == each interval's measured energy, the
ledger's energy over the run equals the simulators' counter growth, and no answered request is
missing from the ledger except, at most, those the killed process had not yet flushed (its
flush window before the kill)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from tests.support.gateway import ADMIN_KEY, KEY_A, KEY_B, raw_config
from tests.support.postgres import fresh_database, postgres_server
from tests.support.procs import free_port, running, wattgate_cmd

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow, pytest.mark.postgres]
FLUSH_S = 0.3


@contextlib.contextmanager
def fleet(tmp: Path) -> Iterator[list[str]]:
    ports = [free_port(), free_port()]
    spec = {"engines": [
        {"name": "e-bf16", "port": ports[0], "gpu": "h100", "model": "llama-3.1-8b",
         "precision": "bf16", "dialect": "vllm"},
        {"name": "e-fp8", "port": ports[1], "gpu": "h100", "model": "llama-3.1-8b",
         "precision": "fp8", "dialect": "vllm"}]}
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec))
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    with running(wattgate_cmd("sim", "fleet", str(path)), urls[1] + "/health", timeout_s=60,
                 log=tmp / "fleet.log"):
        yield urls


async def counters(s: aiohttp.ClientSession, urls: list[str]) -> tuple[float, float]:
    """(mean wall time of the readings, total joules over all engines)."""
    stamps, total = [], 0.0
    for url in urls:
        async with s.get(url + "/sim/energy") as r:
            body = await r.json()
        stamps.append(body["timestamp_s"])
        total += sum(g["energy_j"] for g in body["gpus"])
    return sum(stamps) / len(stamps), total


async def until_second(t: float) -> float:
    """Sleep until just past the next whole wall-clock second; return that second."""
    target = math.floor(t) + 1.0
    await asyncio.sleep(max(0.0, target - time.time()) + 0.01)
    return target


async def drive(s: aiohttp.ClientSession, gw: str, stop_at: float, log: list[dict[str, Any]]
                ) -> None:
    n = 0
    while time.time() < stop_at:
        n += 1
        key = KEY_A if n % 2 else KEY_B
        body = {"model": "m", "prompt": "w " * (20 + 40 * (n % 3)), "max_tokens": 16 + n % 24,
                "stream": n % 3 != 0}
        try:
            async with s.post(gw + "/v1/completions", data=orjson.dumps(body),
                              headers={"Authorization": f"Bearer {key}",
                                       "Content-Type": "application/json"}) as r:
                data = await r.read()
                ok = r.status == 200 and (not body["stream"] or data.endswith(b"[DONE]\n\n"))
                log.append({"id": r.headers.get("x-wattgate-request-id"), "ok": ok,
                            "end": time.time(), "status": r.status, "tail": data[-80:]})
        except aiohttp.ClientError as exc:
            log.append({"id": None, "ok": False, "end": time.time(), "status": repr(exc)})


async def test_three_gateways_one_ledger_one_killed(tmp_path: Path) -> None:
    import asyncpg

    with postgres_server() as server, fleet(tmp_path) as urls:
        dsn = await fresh_database(server, "multiproc")
        port = free_port()
        raw = raw_config([{"name": "e-bf16", "url": urls[0], "precision": "bf16",
                           "model": "llama-3.1-8b"},
                          {"name": "e-fp8", "url": urls[1], "precision": "fp8",
                           "model": "llama-3.1-8b"}],
                         routing={"policy": "least_load"}, listen={"host": "127.0.0.1",
                                                                   "port": port})
        raw["accounting"] = {"interval_s": 1, "flush_s": FLUSH_S, "settle_s": 1.5,
                             "ledger": {"kind": "postgres", "dsn": dsn},
                             "meters": {"e-bf16": {"kind": "sim", "url": urls[0]},
                                        "e-fp8": {"kind": "sim", "url": urls[1]}}}
        cfg = tmp_path / "gw.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        gw = f"http://127.0.0.1:{port}"
        with contextlib.ExitStack() as stack:
            procs = [stack.enter_context(running(
                wattgate_cmd("serve", "--config", str(cfg), "--reuse-port"), gw + "/readyz",
                timeout_s=60, log=tmp_path / f"gw{i}.log")) for i in range(3)]
            # a new connection per request: SO_REUSEPORT spreads connections, not requests,
            # so kept-alive connections could all land on two of the three processes
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector) as s:
                await asyncio.sleep(2.0)  # every replica has read its meters
                since = await until_second(time.time())
                _, e_since = await counters(s, urls)
                log: list[dict[str, Any]] = []
                stop_at = time.time() + 8.0
                drivers = [asyncio.create_task(drive(s, gw, stop_at, log)) for _ in range(6)]
                await asyncio.sleep(3.0)
                victim = procs[0]
                victim.kill()
                killed_at = time.time()
                await asyncio.gather(*drivers)
                until = await until_second(time.time() + 0.5)
                _, e_until = await counters(s, urls)
                await asyncio.sleep(5.0)  # settle + apportion + flush
                async with s.get(f"{gw}/admin/v1/usage?since={since}&until={until}",
                                 headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as r:
                    usage = await r.json()
            conn = await asyncpg.connect(dsn)
            try:
                in_ledger = {row[0] for row in await conn.fetch("SELECT request_id FROM requests")}
                per_interval = await conn.fetch(
                    """SELECT i.engine, i.interval_idx, i.energy_j, i.idle_j,
                              COALESCE(SUM(s.energy_j), 0) AS shares, COUNT(s.request_id)
                       FROM intervals i LEFT JOIN shares s
                         ON s.engine = i.engine AND s.interval_idx = i.interval_idx
                       GROUP BY i.engine, i.interval_idx, i.energy_j, i.idle_j""")
                replicas = {row[0] for row in await conn.fetch(
                    "SELECT DISTINCT replica FROM requests")}
            finally:
                await conn.close()

    answered = [e for e in log if e["ok"]]
    assert len(answered) >= 40, f"too little traffic: {len(answered)} {log[:3]}"
    after_kill = [e for e in answered if e["end"] > killed_at]
    assert len(after_kill) >= 10  # the two survivors kept serving on the same port
    assert len(replicas) == 3  # all three wrote to the one ledger
    missing = [e for e in answered if e["id"] not in in_ledger]
    for e in missing:  # only the killed process's unflushed tail may be lost
        assert killed_at - 2 * FLUSH_S - 0.5 <= e["end"] <= killed_at, e
    # each interval apportioned once (primary key) and conserved exactly
    for row in per_interval:
        assert row["shares"] + row["idle_j"] == pytest.approx(row["energy_j"], rel=1e-9, abs=1e-9)
    # the bill over [since, until): tenants + idle == the meters' growth over that window
    total = usage["total"]["energy_j"]
    measured = e_until - e_since
    print(f"answered {len(answered)} after-kill {len(after_kill)} missing {len(missing)} "
          f"ledger {total:.1f} J vs counters {measured:.1f} J")
    assert total == pytest.approx(measured, rel=0.03), (total, measured)
    tenants = {row["tenant"] for row in usage["rows"] if row["account"] == "requests"}
    assert tenants == {"tenant-a", "tenant-b"}
